// GELU, tanh approximation (GPT-2): 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
#pragma once
#include <cstddef>
namespace zt::cpu {
template <class T> void gelu_forward(T* out, const T* inp, size_t n);
// dinp = gelu'(inp) * dout, overwriting dinp; dinp may be dout (in place).
template <class T> void gelu_backward(T* dinp, const T* inp, const T* dout, size_t n);
}  // namespace zt::cpu

#if ZT_HAVE_CUDA
#include "runtime/cuda_check.h"
namespace zt::cuda {
template <class T> void gelu_forward(T* out, const T* inp, size_t n, cudaStream_t stream);
// dinp = gelu'(inp) * dout, overwriting dinp; dinp may be dout (in place).
template <class T> void gelu_backward(T* dinp, const T* inp, const T* dout, size_t n, cudaStream_t stream);
}  // namespace zt::cuda
#endif
