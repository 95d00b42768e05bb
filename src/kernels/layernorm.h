// Layer normalisation over the last dimension (eps = 1e-5, as GPT-2 / PyTorch).
#pragma once
namespace zt::cpu {
// out (N,C), mean (N), rstd (N) from inp (N,C), weight (C), bias (C).
template <class T> void layernorm_forward(T* out, T* mean, T* rstd, const T* inp, const T* weight, const T* bias, int N, int C);
// Accumulates (+=) into dinp (N,C), dweight (C), dbias (C).
template <class T> void layernorm_backward(T* dinp, T* dweight, T* dbias, const T* dout, const T* inp, const T* weight,
                                           const T* mean, const T* rstd, int N, int C);
}  // namespace zt::cpu
