// Fused softmax + cross-entropy (+ gradient), CUDA version (see softmax_xent.cpp for the reference).
//
// One block per row of logits. The probabilities are never stored:
//   pass 1  each thread keeps an online (max m, sum of exp(x - m)) over its 128-bit packets; the
//           block then combines them: M = max of m, S = sum of s * exp(m - M).
//           loss = M + log S - x[target]
//   pass 2  (write_dlogits) re-reads the row (from L2: pass 1 left it there) and overwrites it with
//           dloss * (exp(x - M) / S - [j == target]); padding columns V..Vp-1 get 0.
// The row is read from memory once and written once, which is all this memory-bound op can hope for.
#include <cmath>

#include "kernels/cuda_common.cuh"
#include "kernels/softmax_xent.h"

namespace zt::cuda {
namespace {

constexpr int kBlock = 512;

// logits (N, Vp): overwritten by dlogits when write_dlogits. losses (N). One block per row.
template <class T>
__global__ void softmax_xent_kernel(T* logits, float* __restrict__ losses, const int* __restrict__ targets, float dloss,
                                    int V, int Vp, bool write_dlogits) {
  constexpr int P = Packed128<T>::size;
  const int row = blockIdx.x;
  T* x = logits + size_t(row) * Vp;
  const int target = targets[row];
  // Read before pass 2 can overwrite it: the barriers inside block_max order this read before any
  // thread's writes.
  const float x_target = threadIdx.x == 0 ? to_float(x[target]) : 0.0f;

  // Pass 1. The last packet may straddle V: columns >= V are padding and stay out of the softmax.
  const int packets = (V + P - 1) / P;
  float m = -INFINITY, s = 0.0f;
  for (int p = threadIdx.x; p < packets; p += blockDim.x) {
    const Packed128<T> v = load128(x + p * P);
    float pmax = -INFINITY;
#pragma unroll
    for (int k = 0; k < P; k++)
      if (p * P + k < V) pmax = fmaxf(pmax, to_float(v[k]));
    // Rescale once per packet, not per element. With m = -inf (first packet) s is 0 and
    // exp(-inf) = 0, so s stays 0.
    if (pmax > m) {
      s *= expf(m - pmax);
      m = pmax;
    }
#pragma unroll
    for (int k = 0; k < P; k++)
      if (p * P + k < V) s += expf(to_float(v[k]) - m);
  }
  const float M = block_max(m);
  // A thread that saw no column has m = -inf, s = 0: its term is 0 * 0.
  const float S = block_sum(s * expf(m - M));
  if (threadIdx.x == 0) losses[row] = M + logf(S) - x_target;
  if (!write_dlogits) return;

  // Pass 2, over all Vp columns. Last use of the logits: streaming load.
  const float scale = dloss / S;
  for (int p = threadIdx.x; p < Vp / P; p += blockDim.x) {
    const Packed128<T> v = load128cs(x + p * P);
    Packed128<T> g;
#pragma unroll
    for (int k = 0; k < P; k++) {
      const int col = p * P + k;
      float d = 0.0f;
      if (col < V) {
        d = expf(to_float(v[k]) - M) * scale;
        if (col == target) d -= dloss;
      }
      g[k] = from_float<T>(d);
    }
    store128(x + p * P, g);
  }
}

// Column chunks (softmax_xent.h), one block per row, plain loads (a chunk starts at any column).
template <class T>
__global__ void xent_chunk_partial_kernel(const T* logits, int ld, int col0, int cols, int V,
                                          const int* __restrict__ targets, float* run_max, float* run_sum,
                                          float* x_target, bool first) {
  const int row = blockIdx.x;
  const T* x = logits + size_t(row) * ld;
  const int n = max(0, min(cols, V - col0));
  const int t = targets[row] - col0;
  float m = -INFINITY, s = 0.0f;
  for (int j = threadIdx.x; j < n; j += blockDim.x) {
    const float v = to_float(x[j]);
    if (v > m) {
      s *= expf(m - v);
      m = v;
    }
    s += expf(v - m);
  }
  const float mc = block_max(m);
  const float sc = block_sum(s * expf(m - mc));  // a thread that saw nothing: 0 * 0
  if (threadIdx.x != 0) return;
  if (t >= 0 && t < cols) x_target[row] = to_float(x[t]);
  if (n == 0) {
    if (first) { run_max[row] = -INFINITY; run_sum[row] = 0.0f; }
    return;
  }
  const float m0 = first ? -INFINITY : run_max[row], s0 = first ? 0.0f : run_sum[row];
  const float M = fmaxf(m0, mc);
  run_sum[row] = s0 * expf(m0 - M) + sc * expf(mc - M);
  run_max[row] = M;
}

__global__ void xent_chunk_finish_kernel(float* losses, float* run_max, const float* run_sum, const float* x_target,
                                         int N) {
  const int r = blockIdx.x * blockDim.x + threadIdx.x;
  if (r >= N) return;
  const float lse = run_max[r] + logf(run_sum[r]);
  run_max[r] = lse;
  losses[r] = lse - x_target[r];
}

template <class T>
__global__ void xent_chunk_grad_kernel(T* logits, int ld, int col0, int cols, int V, const int* __restrict__ targets,
                                       const float* __restrict__ lse, float dloss) {
  const int row = blockIdx.x;
  T* x = logits + size_t(row) * ld;
  const float l = lse[row];
  const int t = targets[row];
  for (int j = threadIdx.x; j < cols; j += blockDim.x) {
    const int col = col0 + j;
    float d = 0.0f;
    if (col < V) {
      d = expf(to_float(x[j]) - l) * dloss;
      if (col == t) d -= dloss;
    }
    x[j] = from_float<T>(d);
  }
}

}  // namespace

template <class T>
void xent_chunk_partial(const T* logits, int ld, int N, int col0, int cols, int V, const int* targets, float* run_max,
                        float* run_sum, float* x_target, bool first, cudaStream_t stream) {
  if (N == 0) return;
  xent_chunk_partial_kernel<T><<<N, 256, 0, stream>>>(logits, ld, col0, cols, V, targets, run_max, run_sum, x_target,
                                                      first);
  ZT_CHECK_LAUNCH();
}

void xent_chunk_finish(float* losses, float* run_max, const float* run_sum, const float* x_target, int N,
                       cudaStream_t stream) {
  if (N == 0) return;
  xent_chunk_finish_kernel<<<(N + 255) / 256, 256, 0, stream>>>(losses, run_max, run_sum, x_target, N);
  ZT_CHECK_LAUNCH();
}

template <class T>
void xent_chunk_grad(T* logits, int ld, int N, int col0, int cols, int V, const int* targets, const float* lse,
                     float dloss, cudaStream_t stream) {
  if (N == 0) return;
  xent_chunk_grad_kernel<T><<<N, 256, 0, stream>>>(logits, ld, col0, cols, V, targets, lse, dloss);
  ZT_CHECK_LAUNCH();
}

#define ZT_XENT_CHUNK(T)                                                                                        \
  template void xent_chunk_partial<T>(const T*, int, int, int, int, int, const int*, float*, float*, float*, bool, \
                                      cudaStream_t);                                                              \
  template void xent_chunk_grad<T>(T*, int, int, int, int, int, const int*, const float*, float, cudaStream_t);
ZT_XENT_CHUNK(float)
ZT_XENT_CHUNK(__nv_bfloat16)
#undef ZT_XENT_CHUNK

template <class T>
void softmax_xent_forward_backward(T* logits, float* losses, const int* targets, float dloss, int N, int V, int Vp,
                                   bool write_dlogits, cudaStream_t stream) {
  constexpr int P = Packed128<T>::size;
  ZT_REQUIRE(V > 0 && V <= Vp, "softmax_xent: need 0 < V <= Vp, got V = " << V << ", Vp = " << Vp);
  ZT_REQUIRE(Vp % P == 0, "softmax_xent: Vp (" << Vp << ") must be a multiple of " << P);
  if (N == 0) return;
  softmax_xent_kernel<T><<<N, kBlock, 0, stream>>>(logits, losses, targets, dloss, V, Vp, write_dlogits);
  ZT_CHECK_LAUNCH();
}

template void softmax_xent_forward_backward<float>(float*, float*, const int*, float, int, int, int, bool, cudaStream_t);
template void softmax_xent_forward_backward<__nv_bfloat16>(__nv_bfloat16*, float*, const int*, float, int, int, int,
                                                           bool, cudaStream_t);

}  // namespace zt::cuda
