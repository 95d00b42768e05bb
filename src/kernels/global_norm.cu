// Sum of squares, CUDA, deterministic (same bits on every run for the same n and data):
//   pass 1  a fixed grid (depends on n only, at most kMaxBlocks blocks), grid-stride; each block
//           sums x^2 in fp32 and writes partial[block] (scratch)
//   pass 2  one block adds the partials in a fixed order and does *out += total
// No atomics, so the order of additions never depends on scheduling.
#include "kernels/cuda_common.cuh"
#include "kernels/global_norm.h"

namespace zt::cuda {
namespace {

constexpr int kMaxBlocks = 1024;
constexpr int kThreads = 512;
constexpr int kFinishThreads = 1024;  // >= kMaxBlocks: each thread holds at most one partial

template <class T>
__global__ void sum_squares_partial_kernel(float* __restrict__ partial, const T* __restrict__ x, size_t n,
                                           bool aligned) {
  const size_t tid = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const size_t stride = size_t(gridDim.x) * blockDim.x;
  float s = 0.0f;
  size_t scalar_from = 0;
  if (aligned) {  // whole 16-byte packets, then the tail element by element
    constexpr int P = Packed128<T>::size;
    const size_t npackets = n / P;
    for (size_t p = tid; p < npackets; p += stride) {
      const Packed128<T> pk = load128cs(x + p * P);
#pragma unroll
      for (int j = 0; j < P; j++) {
        const float f = to_float(pk[j]);
        s += f * f;
      }
    }
    scalar_from = npackets * P;
  }
  for (size_t i = scalar_from + tid; i < n; i += stride) {
    const float f = to_float(x[i]);
    s += f * f;
  }
  s = block_sum(s);
  if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

__global__ void sum_squares_finish_kernel(float* __restrict__ out, const float* __restrict__ partial, int nblocks) {
  float s = 0.0f;
  for (int i = threadIdx.x; i < nblocks; i += blockDim.x) s += partial[i];
  s = block_sum(s);
  if (threadIdx.x == 0) *out += s;
}

}  // namespace

size_t global_norm_scratch_bytes() { return (kMaxBlocks * sizeof(float) + 255) / 256 * 256; }

template <class T>
void sum_squares_accumulate(float* out_device, const T* x, size_t n, void* scratch, cudaStream_t stream) {
  if (n == 0) return;  // += 0
  ZT_REQUIRE(scratch != nullptr, "sum_squares_accumulate: scratch is null (global_norm_scratch_bytes() = "
                                     << global_norm_scratch_bytes() << " bytes)");
  ZT_REQUIRE(reinterpret_cast<uintptr_t>(scratch) % alignof(float) == 0,
             "sum_squares_accumulate: scratch must be at least 4-byte aligned");
  float* partial = static_cast<float*>(scratch);
  // Grid depends on n only: enough blocks for ~8 elements per thread, capped.
  const size_t per_block = size_t(kThreads) * 8;
  size_t blocks = (n + per_block - 1) / per_block;
  if (blocks > size_t(kMaxBlocks)) blocks = kMaxBlocks;
  const bool aligned = reinterpret_cast<uintptr_t>(x) % 16 == 0;
  sum_squares_partial_kernel<T><<<int(blocks), kThreads, 0, stream>>>(partial, x, n, aligned);
  ZT_CHECK_LAUNCH();
  sum_squares_finish_kernel<<<1, kFinishThreads, 0, stream>>>(out_device, partial, int(blocks));
  ZT_CHECK_LAUNCH();
}

template void sum_squares_accumulate<float>(float*, const float*, size_t, void*, cudaStream_t);
template void sum_squares_accumulate<__nv_bfloat16>(float*, const __nv_bfloat16*, size_t, void*, cudaStream_t);

}  // namespace zt::cuda
