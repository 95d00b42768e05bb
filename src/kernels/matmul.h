// Linear layer: out (N,OC) = inp (N,C) @ weight^T + bias, weight stored (OC,C) as in PyTorch.
// CPU: OpenBLAS sgemm / dgemm.
#pragma once
namespace zt::cpu {
// bias may be nullptr. Overwrites out.
template <class T> void matmul_forward(T* out, const T* inp, const T* weight, const T* bias, int N, int C, int OC);
// Accumulates (+=) into dinp (N,C), dweight (OC,C), dbias (OC). dinp or dbias may be nullptr (skipped).
template <class T> void matmul_backward(T* dinp, T* dweight, T* dbias, const T* dout, const T* inp, const T* weight, int N,
                                        int C, int OC);
}  // namespace zt::cpu
