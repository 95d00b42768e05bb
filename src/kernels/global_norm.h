// Sum of squares of a buffer, in double, so that shard partial sums add up exactly enough across ranks.
#pragma once
#include <cstddef>
namespace zt::cpu {
template <class T> double sum_squares(const T* x, size_t n);
}  // namespace zt::cpu

#if ZT_HAVE_CUDA
#include "runtime/cuda_check.h"
namespace zt::cuda {
// Sum of squares of x, accumulated (+=) into *out_device (a float on the device), deterministically:
// per-block partials in fp32, summed by one block in fixed order. scratch: global_norm_scratch_bytes.
size_t global_norm_scratch_bytes();
template <class T> void sum_squares_accumulate(float* out_device, const T* x, size_t n, void* scratch, cudaStream_t stream);
}  // namespace zt::cuda
#endif
