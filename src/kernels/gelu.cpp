// GELU, tanh approximation, CPU reference. Same formula as GPT-2 and torch gelu(approximate='tanh'):
//   gelu(x) = 0.5 x (1 + tanh(u)),  u = sqrt(2/pi) (x + 0.044715 x^3)
#include "kernels/gelu.h"

#include "kernels/cpu_math.h"

namespace zt::cpu {

constexpr double kBeta = 0.7978845608028654;  // sqrt(2/pi)
constexpr double kKappa = 0.044715;
constexpr size_t kParallelMin = 1 << 14;

template <class T>
void gelu_forward(T* out, const T* inp, size_t n) {
  const T beta = T(kBeta), kappa = T(kKappa);
#pragma omp parallel for simd schedule(static) if (n >= kParallelMin)
  for (size_t i = 0; i < n; i++) {
    const T x = inp[i];
    const T u = beta * (x + kappa * x * x * x);
    out[i] = T(0.5) * x * (T(1) + detail::vtanh(u));
  }
}

// d gelu / dx = 0.5 (1 + tanh u) + 0.5 x (1 - tanh^2 u) du/dx,   du/dx = sqrt(2/pi) (1 + 3 * 0.044715 x^2)
template <class T>
void gelu_backward(T* dinp, const T* inp, const T* dout, size_t n) {
  const T beta = T(kBeta), kappa = T(kKappa);
#pragma omp parallel for simd schedule(static) if (n >= kParallelMin)
  for (size_t i = 0; i < n; i++) {
    const T x = inp[i];
    const T x2 = x * x;
    const T th = detail::vtanh(beta * (x + kappa * x2 * x));
    const T left = T(0.5) * (T(1) + th);
    const T right = T(0.5) * x * (T(1) - th * th) * beta * (T(1) + T(3) * kappa * x2);
    dinp[i] = dout[i] * (left + right);  // dout[i] is read before dinp[i] is written: in place works
  }
}

template void gelu_forward<float>(float*, const float*, size_t);
template void gelu_forward<double>(double*, const double*, size_t);
template void gelu_backward<float>(float*, const float*, const float*, size_t);
template void gelu_backward<double>(double*, const double*, const double*, size_t);

}  // namespace zt::cpu
