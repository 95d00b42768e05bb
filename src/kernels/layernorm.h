// Layer normalisation over the last dimension (eps = 1e-5, as GPT-2 / PyTorch).
#pragma once
namespace zt::cpu {
// out (N,C), mean (N), rstd (N) from inp (N,C), weight (C), bias (C).
template <class T> void layernorm_forward(T* out, T* mean, T* rstd, const T* inp, const T* weight, const T* bias, int N, int C);
// Accumulates (+=) into dinp (N,C), dweight (C), dbias (C).
template <class T> void layernorm_backward(T* dinp, T* dweight, T* dbias, const T* dout, const T* inp, const T* weight,
                                           const T* mean, const T* rstd, int N, int C);
}  // namespace zt::cpu

#if ZT_HAVE_CUDA
#include "runtime/cuda_check.h"
namespace zt::cuda {
// Statistics (mean, rstd) are fp32 whatever T is. One warp per row, 128-bit loads.
template <class T> void layernorm_forward(T* out, float* mean, float* rstd, const T* inp, const T* weight, const T* bias,
                                          int N, int C, cudaStream_t stream);
// Fused residual add + layernorm: residual = a + b, then out = layernorm(residual). One read of
// a and b, one write of residual and out (the unfused pair reads residual twice).
template <class T> void residual_layernorm_forward(T* residual, T* out, float* mean, float* rstd, const T* a, const T* b,
                                                   const T* weight, const T* bias, int N, int C, cudaStream_t stream);
// Accumulates (+=) into dinp (N,C), dweight (C), dbias (C). Deterministic: per-block partial sums of
// dweight/dbias go to `scratch` (layernorm_backward_scratch_bytes) and are summed in a fixed order.
size_t layernorm_backward_scratch_bytes(int N, int C);
template <class T> void layernorm_backward(T* dinp, T* dweight, T* dbias, const T* dout, const T* inp, const T* weight,
                                           const float* mean, const float* rstd, int N, int C, void* scratch,
                                           cudaStream_t stream);
}  // namespace zt::cuda
#endif
