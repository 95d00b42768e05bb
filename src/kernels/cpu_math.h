// Small math helpers shared by the CPU reference kernels (not an op; no CUDA counterpart).
//
// Why this exists: without -ffast-math GCC never vectorises std::exp / std::tanh on float, and a
// scalar expf costs ~10-20 cycles. The classifier (softmax over 50k-wide rows), attention and
// GELU call exp once per element, so a scalar exp would cost as much as the matmuls they sit
// next to. vexp() for float is a branch-free polynomial (Cephes expf, ~1 ulp) that GCC turns
// into AVX2 / AVX-512 code inside `#pragma omp simd` loops. For double, the test/oracle type,
// we simply call std::exp: accuracy matters there, speed does not.
// The clamps below vectorise only without trapping math: the files that call vexp / vtanh are
// built with -fno-trapping-math (CMakeLists.txt); with it GCC leaves their loops scalar.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>

namespace zt::cpu::detail {

// exp(x) for float, relative error ~1 ulp on [-87.3, 88].
// Below ln(FLT_MIN) ~ -87.34 it returns 0 (no denormals); above 88 it saturates at exp(88) ~ 1.65e38
// instead of overflowing to inf. NaN in, NaN out.
inline float exp_f32(float x) {
  const float lo = -87.33654f, hi = 88.0f;
  const bool underflow = x < lo;
  x = x > hi ? hi : x;
  x = x < lo ? lo : x;
  // x = k*ln2 + r with integer k and |r| <= ln2/2. Adding 1.5*2^23 rounds x/ln2 to the nearest
  // integer and leaves k in the low mantissa bits of the sum.
  const float shifter = 12582912.0f;  // 1.5 * 2^23
  float kf = x * 1.44269504088896341f + shifter;
  uint32_t kbits;
  std::memcpy(&kbits, &kf, sizeof kbits);
  kf -= shifter;
  // r = x - k*ln2, with ln2 split in two parts so that k*ln2_hi is exact (Cody-Waite).
  float r = x - kf * 0.693359375f;
  r = r - kf * -2.12194440e-4f;
  // exp(r) ~ 1 + r + r^2 * P(r)   (Cephes expf minimax coefficients)
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * (r * r) + r + 1.0f;
  // times 2^k, built directly in the exponent field: k + 127 is in [1, 254] after clamping.
  // (Unsigned arithmetic: well defined even for the garbage k of a NaN input.)
  const uint32_t ebits = (kbits - 0x4B400000u + 127u) << 23;
  float two_k;
  std::memcpy(&two_k, &ebits, sizeof two_k);
  const float y = p * two_k;
  return underflow ? 0.0f : y;
}

// tanh(x) = 1 - 2 / (exp(2x) + 1). Absolute error ~1e-7 (what GELU needs: it uses 1 + tanh).
inline float tanh_f32(float x) { return 1.0f - 2.0f / (exp_f32(2.0f * x) + 1.0f); }

inline float vexp(float x) { return exp_f32(x); }
inline double vexp(double x) { return std::exp(x); }
inline float vtanh(float x) { return tanh_f32(x); }
inline double vtanh(double x) { return std::tanh(x); }

}  // namespace zt::cpu::detail
