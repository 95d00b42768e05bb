// Token + position embedding.
// CPU reference in encoder.cpp (T = float or double); a CUDA version will sit in encoder.cu.
#pragma once
#include <climits>

namespace zt::cpu {
// Over the vocabulary rows [row0, row0 + rows) only (the model's embedding chunks, layout.h);
// wte points at row row0 (rows, C); tokens outside the range contribute nothing here.
// out (B,T,C) = wpe[t] (maxT,C) + wte[tokens[b,t]], or with wpe == nullptr: out += wte[tokens[b,t]].
// The defaults cover every row.
template <class T> void encoder_forward(T* out, const int* tokens, const T* wte, const T* wpe, int B, int Tn, int C,
                                        int row0 = 0, int rows = INT_MAX);
// Accumulates (+=) into dwte (rows, C) and dwpe (skipped when nullptr).
template <class T> void encoder_backward(T* dwte, T* dwpe, const T* dout, const int* tokens, int B, int Tn, int C,
                                         int row0 = 0, int rows = INT_MAX);
}  // namespace zt::cpu

#if ZT_HAVE_CUDA
#include "runtime/cuda_check.h"
namespace zt::cuda {
// The CPU versions' contract (rows [row0, row0 + rows) only, wpe may be nullptr). 128-bit loads
// along C (C % 8 == 0).
template <class T> void encoder_forward(T* out, const int* tokens, const T* wte, const T* wpe, int B, int Tn, int C,
                                        cudaStream_t stream, int row0 = 0, int rows = INT_MAX);
// Accumulates (+=) into dwte (rows,C) and dwpe (maxT,C; skipped when nullptr), deterministically: no floating-point atomics.
// dwpe: one thread per (t, c) sums over b. dwte: rows are accumulated per distinct token in a fixed
// order (tokens sorted on the device, with `scratch` as working memory; encoder_backward_scratch_bytes).
size_t encoder_backward_scratch_bytes(int B, int Tn);
template <class T> void encoder_backward(T* dwte, T* dwpe, const T* dout, const int* tokens, int B, int Tn, int C,
                                         void* scratch, cudaStream_t stream, int row0 = 0, int rows = INT_MAX);
}  // namespace zt::cuda
#endif
