// Linear layer: out (N,OC) = inp (N,C) @ weight^T + bias, weight stored (OC,C) as in PyTorch.
// CPU: OpenBLAS sgemm / dgemm.
#pragma once
namespace zt {
// How matmul_backward writes the input gradient dinp. A block's layers overwrite it: no zeroing pass
// before, no read of the old values inside the product (beta = 0). The LM head's vocabulary units
// each add their part of one dlnf, so they accumulate.
enum class Dinp { accumulate, overwrite };
}  // namespace zt

namespace zt::cpu {
// bias may be nullptr. Overwrites out. ld: the row stride of out (and of dout below), OC when < 0;
// a larger one writes OC columns of a wider matrix (the LM head's chunks, model/gpt.cpp), bias-free.
template <class T> void matmul_forward(T* out, const T* inp, const T* weight, const T* bias, int N, int C, int OC,
                                       int ld = -1);
// Accumulates (+=) into dweight (OC,C) and dbias (OC); adds into or overwrites dinp (N,C) as `dinp_write`
// says. Any of the three may be nullptr (skipped; weight is read only for dinp).
template <class T> void matmul_backward(T* dinp, T* dweight, T* dbias, const T* dout, const T* inp, const T* weight, int N,
                                        int C, int OC, int ld = -1, Dinp dinp_write = Dinp::accumulate);
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
// Accumulates (+=) into dweight (OC,C), dbias (OC); dinp (N,C) as `dinp_write` says; each may be
// nullptr; ld as above. dbias is reduced by a deterministic kernel (per-block partials in `scratch`,
// matmul_backward_scratch_bytes) since cuBLASLt's BGRAD epilogue overwrites instead of adding.
//
// With dinp_pre_gelu != nullptr (dinp_write must be overwrite) inp was gelu(dinp_pre_gelu), and dinp
// receives the gradient before that GELU: dinp = gelu'(dinp_pre_gelu) * (dout @ weight). bf16: the
// GELU's backward fused into the product's epilogue (CUBLASLT_EPILOGUE_DGELU, one rounding); fp32
// (its DGELU is not exact), or when cuBLASLt offers no algorithm for it: the product then the GELU's
// backward in place (two roundings).
size_t matmul_backward_scratch_bytes(int N, int OC);
template <class T> void matmul_backward(T* dinp, T* dweight, T* dbias, const T* dout, const T* inp, const T* weight, int N,
                                        int C, int OC, void* scratch, const Blas& blas, int ld = -1,
                                        Dinp dinp_write = Dinp::accumulate, const T* dinp_pre_gelu = nullptr);
}  // namespace zt::cuda
#endif
