#include "zero/optimizer.h"

#include <algorithm>
#include <cmath>

#include "backend/ops_cpu.h"
#if ZT_HAVE_CUDA
#include "backend/ops_cuda.h"
#endif
#include "zero/adamw_shard.h"

namespace zt {

template <class Ops>
ShardedOptimizer<Ops>::ShardedOptimizer(const ParamLayout& layout, const Partition& part, StateStore& store, Comm& comm,
                                        const OptimSection& optim)
    : layout_(layout), part_(part), store_(store), comm_(comm), optim_(optim), rules_(part.rules()) {
  host_ = store.has(StateId::host_params);  // the CUDA backend's AdamW on the host
  if (!store.file(StateId::adam_m)) return;
  ZT_ASSERT(rules_.optimizer_sharded && (Ops::tier == Tier::host || host_));  // the CPU runs the update on host memory
  std::vector<offload::SwapFile*> files{store.file(StateId::adam_m), store.file(StateId::adam_v)};
  if (store.file(StateId::master)) files.push_back(store.file(StateId::master)), swap_master_ = true;
  // Swapped master weights are initialised into their file by host_init_master (CUDA backend).
  ZT_ASSERT(!swap_master_ || host_);
  swap_ = std::make_unique<offload::SwapPipeline>(files, part.shard_total(), store.get<M>(StateId::swap_buffers),
                                                  store.swap());
}

template <class Ops>
typename ShardedOptimizer<Ops>::T* ShardedOptimizer<Ops>::params(int u) const {
  const Unit& unit = layout_.units()[size_t(u)];
  if (!rules_.optimizer_sharded) return store_.get<T>(StateId::params) + unit.offset;
  if (rules_.full_params) return store_.get<T>(StateId::params) + unit.offset + part_.unit_shard_begin(u);
  return store_.get<T>(StateId::param_shard) + part_.unit_shard_flat(u);
}

template <class Ops>
typename ShardedOptimizer<Ops>::T* ShardedOptimizer<Ops>::grads(int u) const {
  if (!rules_.optimizer_sharded) return store_.get<T>(StateId::grads) + layout_.units()[size_t(u)].offset;
  return store_.get<T>(StateId::grad_shard) + part_.unit_shard_flat(u);
}

template <class Ops>
typename ShardedOptimizer<Ops>::M* ShardedOptimizer<Ops>::state(StateId id, int u) const {
  M* base = store_.get<M>(id);
  if (!base) return nullptr;  // master weights, without mixed precision
  return base + (rules_.optimizer_sharded ? part_.unit_shard_flat(u) : layout_.units()[size_t(u)].offset);
}

template <class Ops>
void ShardedOptimizer<Ops>::init_master() {
  if (host_) return host_init_master();
  if constexpr (kMixed) {
    for (int u = 0; u < layout_.num_units(); ++u) {
      const size_t n = rules_.optimizer_sharded ? part_.unit_shard_numel(u) : layout_.units()[size_t(u)].padded;
      Ops::widen(state(StateId::master, u), params(u), n);
    }
  }
}

template <class Ops>
double ShardedOptimizer<Ops>::grad_norm() {
  double ss = 0.0;
  if (!rules_.optimizer_sharded) {
    // Every rank holds the same all-reduced gradients.
    for (int u = 0; u < layout_.num_units(); ++u) ss += Ops::sum_squares(grads(u), layout_.units()[size_t(u)].padded);
    return std::sqrt(ss);
  }
  ss = Ops::sum_squares(store_.get<T>(StateId::grad_shard), part_.shard_total());
  comm_.all_reduce_sum(&ss, 1);
  return std::sqrt(ss);
}

template <class Ops>
void ShardedOptimizer<Ops>::step_flat(size_t lo, size_t hi, size_t base, M* const* bufs, double lr, double grad_scale) {
  // The units whose shard slices meet [lo, hi), each updated exactly as the in-memory step does:
  // the same per-tensor calls, cut at sub-group edges (AdamW is elementwise, so bit for bit).
  for (int u = 0; u < layout_.num_units(); ++u) {
    const size_t f = part_.unit_shard_flat(u), a = std::max(lo, f), b = std::min(hi, f + part_.unit_shard_numel(u));
    if (a >= b) continue;
    const size_t k = a - f, at = a - base;
    adamw_unit_range<Ops>(layout_, u, part_.unit_shard_begin(u) + k, b - a, params(u) + k,
                          swap_master_ ? bufs[2] + at : nullptr, grads(u) + k, bufs[0] + at, bufs[1] + at, optim_, lr,
                          grad_scale, steps_taken_);
  }
}

template <class Ops>
void ShardedOptimizer<Ops>::step(double lr, double grad_scale) {
  ++steps_taken_;
  if (host_) return host_step(lr, grad_scale);
  if (swap_) {
    swap_->for_each_subgroup([&](size_t begin, size_t n, M* const* bufs) {
      step_flat(begin, begin + n, begin, bufs, lr, grad_scale);
    });
    return;
  }
  for (int u = 0; u < layout_.num_units(); ++u) {
    const size_t begin = rules_.optimizer_sharded ? part_.unit_shard_begin(u) : 0;
    const size_t n = rules_.optimizer_sharded ? part_.unit_shard_numel(u) : layout_.units()[size_t(u)].padded;
    adamw_unit_range<Ops>(layout_, u, begin, n, params(u), state(StateId::master, u), grads(u), state(StateId::adam_m, u),
                          state(StateId::adam_v, u), optim_, lr, grad_scale, steps_taken_);
  }
}

template class ShardedOptimizer<CpuOps<float>>;
#if ZT_HAVE_CUDA
template class ShardedOptimizer<CudaOps<float>>;
template class ShardedOptimizer<CudaOps<bf16>>;
#endif

}  // namespace zt
