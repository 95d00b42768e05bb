// AdamW (decoupled weight decay, as torch.optim.AdamW) on a contiguous range of parameters.
#pragma once
#include <cstddef>
#include <cstdint>
namespace zt::cpu {
struct AdamWArgs {
  float lr, beta1, beta2, eps, weight_decay;
  float grad_scale;  // multiplies every gradient first (global-norm clipping, loss scaling)
  int step;          // 1-based step, for bias correction
  // Leave the gradient zero after reading it, so that the next step's accumulation starts from
  // zero without a pass of its own over the gradients (the in-memory step at stage 0).
  bool clear_grad = false;
};
// param -= lr * (wd * param + mhat / (sqrt(vhat) + eps)), m and v updated in place.
template <class T> void adamw_update(T* param, T* grad, T* m, T* v, size_t n, const AdamWArgs& a);
// The CUDA kernel's mixed-precision update (adamw.cu, T = bf16 with a master) on the CPU, for the CUDA
// backend's offloaded optimizer (offload.optimizer "cpu" / "nvme"): the same fp32 arithmetic, the
// master updated, the bf16 parameter (raw bits) its stochastic rounding with the kernel's random bits
// (those of element first + i for the step's seed). a.clear_grad must be false.
void adamw_update_bf16_master(uint16_t* param, float* master, const uint16_t* grad, float* m, float* v, size_t n,
                              const AdamWArgs& a, uint32_t seed, uint64_t first);
}  // namespace zt::cpu

#if ZT_HAVE_CUDA
#include "runtime/cuda_check.h"
namespace zt::cuda {
// AdamW with fp32 state. T = bf16: `master` (fp32 copy of the parameters) is updated and the bf16
// parameter is its stochastic rounding (counter-based: the bits of element first + i, first being
// the global flat index of param[0], for the step's `seed`, so any cut into calls rounds alike). T = float:
// master may be nullptr (param is the master; for bf16 the update is then computed from the bf16
// value and stochastically rounded back). With a master, param = round(master) afterwards, exactly
// for float. m and v are fp32 always.
template <class T> void adamw_update(T* param, float* master, T* grad, float* m, float* v, size_t n,
                                     const cpu::AdamWArgs& a, uint32_t seed, uint64_t first, cudaStream_t stream);
}  // namespace zt::cuda
#endif
