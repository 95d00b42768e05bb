#include "zero/optimizer.h"

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
    : layout_(layout), part_(part), store_(store), comm_(comm), optim_(optim), rules_(part.rules()) {}

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
void ShardedOptimizer<Ops>::step(double lr, double grad_scale) {
  ++steps_taken_;
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
