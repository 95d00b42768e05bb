// Fused softmax + cross-entropy (+ gradient), CPU reference.
//
// Per row (V real columns, Vp - V padding columns):
//   pass 1  m   = max_j x_j                           (j < V)
//   pass 2  e_j = exp(x_j - m),  S = sum_j e_j         (e_j written over x_j when the gradient is wanted)
//           loss = m + log S - x[target]
//   pass 3  x_j = dloss * (e_j / S - [j == target]),  padding columns = 0
// A 50k-wide row of floats (200 KB) stays in L2 across the three passes. exp is the vectorised
// polynomial of cpu_math.h for float.
#include "kernels/softmax_xent.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>

#include "kernels/cpu_math.h"

namespace zt::cpu {
namespace {

// One row; returns the loss.
template <class T>
T softmax_xent_row(T* __restrict x, int target, T dloss, int V, int Vp, bool write_dlogits) {
  const T x_target = x[target];

  T m = -std::numeric_limits<T>::infinity();
#pragma omp simd reduction(max : m)
  for (int j = 0; j < V; j++) m = x[j] > m ? x[j] : m;

  // S is summed in blocks: a vectorised sum in T within a block, blocks added in double. (A double
  // accumulator inside the exp loop itself stops GCC 12 from vectorising the float exp.)
  constexpr int kBlock = 512;
  double sum = 0.0;
  for (int j0 = 0; j0 < V; j0 += kBlock) {
    const int j1 = std::min(V, j0 + kBlock);
    T s = 0;
    if (write_dlogits) {
#pragma omp simd reduction(+ : s)
      for (int j = j0; j < j1; j++) {
        x[j] = detail::vexp(x[j] - m);
        s += x[j];
      }
    } else {
#pragma omp simd reduction(+ : s)
      for (int j = j0; j < j1; j++) s += detail::vexp(x[j] - m);
    }
    sum += double(s);
  }

  if (write_dlogits) {
    const T scale = T(double(dloss) / sum);
#pragma omp simd
    for (int j = 0; j < V; j++) x[j] *= scale;
    x[target] -= dloss;
    for (int j = V; j < Vp; j++) x[j] = T(0);
  }
  return T(double(m) + std::log(sum) - double(x_target));
}

}  // namespace

template <class T>
void softmax_xent_forward_backward(T* logits, T* losses, const int* targets, T dloss, int N, int V, int Vp,
                                   bool write_dlogits) {
  // The caller guarantees 0 <= targets[n] < V.
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; n++)
    losses[n] = softmax_xent_row(logits + (size_t)n * Vp, targets[n], dloss, V, Vp, write_dlogits);
}

template <class T>
void xent_chunk_partial(const T* logits, int ld, int N, int col0, int cols, int V, const int* targets, T* run_max,
                        T* run_sum, T* x_target, bool first) {
  const int n = std::max(0, std::min(cols, V - col0));  // real vocabulary columns in the chunk
#pragma omp parallel for schedule(static)
  for (int r = 0; r < N; r++) {
    const T* __restrict x = logits + (size_t)r * ld;
    const int t = targets[r] - col0;
    if (t >= 0 && t < cols) x_target[r] = x[t];
    double m = first ? -std::numeric_limits<double>::infinity() : double(run_max[r]);
    double sum = first ? 0.0 : double(run_sum[r]);
    if (n > 0) {
      T mc = -std::numeric_limits<T>::infinity();
#pragma omp simd reduction(max : mc)
      for (int j = 0; j < n; j++) mc = x[j] > mc ? x[j] : mc;
      double sc = 0.0;  // as softmax_xent_row: a vectorised sum in T per block, blocks in double
      constexpr int kBlock = 512;
      for (int j0 = 0; j0 < n; j0 += kBlock) {
        const int j1 = std::min(n, j0 + kBlock);
        T s = 0;
#pragma omp simd reduction(+ : s)
        for (int j = j0; j < j1; j++) s += detail::vexp(x[j] - mc);
        sc += double(s);
      }
      const double M = std::max(m, double(mc));
      sum = sum * std::exp(m - M) + sc * std::exp(double(mc) - M);  // exp(-inf) = 0 on the first chunk
      m = M;
    }
    run_max[r] = T(m);
    run_sum[r] = T(sum);
  }
}

template <class T>
void xent_chunk_finish(T* losses, T* run_max, const T* run_sum, const T* x_target, int N) {
  for (int r = 0; r < N; r++) {
    const double lse = double(run_max[r]) + std::log(double(run_sum[r]));
    run_max[r] = T(lse);
    losses[r] = T(lse - double(x_target[r]));
  }
}

template <class T>
void xent_chunk_grad(T* logits, int ld, int N, int col0, int cols, int V, const int* targets, const T* lse, T dloss) {
  const int n = std::max(0, std::min(cols, V - col0));
#pragma omp parallel for schedule(static)
  for (int r = 0; r < N; r++) {
    T* __restrict x = logits + (size_t)r * ld;
    const T l = lse[r];
#pragma omp simd
    for (int j = 0; j < n; j++) x[j] = dloss * detail::vexp(x[j] - l);
    for (int j = std::max(n, 0); j < cols; j++) x[j] = T(0);
    const int t = targets[r] - col0;
    if (t >= 0 && t < n) x[t] -= dloss;
  }
}

#define ZT_XENT_CHUNK(T)                                                                                        \
  template void xent_chunk_partial<T>(const T*, int, int, int, int, int, const int*, T*, T*, T*, bool);        \
  template void xent_chunk_finish<T>(T*, T*, const T*, const T*, int);                                          \
  template void xent_chunk_grad<T>(T*, int, int, int, int, int, const int*, const T*, T);
ZT_XENT_CHUNK(float)
ZT_XENT_CHUNK(double)
#undef ZT_XENT_CHUNK

template void softmax_xent_forward_backward<float>(float*, float*, const int*, float, int, int, int, bool);
template void softmax_xent_forward_backward<double>(double*, double*, const int*, double, int, int, int, bool);

}  // namespace zt::cpu
