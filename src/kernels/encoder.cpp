// Token + position embedding, CPU reference.
#include "kernels/encoder.h"

#include <algorithm>
#include <cstddef>

namespace zt::cpu {

template <class T>
void encoder_forward(T* out, const int* tokens, const T* wte, const T* wpe, int B, int Tn, int C, int row0, int rows) {
  const long BT = (long)B * Tn;
#pragma omp parallel for schedule(static)
  for (long bt = 0; bt < BT; bt++) {
    const int row = tokens[bt] - row0;
    const bool mine = row >= 0 && row < rows;
    T* __restrict o = out + (size_t)bt * C;
    if (wpe) {
      const T* __restrict p = wpe + (size_t)(bt % Tn) * C;
      if (mine) {
        const T* __restrict w = wte + (size_t)row * C;
#pragma omp simd
        for (int c = 0; c < C; c++) o[c] = w[c] + p[c];
      } else {
        std::copy(p, p + C, o);
      }
    } else if (mine) {
      const T* __restrict w = wte + (size_t)row * C;
#pragma omp simd
      for (int c = 0; c < C; c++) o[c] += w[c];
    }
  }
}

// dwpe[t] += sum_b dout[b,t]   and   dwte[tokens[b,t]] += dout[b,t].
//
// The same token can appear at many positions, so splitting positions across threads would race
// on dwte rows. Instead each thread owns a block of channels and walks every position in order:
// every element of dwte / dwpe is summed in the same order whatever the number of threads, so the
// result is bitwise reproducible run to run and across thread counts.
template <class T>
void encoder_backward(T* dwte, T* dwpe, const T* dout, const int* tokens, int B, int Tn, int C, int row0, int rows) {
  constexpr int CB = 64;  // channels per block: 256 B of floats, a few cache lines per row
  const int nblocks = (C + CB - 1) / CB;
  const long BT = (long)B * Tn;
#pragma omp parallel for schedule(static)
  for (int blk = 0; blk < nblocks; blk++) {
    const int c0 = blk * CB, c1 = std::min(C, c0 + CB);
    for (long bt = 0; bt < BT; bt++) {
      const T* __restrict g = dout + (size_t)bt * C;
      const int row = tokens[bt] - row0;
      if (row >= 0 && row < rows) {
        T* __restrict dw = dwte + (size_t)row * C;
#pragma omp simd
        for (int c = c0; c < c1; c++) dw[c] += g[c];
      }
      if (dwpe) {
        T* __restrict dp = dwpe + (size_t)(bt % Tn) * C;
#pragma omp simd
        for (int c = c0; c < c1; c++) dp[c] += g[c];
      }
    }
  }
}

template void encoder_forward<float>(float*, const int*, const float*, const float*, int, int, int, int, int);
template void encoder_forward<double>(double*, const int*, const double*, const double*, int, int, int, int, int);
template void encoder_backward<float>(float*, float*, const float*, const int*, int, int, int, int, int);
template void encoder_backward<double>(double*, double*, const double*, const int*, int, int, int, int, int);

}  // namespace zt::cpu
