// Learning-rate schedule: linear warmup, then cosine decay to min_lr_ratio * lr (or constant).
// Step s is 0-based; the PyTorch reference (test/ref/torch_gpt.py) implements the same formula.
#pragma once
#include <cmath>
#include <string>

namespace zt {

inline double lr_at(int s, double lr, int warmup, int steps, const std::string& schedule, double min_lr_ratio) {
  if (s < warmup) return lr * double(s + 1) / double(warmup);
  if (schedule == "constant" || steps <= warmup) return lr;
  const double r = double(s - warmup) / double(steps - warmup);
  const double min_lr = lr * min_lr_ratio;
  return min_lr + 0.5 * (1.0 + std::cos(M_PI * r)) * (lr - min_lr);
}

// torch.nn.utils.clip_grad_norm_'s factor: gradients are multiplied by min(1, clip / (norm + 1e-6)).
inline double clip_scale(double grad_norm, double grad_clip) {
  if (grad_clip <= 0.0) return 1.0;
  const double c = grad_clip / (grad_norm + 1e-6);
  return c < 1.0 ? c : 1.0;
}

}  // namespace zt
