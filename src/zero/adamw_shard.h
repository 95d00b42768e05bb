// AdamW over (parts of) the parameter layout. The ZeRO engine calls it on each rank's shard of
// each unit; weight decay is decided per tensor from the layout (2-D weights only), so a shard
// boundary may cut through a tensor and the decision stays right.
#pragma once
#include <cstddef>

#include "kernels/adamw.h"
#include "model/layout.h"
#include "plan/plan.h"

namespace zt {

// AdamW on elements [begin, begin + n) of unit u (offsets relative to the unit). param, master,
// grad, m, v point at element `begin` of their buffers; master is nullptr unless the op table keeps
// fp32 master weights beside lower-precision parameters. Padding elements (past the unit's last
// tensor) are left alone, so they stay zero. clear_grad: leave the gradient zero (AdamWArgs).
template <class Ops>
void adamw_unit_range(const ParamLayout& layout, int u, size_t begin, size_t n, typename Ops::T* param,
                      typename Ops::M* master, typename Ops::T* grad, typename Ops::M* m, typename Ops::M* v,
                      const OptimSection& cfg, double lr, double grad_scale, int step, bool clear_grad = false) {
  const Unit& unit = layout.units()[size_t(u)];
  for (int ti : unit.tensors) {
    const TensorSlot& s = layout.tensors()[size_t(ti)];
    const UnitPiece p = layout.piece(u, ti);  // a unit may hold part of a tensor (embedding chunks)
    const size_t t0 = p.at, t1 = t0 + p.count;
    const size_t a = t0 > begin ? t0 : begin, b = t1 < begin + n ? t1 : begin + n;
    if (a >= b) continue;
    cpu::AdamWArgs args{float(lr), float(cfg.beta1), float(cfg.beta2), float(cfg.eps),
                        float(s.decay ? cfg.weight_decay : 0.0), float(grad_scale), step, clear_grad};
    const size_t k = a - begin;
    // Stochastic rounding draws by the element's global flat index and the step, never by the
    // slice: ranks, shards and offload sub-groups cut the buffer differently and round alike.
    const uint32_t seed = uint32_t(step) * 0x9E3779B1u;
    Ops::adamw(param + k, master ? master + k : nullptr, grad + k, m + k, v + k, b - a, args, seed, unit.offset + a);
  }
}

}  // namespace zt
