// Linear layer, CPU reference: OpenBLAS does the matrix products (row-major cblas).
//   forward   out    = inp @ W^T + bias          inp (N,C), W (OC,C), out (N,OC)
//   backward  dinp  += dout @ W                  (N,OC) @ (OC,C)     (or = : Dinp::overwrite)
//             dW    += dout^T @ inp              (OC,N) @ (N,C)
//             dbias += column sums of dout
// Accumulation is free: gemm computes C = alpha A B + beta C and we pass beta = 1 (0 to overwrite).
#include "kernels/matmul.h"

#include <cblas.h>

#include <algorithm>
#include <cstddef>

#include "runtime/error.h"

namespace zt::cpu {
namespace {

void gemm(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int M, int N, int K, const float* A, int lda, const float* B, int ldb,
          float beta, float* C, int ldc) {
  cblas_sgemm(CblasRowMajor, ta, tb, M, N, K, 1.0f, A, lda, B, ldb, beta, C, ldc);
}
void gemm(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int M, int N, int K, const double* A, int lda, const double* B,
          int ldb, double beta, double* C, int ldc) {
  cblas_dgemm(CblasRowMajor, ta, tb, M, N, K, 1.0, A, lda, B, ldb, beta, C, ldc);
}

}  // namespace

template <class T>
void matmul_forward(T* out, const T* inp, const T* weight, const T* bias, int N, int C, int OC, int ld) {
  if (ld < 0) ld = OC;
  ZT_ASSERT(ld >= OC && (!bias || ld == OC));
  T beta = 0;
  if (bias) {  // start every row of out at the bias, then accumulate the product onto it
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) std::copy(bias, bias + OC, out + (size_t)n * OC);
    beta = 1;
  }
  gemm(CblasNoTrans, CblasTrans, N, OC, C, inp, C, weight, C, beta, out, ld);
}

template <class T>
void matmul_backward(T* dinp, T* dweight, T* dbias, const T* dout, const T* inp, const T* weight, int N, int C,
                     int OC, int ld, Dinp dinp_write) {
  if (ld < 0) ld = OC;
  ZT_ASSERT(ld >= OC && (!dbias || ld == OC));
  const T dinp_beta = dinp_write == Dinp::overwrite ? T(0) : T(1);
  if (dinp) gemm(CblasNoTrans, CblasNoTrans, N, C, OC, dout, ld, weight, C, dinp_beta, dinp, C);
  if (dweight) gemm(CblasTrans, CblasNoTrans, OC, C, N, dout, ld, inp, C, T(1), dweight, C);
  if (dbias) {
    // Column sums: threads own blocks of output channels and add rows in order (double
    // accumulators; same bits for any thread count).
    constexpr int OB = 64;
    const int nblocks = (OC + OB - 1) / OB;
#pragma omp parallel for schedule(static)
    for (int blk = 0; blk < nblocks; blk++) {
      const int o0 = blk * OB, w = std::min(OC, o0 + OB) - o0;
      double acc[OB] = {};
      for (int n = 0; n < N; n++) {
        const T* __restrict g = dout + (size_t)n * OC + o0;
#pragma omp simd
        for (int o = 0; o < w; o++) acc[o] += double(g[o]);
      }
      for (int o = 0; o < w; o++) dbias[o0 + o] += T(acc[o]);
    }
  }
}

template void matmul_forward<float>(float*, const float*, const float*, const float*, int, int, int, int);
template void matmul_forward<double>(double*, const double*, const double*, const double*, int, int, int, int);
template void matmul_backward<float>(float*, float*, float*, const float*, const float*, const float*, int, int, int,
                                     int, Dinp);
template void matmul_backward<double>(double*, double*, double*, const double*, const double*, const double*, int, int,
                                      int, int, Dinp);

}  // namespace zt::cpu
