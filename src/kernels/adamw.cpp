// AdamW, CPU reference, with torch.optim.AdamW semantics (decoupled weight decay):
//   g      = grad * grad_scale
//   param *= 1 - lr * wd
//   m      = beta1 m + (1 - beta1) g              (torch: m.lerp_(g, 1 - beta1))
//   v      = beta2 v + (1 - beta2) g^2
//   param -= lr / (1 - beta1^step) * m / (sqrt(v) / sqrt(1 - beta2^step) + eps)
// The last line is lr * mhat / (sqrt(vhat) + eps), arranged as torch's single-tensor and foreach
// implementations arrange it, so that fp32 results track PyTorch's closely. step starts at 1.
//
// Speed: this is a pure streaming loop (4 arrays in, 3 out). GCC only vectorises std::sqrt when
// the file is compiled with -fno-math-errno (errno is never read here); with it the loop runs at
// memory speed, about twice as fast as with the scalar sqrt.
#include "kernels/adamw.h"

#include <cmath>

namespace zt::cpu {

template <class T>
void adamw_update(T* param, const T* grad, T* m, T* v, size_t n, const AdamWArgs& a) {
  // Per-call scalars in double, as torch computes them in Python floats.
  const double bc1 = 1.0 - std::pow(double(a.beta1), a.step);
  const double bc2 = 1.0 - std::pow(double(a.beta2), a.step);
  const T step_size = T(double(a.lr) / bc1);
  const T bc2_sqrt = T(std::sqrt(bc2));
  const T decay = T(1.0 - double(a.lr) * double(a.weight_decay));
  const T b1 = a.beta1, b2 = a.beta2, one_minus_b1 = T(1) - b1, one_minus_b2 = T(1) - b2;
  const T eps = a.eps, scale = a.grad_scale;

#pragma omp parallel for simd schedule(static) if (n >= (1 << 14))
  for (size_t i = 0; i < n; i++) {
    const T g = grad[i] * scale;
    const T mi = m[i] + one_minus_b1 * (g - m[i]);
    const T vi = b2 * v[i] + one_minus_b2 * g * g;
    m[i] = mi;
    v[i] = vi;
    const T denom = std::sqrt(vi) / bc2_sqrt + eps;
    param[i] = param[i] * decay - step_size * (mi / denom);
  }
}

template void adamw_update<float>(float*, const float*, float*, float*, size_t, const AdamWArgs&);
template void adamw_update<double>(double*, const double*, double*, double*, size_t, const AdamWArgs&);

}  // namespace zt::cpu
