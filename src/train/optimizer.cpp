#include "train/optimizer.h"

#include <cmath>

#include "model/ops_cpu.h"

namespace zt {

template <class Ops>
AdamW<Ops>::AdamW(const ParamLayout& layout, const OptimSection& cfg, MemoryTracker& mem) : layout_(layout), cfg_(cfg) {
  m_ = mem.alloc(layout.total() * sizeof(T), Ops::tier, Category::optimizer, "AdamW first moment");
  v_ = mem.alloc(layout.total() * sizeof(T), Ops::tier, Category::optimizer, "AdamW second moment");
}

template <class Ops>
double AdamW<Ops>::grad_norm(GPT<Ops>& model) const {
  double ss = 0.0;
  for (const Unit& u : layout_.units()) ss += Ops::sum_squares(model.grads() + u.offset, u.padded);
  return std::sqrt(ss);
}

template <class Ops>
void AdamW<Ops>::step(GPT<Ops>& model, double lr, double grad_scale) {
  ++t_;
  for (const TensorSlot& s : layout_.tensors()) {
    cpu::AdamWArgs a{float(lr), float(cfg_.beta1), float(cfg_.beta2), float(cfg_.eps),
                     float(s.decay ? cfg_.weight_decay : 0.0), float(grad_scale), t_};
    Ops::adamw(model.param(s.id, s.layer), model.grad(s.id, s.layer), m_.as<T>() + s.offset, v_.as<T>() + s.offset, s.numel, a);
  }
}

template class AdamW<CpuOps<float>>;
template class AdamW<CpuOps<double>>;

}  // namespace zt
