// Layer normalisation over the last dimension, CPU reference.
//   mean = sum(x) / C,  var = sum((x - mean)^2) / C  (biased, as PyTorch),  rstd = 1 / sqrt(var + 1e-5)
//   out  = (x - mean) * rstd * weight + bias
#include "kernels/layernorm.h"

#include <algorithm>
#include <cmath>
#include <cstddef>

namespace zt::cpu {

template <class T>
void layernorm_forward(T* out, T* mean, T* rstd, const T* inp, const T* weight, const T* bias, int N, int C) {
  const T eps = T(1e-5);
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; n++) {
    const T* __restrict x = inp + (size_t)n * C;
    T* __restrict o = out + (size_t)n * C;
    T sum = 0;
#pragma omp simd reduction(+ : sum)
    for (int c = 0; c < C; c++) sum += x[c];
    const T m = sum / C;
    // Two passes: the variance as the mean of squared deviations, never E[x^2] - E[x]^2.
    T ss = 0;
#pragma omp simd reduction(+ : ss)
    for (int c = 0; c < C; c++) {
      const T d = x[c] - m;
      ss += d * d;
    }
    const T s = T(1) / std::sqrt(ss / C + eps);
#pragma omp simd
    for (int c = 0; c < C; c++) o[c] = (x[c] - m) * s * weight[c] + bias[c];
    mean[n] = m;
    rstd[n] = s;
  }
}

// With xhat = (x - mean) * rstd and g = dout * weight:
//   dinp    += rstd * (g - mean_c(g) - xhat * mean_c(g * xhat))
//   dweight += sum_n dout * xhat,   dbias += sum_n dout
template <class T>
void layernorm_backward(T* dinp, T* dweight, T* dbias, const T* dout, const T* inp, const T* weight, const T* mean,
                        const T* rstd, int N, int C) {
  // 1) dinp: rows are independent.
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; n++) {
    const T* __restrict x = inp + (size_t)n * C;
    const T* __restrict dy = dout + (size_t)n * C;
    T* __restrict dx = dinp + (size_t)n * C;
    const T m = mean[n], s = rstd[n];
    T g_mean = 0, gx_mean = 0;
#pragma omp simd reduction(+ : g_mean, gx_mean)
    for (int c = 0; c < C; c++) {
      const T g = dy[c] * weight[c];
      g_mean += g;
      gx_mean += g * (x[c] - m) * s;
    }
    g_mean /= C;
    gx_mean /= C;
#pragma omp simd
    for (int c = 0; c < C; c++) {
      const T xhat = (x[c] - m) * s;
      dx[c] += s * (dy[c] * weight[c] - g_mean - xhat * gx_mean);
    }
  }

  // 2) dweight, dbias: sums over all rows. Each thread owns a block of channels and adds the rows
  //    in order into double accumulators: no races, no per-thread copies, and the same bits for
  //    any thread count.
  constexpr int CB = 64;
  const int nblocks = (C + CB - 1) / CB;
#pragma omp parallel for schedule(static)
  for (int blk = 0; blk < nblocks; blk++) {
    const int c0 = blk * CB, w = std::min(C, c0 + CB) - c0;
    double acc_w[CB] = {}, acc_b[CB] = {};
    for (int n = 0; n < N; n++) {
      const T* __restrict x = inp + (size_t)n * C + c0;
      const T* __restrict dy = dout + (size_t)n * C + c0;
      const T m = mean[n], s = rstd[n];
#pragma omp simd
      for (int c = 0; c < w; c++) {
        acc_w[c] += double(dy[c] * ((x[c] - m) * s));
        acc_b[c] += double(dy[c]);
      }
    }
    for (int c = 0; c < w; c++) {
      dweight[c0 + c] += T(acc_w[c]);
      dbias[c0 + c] += T(acc_b[c]);
    }
  }
}

template void layernorm_forward<float>(float*, float*, float*, const float*, const float*, const float*, int, int);
template void layernorm_forward<double>(double*, double*, double*, const double*, const double*, const double*, int,
                                        int);
template void layernorm_backward<float>(float*, float*, float*, const float*, const float*, const float*, const float*,
                                        const float*, int, int);
template void layernorm_backward<double>(double*, double*, double*, const double*, const double*, const double*,
                                         const double*, const double*, int, int);

}  // namespace zt::cpu
