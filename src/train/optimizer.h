// AdamW over the parameter layout, unsharded (ZeRO stage 0 on one rank). Moments are tracked as
// "optimizer" memory; weight decay applies only to the tensors the layout marks (2-D weights).
#pragma once
#include "model/gpt.h"
#include "plan/plan.h"

namespace zt {

template <class Ops>
class AdamW {
 public:
  using T = typename Ops::T;
  AdamW(const ParamLayout& layout, const OptimSection& cfg, MemoryTracker& mem);

  // Global L2 norm of the gradients (padding is zero and adds nothing).
  double grad_norm(GPT<Ops>& model) const;
  // One update with learning rate lr; grad_scale multiplies every gradient (clipping).
  void step(GPT<Ops>& model, double lr, double grad_scale);
  int steps_taken() const { return t_; }

 private:
  const ParamLayout& layout_;
  OptimSection cfg_;
  Allocation m_, v_;  // (layout.total()) each
  int t_ = 0;
};

}  // namespace zt
