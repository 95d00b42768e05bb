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

}  // namespace

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
