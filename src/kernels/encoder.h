// Token + position embedding.
// CPU reference in encoder.cpp (T = float or double); a CUDA version will sit in encoder.cu.
#pragma once
namespace zt::cpu {
// out (B,T,C) = wte[tokens[b,t]] (V,C) + wpe[t] (maxT,C)
template <class T> void encoder_forward(T* out, const int* tokens, const T* wte, const T* wpe, int B, int Tn, int C);
// Accumulates (+=) into dwte and dwpe.
template <class T> void encoder_backward(T* dwte, T* dwpe, const T* dout, const int* tokens, int B, int Tn, int C);
}  // namespace zt::cpu

#if ZT_HAVE_CUDA
#include "runtime/cuda_check.h"
namespace zt::cuda {
// out (B,T,C) = wte[tokens] + wpe[t]. 128-bit loads along C (C % 8 == 0).
template <class T> void encoder_forward(T* out, const int* tokens, const T* wte, const T* wpe, int B, int Tn, int C,
                                        cudaStream_t stream);
// Accumulates (+=) into dwte (V,C) and dwpe (maxT,C), deterministically: no floating-point atomics.
// dwpe: one thread per (t, c) sums over b. dwte: rows are accumulated per distinct token in a fixed
// order (tokens sorted on the device, with `scratch` as working memory; encoder_backward_scratch_bytes).
size_t encoder_backward_scratch_bytes(int B, int Tn);
template <class T> void encoder_backward(T* dwte, T* dwpe, const T* dout, const int* tokens, int B, int Tn, int C,
                                         void* scratch, cudaStream_t stream);
}  // namespace zt::cuda
#endif
