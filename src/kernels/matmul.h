// Linear layer: out (N,OC) = inp (N,C) @ weight^T + bias, weight stored (OC,C) as in PyTorch.
// CPU: OpenBLAS sgemm / dgemm.
#pragma once
namespace zt::cpu {
// bias may be nullptr. Overwrites out. ld: the row stride of out (and of dout below), OC when < 0;
// a larger one writes OC columns of a wider matrix (the LM head's chunks, model/gpt.cpp), bias-free.
template <class T> void matmul_forward(T* out, const T* inp, const T* weight, const T* bias, int N, int C, int OC,
                                       int ld = -1);
// Accumulates (+=) into dinp (N,C), dweight (OC,C), dbias (OC). Any of the three may be nullptr
// (skipped; weight is read only for dinp).
template <class T> void matmul_backward(T* dinp, T* dweight, T* dbias, const T* dout, const T* inp, const T* weight, int N,
                                        int C, int OC, int ld = -1);
}  // namespace zt::cpu

#if ZT_HAVE_CUDA
#include "runtime/cuda_blas.h"
namespace zt::cuda {
// cuBLASLt. Handle, workspace and stream (Blas, runtime/cuda_blas.h) come from the caller.
// out (N,OC) = inp (N,C) @ weight^T (+ bias). With pre_gelu != nullptr the GELU is fused into the
// epilogue: pre_gelu = inp @ weight^T + bias, out = gelu(pre_gelu). Overwrites out (and pre_gelu).
// T = float runs in strict fp32 (no TF32), the parity mode; T = bf16 accumulates in fp32.
// ld as in the CPU version (not with pre_gelu).
template <class T> void matmul_forward(T* out, T* pre_gelu, const T* inp, const T* weight, const T* bias, int N, int C,
                                       int OC, const Blas& blas, int ld = -1);
// Accumulates (+=) into dinp (N,C), dweight (OC,C), dbias (OC); each may be nullptr; ld as above.
// dbias is reduced by a deterministic kernel (per-block partials in `scratch`,
// matmul_backward_scratch_bytes) since cuBLASLt's BGRAD epilogue overwrites instead of adding.
size_t matmul_backward_scratch_bytes(int N, int OC);
template <class T> void matmul_backward(T* dinp, T* dweight, T* dbias, const T* dout, const T* inp, const T* weight, int N,
                                        int C, int OC, void* scratch, const Blas& blas, int ld = -1);
}  // namespace zt::cuda
#endif
