// Residual add.
#pragma once
#include <cstddef>
namespace zt::cpu {
// out = a + b
template <class T> void residual_forward(T* out, const T* a, const T* b, size_t n);
// Accumulates dout into both da and db.
template <class T> void residual_backward(T* da, T* db, const T* dout, size_t n);
}  // namespace zt::cpu

#if ZT_HAVE_CUDA
#include "runtime/cuda_check.h"
namespace zt::cuda {
template <class T> void residual_forward(T* out, const T* a, const T* b, size_t n, cudaStream_t stream);
}  // namespace zt::cuda
#endif
