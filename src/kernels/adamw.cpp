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
#include <cstring>

namespace zt::cpu {

namespace {
template <class T, bool kClearGrad>
void adamw_pass(T* param, T* grad, T* m, T* v, size_t n, T b2, T one_minus_b1, T one_minus_b2, T eps, T scale,
                T step_size, T bc2_sqrt, T decay) {
#pragma omp parallel for simd schedule(static) if (n >= (1 << 14))
  for (size_t i = 0; i < n; i++) {
    const T g = grad[i] * scale;
    if constexpr (kClearGrad) grad[i] = T(0);
    const T mi = m[i] + one_minus_b1 * (g - m[i]);
    const T vi = b2 * v[i] + one_minus_b2 * g * g;
    m[i] = mi;
    v[i] = vi;
    const T denom = std::sqrt(vi) / bc2_sqrt + eps;
    param[i] = param[i] * decay - step_size * (mi / denom);
  }
}
}  // namespace

template <class T>
void adamw_update(T* param, T* grad, T* m, T* v, size_t n, const AdamWArgs& a) {
  // Per-call scalars in double, as torch computes them in Python floats.
  const double bc1 = 1.0 - std::pow(double(a.beta1), a.step);
  const double bc2 = 1.0 - std::pow(double(a.beta2), a.step);
  const T step_size = T(double(a.lr) / bc1);
  const T bc2_sqrt = T(std::sqrt(bc2));
  const T decay = T(1.0 - double(a.lr) * double(a.weight_decay));
  const T b1 = a.beta1, b2 = a.beta2, one_minus_b1 = T(1) - b1, one_minus_b2 = T(1) - b2;
  const T eps = a.eps, scale = a.grad_scale;
  if (a.clear_grad)
    adamw_pass<T, true>(param, grad, m, v, n, b2, one_minus_b1, one_minus_b2, eps, scale, step_size, bc2_sqrt, decay);
  else
    adamw_pass<T, false>(param, grad, m, v, n, b2, one_minus_b1, one_minus_b2, eps, scale, step_size, bc2_sqrt, decay);
}

template void adamw_update<float>(float*, float*, float*, float*, size_t, const AdamWArgs&);

namespace {
// hash_u32, element_bits and stochastic_round_bf16 of kernels/cuda_common.cuh, bit for bit.
inline uint32_t hash_u32(uint32_t idx, uint32_t seed) {
  constexpr uint32_t n1 = 0xd2a80a3fu, n2 = 0xa884f197u, n3 = 0x6C736F4Bu, n4 = 0xB79F3ABBu, n5 = 0x1b56c4f5u;
  uint32_t m = idx;
  m *= n1; m += seed; m ^= (m >> 9);
  m += n2; m ^= (m >> 11);
  m *= n3; m ^= (m >> 13);
  m += n4; m ^= (m >> 15);
  m *= n5; m ^= (m >> 17);
  return m;
}
inline uint32_t element_bits(uint64_t index, uint32_t seed) {
  return hash_u32(uint32_t(index), seed ^ uint32_t(index >> 32) * 0x85EBCA77u);
}
inline float bf16_bits_to_float(uint16_t b) {
  const uint32_t u = uint32_t(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline uint16_t stochastic_round_bf16(float x, uint32_t random) {
  uint32_t bits;
  std::memcpy(&bits, &x, 4);
  return uint16_t(((bits + (random & 0xFFFFu)) & 0xFFFF0000u) >> 16);
}
}  // namespace

void adamw_update_bf16_master(uint16_t* param, float* master, const uint16_t* grad, float* m, float* v, size_t n,
                              const AdamWArgs& a, uint32_t seed, uint64_t first) {
  // The scalars exactly as adamw.cu computes them (double, rounded to float).
  const double bc1 = 1.0 - std::pow(double(a.beta1), a.step);
  const double bc2 = 1.0 - std::pow(double(a.beta2), a.step);
  const float step_size = float(double(a.lr) / bc1), bc2_sqrt = float(std::sqrt(bc2));
  const float decay = float(1.0 - double(a.lr) * double(a.weight_decay));
  const float b2 = a.beta2, one_minus_b1 = 1.0f - a.beta1, one_minus_b2 = 1.0f - a.beta2, eps = a.eps,
              scale = a.grad_scale;
#pragma omp parallel for simd schedule(static) if (n >= (1 << 14))
  for (size_t i = 0; i < n; i++) {
    const float g = bf16_bits_to_float(grad[i]) * scale;
    const float m0 = m[i];
    const float mi = m0 + one_minus_b1 * (g - m0);
    const float vi = b2 * v[i] + one_minus_b2 * g * g;
    m[i] = mi;
    v[i] = vi;
    const float denom = std::sqrt(vi) / bc2_sqrt + eps;
    const float p_new = master[i] * decay - step_size * (mi / denom);
    master[i] = p_new;
    param[i] = stochastic_round_bf16(p_new, element_bits(first + i, seed));
  }
}
template void adamw_update<double>(double*, double*, double*, double*, size_t, const AdamWArgs&);

}  // namespace zt::cpu
