// AdamW, CUDA: one fused streaming pass over (param, master, grad, m, v), fp32 math throughout.
// Same formula and operation order as the CPU reference (adamw.cpp, torch.optim.AdamW):
//   g      = grad * grad_scale
//   m      = m + (1 - beta1) (g - m)
//   v      = beta2 v + (1 - beta2) g g
//   denom  = sqrt(v) / sqrt(1 - beta2^step) + eps
//   p      = p (1 - lr wd) - lr / (1 - beta1^step) * (m / denom)
// The per-call scalars are computed on the host in double and rounded to float, exactly as the CPU
// reference rounds them, so fp32 results agree to rounding (FMA contraction aside).
//
// Where p comes from: master != nullptr -> the fp32 master copy (updated in place); otherwise the
// parameter itself, read as float. The parameter is written as round_param<T>(p): identity for
// float, stochastic rounding for bf16 with the random bits of the element's global index
// (first + i) and the step's seed, so a rerun is bit-identical however the buffer is cut into calls.
#include <cmath>

#include "kernels/adamw.h"
#include "kernels/cuda_common.cuh"

namespace zt::cuda {
namespace {

struct AdamWScalars {
  float step_size, bc2_sqrt, decay, b1, b2, one_minus_b1, one_minus_b2, eps, scale;
};

template <class T>
__global__ void adamw_kernel(T* __restrict__ param, float* __restrict__ master, T* __restrict__ grad,
                             float* __restrict__ m, float* __restrict__ v, size_t n, AdamWScalars s, uint32_t seed,
                             uint64_t first, bool clear_grad) {
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const float g = to_float(grad[i]) * s.scale;
    if (clear_grad) grad[i] = T(0.0f);
    const float m0 = m[i];
    const float mi = m0 + s.one_minus_b1 * (g - m0);
    const float vi = s.b2 * v[i] + s.one_minus_b2 * g * g;
    m[i] = mi;
    v[i] = vi;
    const float denom = sqrtf(vi) / s.bc2_sqrt + s.eps;
    const float p = master ? master[i] : to_float(param[i]);
    const float p_new = p * s.decay - s.step_size * (mi / denom);
    if (master) master[i] = p_new;
    param[i] = round_param<T>(p_new, element_bits(first + i, seed));
  }
}

}  // namespace

template <class T>
void adamw_update(T* param, float* master, T* grad, float* m, float* v, size_t n, const cpu::AdamWArgs& a,
                  uint32_t seed, uint64_t first, cudaStream_t stream) {
  if (n == 0) return;
  ZT_REQUIRE(a.step >= 1, "adamw: step is 1-based, got " << a.step);
  // Per-call scalars in double, rounded to float, as the CPU reference does.
  const double bc1 = 1.0 - std::pow(double(a.beta1), a.step);
  const double bc2 = 1.0 - std::pow(double(a.beta2), a.step);
  AdamWScalars s;
  s.step_size = float(double(a.lr) / bc1);
  s.bc2_sqrt = float(std::sqrt(bc2));
  s.decay = float(1.0 - double(a.lr) * double(a.weight_decay));
  s.b1 = a.beta1;
  s.b2 = a.beta2;
  s.one_minus_b1 = 1.0f - a.beta1;
  s.one_minus_b2 = 1.0f - a.beta2;
  s.eps = a.eps;
  s.scale = a.grad_scale;

  constexpr int threads = 256;
  constexpr size_t max_blocks = 8192;  // grid-stride beyond this
  const size_t blocks = (n + threads - 1) / threads;
  const int grid = int(blocks < max_blocks ? blocks : max_blocks);
  adamw_kernel<T><<<grid, threads, 0, stream>>>(param, master, grad, m, v, n, s, seed, first, a.clear_grad);
  ZT_CHECK_LAUNCH();
}

template void adamw_update<float>(float*, float*, float*, float*, float*, size_t, const cpu::AdamWArgs&,
                                  uint32_t, uint64_t, cudaStream_t);
template void adamw_update<__nv_bfloat16>(__nv_bfloat16*, float*, __nv_bfloat16*, float*, float*, size_t,
                                          const cpu::AdamWArgs&, uint32_t, uint64_t, cudaStream_t);

}  // namespace zt::cuda
