// Where this rank's part of each unit lives in the model-state store (docs/design.md §3.3): the
// slices the optimizer updates, for the device AdamW (ShardedOptimizer) and the CUDA backend's host
// AdamW (HostOptimizer) alike. Stage 0 owns every unit whole; stages 1-2 own their shard of each
// unit inside the full parameter buffer; stage 3 owns the parameter shard.
#pragma once
#include <cstddef>

#include "model/layout.h"
#include "zero/partition.h"
#include "zero/store.h"

namespace zt {

template <class Ops>
struct ShardView {
  using T = typename Ops::T;  // parameters and gradients
  using M = typename Ops::M;  // optimizer moments and master weights

  const ParamLayout& layout;
  const Partition& part;
  StateStore& store;
  StageRules rules;

  // The owned slice of unit u in each buffer (stage 0: the whole unit).
  T* params(int u) const {
    const Unit& unit = layout.units()[size_t(u)];
    if (!rules.optimizer_sharded) return store.get<T>(StateId::params) + unit.offset;
    if (rules.full_params) return store.get<T>(StateId::params) + unit.offset + part.unit_shard_begin(u);
    return store.get<T>(StateId::param_shard) + part.unit_shard_flat(u);
  }
  T* grads(int u) const {
    if (!rules.optimizer_sharded) return store.get<T>(StateId::grads) + layout.units()[size_t(u)].offset;
    return store.get<T>(StateId::grad_shard) + part.unit_shard_flat(u);
  }
  M* state(StateId id, int u) const {
    M* base = store.get<M>(id);
    if (!base) return nullptr;  // master weights, without mixed precision
    return base + (rules.optimizer_sharded ? part.unit_shard_flat(u) : layout.units()[size_t(u)].offset);
  }
};

// Index in the offload::SwapPipeline's buffers of each state in a swap file, -1 where the state
// is in memory (offload.optimizer / offload.params "nvme", docs/design.md §3.6).
struct SwapSlots {
  int m = -1, v = -1, master = -1, param = -1, grad = -1;
};

}  // namespace zt
