// AdamW (decoupled weight decay, as torch.optim.AdamW) on a contiguous range of parameters.
#pragma once
#include <cstddef>
namespace zt::cpu {
struct AdamWArgs {
  float lr, beta1, beta2, eps, weight_decay;
  float grad_scale;  // multiplies every gradient first (global-norm clipping, loss scaling)
  int step;          // 1-based step, for bias correction
};
// param -= lr * (wd * param + mhat / (sqrt(vhat) + eps)), m and v updated in place.
template <class T> void adamw_update(T* param, const T* grad, T* m, T* v, size_t n, const AdamWArgs& a);
}  // namespace zt::cpu
