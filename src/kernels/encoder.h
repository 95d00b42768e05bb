// Token + position embedding.
// CPU reference in encoder.cpp (T = float or double); a CUDA version will sit in encoder.cu.
#pragma once
namespace zt::cpu {
// out (B,T,C) = wte[tokens[b,t]] (V,C) + wpe[t] (maxT,C)
template <class T> void encoder_forward(T* out, const int* tokens, const T* wte, const T* wpe, int B, int Tn, int C);
// Accumulates (+=) into dwte and dwpe.
template <class T> void encoder_backward(T* dwte, T* dwpe, const T* dout, const int* tokens, int B, int Tn, int C);
}  // namespace zt::cpu
