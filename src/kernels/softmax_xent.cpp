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

template void softmax_xent_forward_backward<float>(float*, float*, const int*, float, int, int, int, bool);
template void softmax_xent_forward_backward<double>(double*, double*, const int*, double, int, int, int, bool);

}  // namespace zt::cpu
