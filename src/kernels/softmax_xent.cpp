// Fused softmax + cross-entropy (+ gradient), CPU reference.
//
// Per row (V real columns, Vp - V padding columns):
//   pass 1  m   = max_j x_j                           (j < V)
//   pass 2  e_j = exp(x_j - m),  S = sum_j e_j         (e_j written over x_j when the gradient is wanted)
//           loss = m + log S - x[target]
//   pass 3  x_j = dloss * (e_j / S - [j == target]),  padding columns = 0
// A 50k-wide row of floats (200 KB) stays in L2 across the three passes. exp is the vectorised
// polynomial of cpu_math.h for float; the sum S is accumulated in double.
#include "kernels/softmax_xent.h"

#include <cmath>
#include <cstddef>
#include <limits>

#include "kernels/cpu_math.h"

namespace zt::cpu {

template <class T>
void softmax_xent_forward_backward(T* logits, T* losses, const int* targets, T dloss, int N, int V, int Vp,
                                   bool write_dlogits) {
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; n++) {
    T* __restrict x = logits + (size_t)n * Vp;
    const int target = targets[n];  // the caller guarantees 0 <= target < V
    const T x_target = x[target];

    T m = -std::numeric_limits<T>::infinity();
#pragma omp simd reduction(max : m)
    for (int j = 0; j < V; j++) m = x[j] > m ? x[j] : m;

    double sum = 0.0;
    if (write_dlogits) {
#pragma omp simd reduction(+ : sum)
      for (int j = 0; j < V; j++) {
        const T e = detail::vexp(x[j] - m);
        x[j] = e;
        sum += double(e);
      }
    } else {
#pragma omp simd reduction(+ : sum)
      for (int j = 0; j < V; j++) sum += double(detail::vexp(x[j] - m));
    }
    losses[n] = T(double(m) + std::log(sum) - double(x_target));

    if (write_dlogits) {
      const T scale = T(double(dloss) / sum);
#pragma omp simd
      for (int j = 0; j < V; j++) x[j] *= scale;
      x[target] -= dloss;
      for (int j = V; j < Vp; j++) x[j] = T(0);
    }
  }
}

template void softmax_xent_forward_backward<float>(float*, float*, const int*, float, int, int, int, bool);
template void softmax_xent_forward_backward<double>(double*, double*, const int*, double, int, int, int, bool);

}  // namespace zt::cpu
