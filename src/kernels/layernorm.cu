// Layer normalisation, CUDA version (see layernorm.cpp for the reference and the formulas).
//
// Forward: one warp per row. Each lane walks the row in 128-bit packets (lane 0 takes channels
// 0..P-1, lane 1 the next P, ...), so a warp reads 512 contiguous bytes per step. The row is read
// three times (sum, squared deviations, normalise): the later reads hit L1/L2, and in exchange the
// variance is computed in two passes exactly as the CPU reference does (never E[x^2] - E[x]^2).
// Mean and rstd are fp32 whatever T is.
//
// Backward: dinp is row-local (one warp per row again). dweight and dbias are sums over all rows,
// which must be deterministic, so there are no atomics:
//   kernel 1: block b owns a fixed range of rows; it updates dinp for them, then each thread sums
//             dout * xhat and dout over those rows, in row order, for its channel packets and
//             writes the block's fp32 partials (2 * C floats) to scratch;
//   kernel 2: one thread per channel adds the partials of all blocks, in block order, into
//             dweight / dbias.
// The number of blocks depends only on N (layernorm_backward_scratch_bytes), never on the device.
#include <algorithm>

#include "kernels/cuda_common.cuh"
#include "kernels/layernorm.h"

namespace zt::cuda {
namespace {

constexpr float kEps = 1e-5f;
constexpr int kBlock = 256;  // 8 warps: 8 rows per block in the forward kernels
constexpr int kBackwardRowsPerBlock = 16;
constexpr int kBackwardMaxBlocks = 1024;

// Writes out[c] = (x[c] - mean) * rstd * weight[c] + bias[c] for one row, given the warp-reduced
// sum of x; stores mean and rstd (when the pointers are not null) from lane 0.
template <class T>
__device__ __forceinline__ void normalize_row(T* __restrict__ out, float* mean, float* rstd, const T* x,
                                              const T* __restrict__ weight, const T* __restrict__ bias, float sum,
                                              int row, int C, int lane) {
  constexpr int P = Packed128<T>::size;
  const float m = sum / C;
  float ss = 0.0f;
  for (int c = lane * P; c < C; c += kWarp * P) {
    const Packed128<T> xp = load128(x + c);
#pragma unroll
    for (int k = 0; k < P; k++) {
      const float d = to_float(xp[k]) - m;
      ss += d * d;
    }
  }
  const float s = 1.0f / sqrtf(warp_sum(ss) / C + kEps);  // not rsqrtf: stay close to the reference
  for (int c = lane * P; c < C; c += kWarp * P) {
    const Packed128<T> xp = load128(x + c), w = load128(weight + c), b = load128(bias + c);
    Packed128<T> o;
#pragma unroll
    for (int k = 0; k < P; k++) o[k] = from_float<T>((to_float(xp[k]) - m) * s * to_float(w[k]) + to_float(b[k]));
    store128(out + c, o);
  }
  if (lane == 0) {
    if (mean) mean[row] = m;
    if (rstd) rstd[row] = s;
  }
}

// out (N,C), mean (N), rstd (N) from inp (N,C): one warp per row.
template <class T>
__global__ void layernorm_forward_kernel(T* __restrict__ out, float* __restrict__ mean, float* __restrict__ rstd,
                                         const T* __restrict__ inp, const T* __restrict__ weight,
                                         const T* __restrict__ bias, int N, int C) {
  constexpr int P = Packed128<T>::size;
  const int lane = threadIdx.x % kWarp;
  const int row = blockIdx.x * (blockDim.x / kWarp) + threadIdx.x / kWarp;
  if (row >= N) return;  // whole warps leave together, so warp_sum below keeps all 32 lanes
  const T* x = inp + size_t(row) * C;
  float sum = 0.0f;
  for (int c = lane * P; c < C; c += kWarp * P) {
    const Packed128<T> xp = load128(x + c);
#pragma unroll
    for (int k = 0; k < P; k++) sum += to_float(xp[k]);
  }
  normalize_row(out + size_t(row) * C, mean, rstd, x, weight, bias, warp_sum(sum), row, C, lane);
}

// residual (N,C) = a + b, then out (N,C), mean (N), rstd (N) = layernorm(residual): one warp per row.
// The statistics use the residual as stored (rounded to T), which is what the next layer reads.
// Each lane reads back only the packets it wrote itself, so no synchronisation is needed; residual
// may be the same buffer as a or b (hence no __restrict__ on them).
template <class T>
__global__ void residual_layernorm_forward_kernel(T* residual, T* __restrict__ out, float* __restrict__ mean,
                                                  float* __restrict__ rstd, const T* a, const T* b,
                                                  const T* __restrict__ weight, const T* __restrict__ bias, int N,
                                                  int C) {
  constexpr int P = Packed128<T>::size;
  const int lane = threadIdx.x % kWarp;
  const int row = blockIdx.x * (blockDim.x / kWarp) + threadIdx.x / kWarp;
  if (row >= N) return;
  const size_t off = size_t(row) * C;
  T* r = residual + off;
  float sum = 0.0f;
  for (int c = lane * P; c < C; c += kWarp * P) {
    const Packed128<T> ap = load128(a + off + c), bp = load128(b + off + c);
    Packed128<T> rp;
#pragma unroll
    for (int k = 0; k < P; k++) {
      rp[k] = from_float<T>(to_float(ap[k]) + to_float(bp[k]));
      sum += to_float(rp[k]);
    }
    store128(r + c, rp);
  }
  normalize_row(out + off, mean, rstd, r, weight, bias, warp_sum(sum), row, C, lane);
}

// dinp (N,C) += ..., partials (gridDim.x, 2, C) = this block's sums of dout*xhat and dout.
// Block b owns rows [b * rows_per_block, min(N, (b+1) * rows_per_block)).
template <class T>
__global__ void layernorm_backward_kernel(T* __restrict__ dinp, float* __restrict__ partials,
                                          const T* __restrict__ dout, const T* __restrict__ inp,
                                          const T* __restrict__ weight, const float* __restrict__ mean,
                                          const float* __restrict__ rstd, int N, int C, int rows_per_block) {
  constexpr int P = Packed128<T>::size;
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp, warps = blockDim.x / kWarp;
  const int row0 = blockIdx.x * rows_per_block;
  const int row1 = min(N, row0 + rows_per_block);

  // 1) dinp += rstd * (g - mean_c(g) - xhat * mean_c(g * xhat)),  g = dout * weight. One warp per row.
  for (int row = row0 + warp; row < row1; row += warps) {
    const size_t off = size_t(row) * C;
    const float m = mean[row], s = rstd[row];
    float g_sum = 0.0f, gx_sum = 0.0f;
    for (int c = lane * P; c < C; c += kWarp * P) {
      const Packed128<T> x = load128(inp + off + c), dy = load128(dout + off + c), w = load128(weight + c);
#pragma unroll
      for (int k = 0; k < P; k++) {
        const float g = to_float(dy[k]) * to_float(w[k]);
        g_sum += g;
        gx_sum += g * ((to_float(x[k]) - m) * s);
      }
    }
    const float g_mean = warp_sum(g_sum) / C, gx_mean = warp_sum(gx_sum) / C;
    for (int c = lane * P; c < C; c += kWarp * P) {
      const Packed128<T> x = load128(inp + off + c), dy = load128(dout + off + c), w = load128(weight + c);
      Packed128<T> dx = load128(dinp + off + c);
#pragma unroll
      for (int k = 0; k < P; k++) {
        const float xhat = (to_float(x[k]) - m) * s;
        const float g = to_float(dy[k]) * to_float(w[k]);
        dx[k] = from_float<T>(to_float(dx[k]) + s * (g - g_mean - xhat * gx_mean));
      }
      store128(dinp + off + c, dx);
    }
  }

  // 2) This block's column sums, rows in order. The rows were just read in step 1, so these reads
  //    mostly hit L1/L2. Nothing here reads dinp, so no barrier is needed between the steps.
  float* pw = partials + size_t(blockIdx.x) * 2 * C;
  float* pb = pw + C;
  for (int c = threadIdx.x * P; c < C; c += blockDim.x * P) {
    float acc_w[P], acc_b[P];
#pragma unroll
    for (int k = 0; k < P; k++) acc_w[k] = acc_b[k] = 0.0f;
    for (int row = row0; row < row1; row++) {
      const size_t off = size_t(row) * C;
      const float m = mean[row], s = rstd[row];
      const Packed128<T> x = load128(inp + off + c), dy = load128(dout + off + c);
#pragma unroll
      for (int k = 0; k < P; k++) {
        acc_w[k] += to_float(dy[k]) * ((to_float(x[k]) - m) * s);
        acc_b[k] += to_float(dy[k]);
      }
    }
#pragma unroll
    for (int k = 0; k < P; k++) {
      pw[c + k] = acc_w[k];
      pb[c + k] = acc_b[k];
    }
  }
}

// dweight (C) += sum over blocks of partials[blk][0], dbias (C) += ... [blk][1]: one thread per
// channel, blocks in order.
// Column sums of the per-block partials (nblocks rows of 2C floats) into dweight / dbias. A block
// owns 32 columns (one warp reads 128 contiguous bytes of a partial row) and its 32 warps take every
// 32nd partial row; the 32 warp sums are then added in a fixed order, so the result is
// deterministic. (One thread per column over all partial rows gave GPT-2's C = 768 only 3 blocks of
// serial loads: 6 % of a 124M step's kernel time under ncu on an H200, scripts/device/RESULTS.md.)
constexpr int kReduceCols = kWarp;
constexpr int kReduceThreads = 1024;
constexpr int kReduceGroups = kReduceThreads / kWarp;

template <class T>
__global__ void __launch_bounds__(kReduceThreads)
    layernorm_backward_reduce_kernel(T* __restrict__ dweight, T* __restrict__ dbias,
                                     const float* __restrict__ partials, int nblocks, int C) {
  __shared__ float w_sum[kReduceGroups][kReduceCols], b_sum[kReduceGroups][kReduceCols];
  const int lane = threadIdx.x % kWarp, group = threadIdx.x / kWarp;
  const int c = blockIdx.x * kReduceCols + lane;
  float sw = 0.0f, sb = 0.0f;
  if (c < C) {
    for (int blk = group; blk < nblocks; blk += kReduceGroups) {
      const float* p = partials + size_t(blk) * 2 * C;
      sw += p[c];
      sb += p[C + c];
    }
  }
  w_sum[group][lane] = sw;
  b_sum[group][lane] = sb;
  __syncthreads();
  if (group != 0 || c >= C) return;
  for (int g = 1; g < kReduceGroups; g++) {
    sw += w_sum[g][lane];
    sb += b_sum[g][lane];
  }
  dweight[c] = from_float<T>(to_float(dweight[c]) + sw);
  dbias[c] = from_float<T>(to_float(dbias[c]) + sb);
}

int backward_blocks(int N) { return std::min(ceil_div(size_t(N), kBackwardRowsPerBlock), kBackwardMaxBlocks); }

template <class T>
void check_shape(const char* op, int C) {
  constexpr int P = Packed128<T>::size;
  ZT_REQUIRE(C > 0 && C % P == 0, op << ": C (" << C << ") must be a positive multiple of " << P);
}

}  // namespace

template <class T>
void layernorm_forward(T* out, float* mean, float* rstd, const T* inp, const T* weight, const T* bias, int N, int C,
                       cudaStream_t stream) {
  check_shape<T>("layernorm_forward", C);
  if (N == 0) return;
  const int rows_per_block = kBlock / kWarp;
  layernorm_forward_kernel<T><<<ceil_div(size_t(N), rows_per_block), kBlock, 0, stream>>>(out, mean, rstd, inp,
                                                                                          weight, bias, N, C);
  ZT_CHECK_LAUNCH();
}

template <class T>
void residual_layernorm_forward(T* residual, T* out, float* mean, float* rstd, const T* a, const T* b,
                                const T* weight, const T* bias, int N, int C, cudaStream_t stream) {
  check_shape<T>("residual_layernorm_forward", C);
  if (N == 0) return;
  const int rows_per_block = kBlock / kWarp;
  residual_layernorm_forward_kernel<T><<<ceil_div(size_t(N), rows_per_block), kBlock, 0, stream>>>(
      residual, out, mean, rstd, a, b, weight, bias, N, C);
  ZT_CHECK_LAUNCH();
}

size_t layernorm_backward_scratch_bytes(int N, int C) {
  if (N <= 0 || C <= 0) return 0;
  return size_t(backward_blocks(N)) * 2 * size_t(C) * sizeof(float);
}

template <class T>
void layernorm_backward(T* dinp, T* dweight, T* dbias, const T* dout, const T* inp, const T* weight, const float* mean,
                        const float* rstd, int N, int C, void* scratch, cudaStream_t stream) {
  check_shape<T>("layernorm_backward", C);
  if (N == 0) return;
  ZT_REQUIRE(scratch != nullptr, "layernorm_backward: scratch is null");
  const int nblocks = backward_blocks(N);
  const int rows_per_block = ceil_div(size_t(N), nblocks);
  float* partials = static_cast<float*>(scratch);
  layernorm_backward_kernel<T><<<nblocks, kBlock, 0, stream>>>(dinp, partials, dout, inp, weight, mean, rstd, N, C,
                                                                rows_per_block);
  ZT_CHECK_LAUNCH();
  layernorm_backward_reduce_kernel<T><<<ceil_div(size_t(C), kReduceCols), kReduceThreads, 0, stream>>>(
      dweight, dbias, partials, nblocks, C);
  ZT_CHECK_LAUNCH();
}

template void layernorm_forward<float>(float*, float*, float*, const float*, const float*, const float*, int, int,
                                       cudaStream_t);
template void layernorm_forward<__nv_bfloat16>(__nv_bfloat16*, float*, float*, const __nv_bfloat16*,
                                               const __nv_bfloat16*, const __nv_bfloat16*, int, int, cudaStream_t);
template void residual_layernorm_forward<float>(float*, float*, float*, float*, const float*, const float*,
                                                const float*, const float*, int, int, cudaStream_t);
template void residual_layernorm_forward<__nv_bfloat16>(__nv_bfloat16*, __nv_bfloat16*, float*, float*,
                                                        const __nv_bfloat16*, const __nv_bfloat16*,
                                                        const __nv_bfloat16*, const __nv_bfloat16*, int, int,
                                                        cudaStream_t);
template void layernorm_backward<float>(float*, float*, float*, const float*, const float*, const float*, const float*,
                                        const float*, int, int, void*, cudaStream_t);
template void layernorm_backward<__nv_bfloat16>(__nv_bfloat16*, __nv_bfloat16*, __nv_bfloat16*, const __nv_bfloat16*,
                                                const __nv_bfloat16*, const __nv_bfloat16*, const float*,
                                                const float*, int, int, void*, cudaStream_t);

}  // namespace zt::cuda
