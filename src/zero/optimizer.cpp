#include "zero/optimizer.h"

#include <algorithm>
#include <cmath>

#include "backend/ops_cpu.h"
#if ZT_HAVE_CUDA
#include "backend/ops_cuda.h"
#endif
#include "model/tensor_parallel.h"
#include "zero/adamw_shard.h"

namespace zt {

template <class Ops>
ShardedOptimizer<Ops>::ShardedOptimizer(const ParamLayout& layout, const Partition& part, StateStore& store, Comm& comm,
                                        const OptimSection& optim)
    : layout_(layout), part_(part), store_(store), comm_(comm), optim_(optim), rules_(part.rules()),
      shard_{layout, part, store, part.rules()} {
  auto pinned = [&](StateId id) { return store.has(id) && store.info(id).tier == Tier::pinned; };
  // The CUDA backend's AdamW on the host: on copies of my shards, or on them (offload.params "cpu":
  // pinned; "nvme": streamed from their swap files).
  const bool shards_on_host =
      pinned(StateId::grad_shard) || (Ops::tier == Tier::device && store.file(StateId::grad_shard));
  const bool host = store.has(StateId::host_params) || shards_on_host;
  // offload.params "cpu" with the AdamW on the device: the parameter shard alone is on the host.
  params_off_device_ = pinned(StateId::param_shard) && !host;
  // offload.params "nvme" with the AdamW on the device: the parameter shard alone is on disk, read
  // and written unit by unit around the update (params_on_device / params_back), not by a pipeline.
  if (Ops::tier == Tier::device && !host && store.file(StateId::param_shard))
    param_file_ = store.file(StateId::param_shard), params_off_device_ = true;
  std::vector<offload::SwapFile*> files;
  std::vector<bool> read_only;
  std::vector<size_t> elem_bytes;  // the shards hold T (bf16 on the CUDA backend), the state M
  auto add = [&](StateId id, int* at) {
    if (offload::SwapFile* f = store.file(id)) {
      const bool shard = id == StateId::param_shard || id == StateId::grad_shard;
      *at = int(files.size()), files.push_back(f), read_only.push_back(id == StateId::grad_shard);
      elem_bytes.push_back(shard ? sizeof(T) : sizeof(M));
    }
  };
  add(StateId::adam_m, &at_.m), add(StateId::adam_v, &at_.v), add(StateId::master, &at_.master);
  if (!param_file_) add(StateId::param_shard, &at_.param), add(StateId::grad_shard, &at_.grad);
  if (!files.empty()) {
    ZT_ASSERT(rules_.optimizer_sharded && (Ops::tier == Tier::host || host));  // the CPU runs the update on host memory
    // Swapped master weights are initialised into their file by HostOptimizer::init_master (CUDA backend).
    ZT_ASSERT(at_.master < 0 || host);
  // The parameter and gradient shards go to disk together (docs/design.md §3.6), at stage 3 only,
  // where the flat shard is the parameters' own buffer.
    ZT_ASSERT((at_.param < 0) == (at_.grad < 0) && (at_.param < 0 || !rules_.full_params));
    swap_ = std::make_unique<offload::SwapPipeline>(files, part.shard_total(), store.get<M>(StateId::swap_buffers),
                                                    store.swap_spec(), read_only, elem_bytes);
  }
  if (host) host_ = std::make_unique<HostOptimizer<Ops>>(shard_, optim, shards_on_host, swap_.get(), at_);
  // Stage 3 only: at stages 1-2 the gradient shard is reduced bucket by bucket too, but the
  // parameter all-gather follows the step; the CUDA backend's host AdamW has its own overlap.
  // Not with hybrid sharding's replicas (zero/data_mesh.h): with the step inside backward their
  // losses drifted from one rank's by 1e-4 at a varying step (a race not yet found), so the step
  // follows backward there.
  updates_in_backward_ = swap_ && store.swap_spec().overlap_update && optim.grad_clip <= 0 && !rules_.full_params &&
                         Ops::tier == Tier::host && !host && part.config().replicas == 1;
}

// ---- the step inside backward (zero/update_in_backward.h) ----------------------------------------

template <class Ops>
void ShardedOptimizer<Ops>::start_update(double lr) {
  ZT_ASSERT(updates_in_backward_ && !update_);
  ++steps_taken_;
  update_lr_ = lr;
  update_ = std::make_unique<UpdateInBackward>(*swap_, part_.shard_total(),
                                               [this, lr](size_t begin, size_t n, M* const* bufs) {
                                                 step_flat(begin, begin + n, begin, bufs, lr, 1.0);
                                               });
}

template <class Ops>
void ShardedOptimizer<Ops>::grads_final_from(size_t from) {
  if (update_) update_->grads_final_from(from);
}

template <class Ops>
void ShardedOptimizer<Ops>::set_tracer(Tracer* t) {
  tr_ = t;
  if (host_) host_->set_tracer(t);
}

template <class Ops>
void ShardedOptimizer<Ops>::init_master() {
  if (host_) return host_->init_master();
  if constexpr (kMixed) {
    for (int u = 0; u < layout_.num_units(); ++u) {
      const size_t n = rules_.optimizer_sharded ? part_.unit_shard_numel(u) : layout_.units()[size_t(u)].padded;
      Ops::widen(state(StateId::master, u), params_on_device(u), n);
    }
  }
}

// The AdamW on the device with the parameter shard off it (params_off_device_): unit u's shard is
// copied into the first gathered-unit slot, which fits any unit and is free between passes, on the
// compute stream (kernels read device memory only); params_back() copies it back after its update.
//   offload.params "cpu":  from and to the pinned shard itself.
//   offload.params "nvme": through slot 0's pinned read buffer (param_io, free between passes): the
//                          whole blocks around the shard are read from the swap file, and written
//                          back once the stream has copied the updated shard into them. Synchronous,
//                          unit after unit (blocks shared by neighbouring units stay consistent).
template <class Ops>
typename ShardedOptimizer<Ops>::T* ShardedOptimizer<Ops>::params_on_device(int u) {
  if (!params_off_device_) return params(u);
#if ZT_HAVE_CUDA
  if constexpr (Ops::tier == Tier::device) {
    T* slot = store_.get<T>(StateId::gathered_units);  // (unit shard) of slot 0
    const size_t n = part_.unit_shard_numel(u);
    ZT_ASSERT(n <= part_.gather_slot_numel(0));
    const T* src = params(u);
    if (param_file_) {
      // The read buffer's last copies (the gatherer's, or the previous unit's) must be done.
      ZT_CHECK_CUDA(cudaStreamSynchronize(Ops::stream()));
      src = read_param_blocks(u);
    }
    ZT_CHECK_CUDA(cudaMemcpyAsync(slot, src, n * sizeof(T), cudaMemcpyHostToDevice, Ops::stream()));
    return slot;
  }
#endif
  ZT_ASSERT(false);  // only the CUDA backend keeps the shard off the device with its AdamW
  return nullptr;
}

template <class Ops>
void ShardedOptimizer<Ops>::params_back(int u) {
#if ZT_HAVE_CUDA
  if constexpr (Ops::tier == Tier::device) {
    if (!params_off_device_) return;
    const T* slot = store_.get<T>(StateId::gathered_units);
    const size_t bytes = part_.unit_shard_numel(u) * sizeof(T);
    if (!param_file_) {
      ZT_CHECK_CUDA(cudaMemcpyAsync(params(u), slot, bytes, cudaMemcpyDeviceToHost, Ops::stream()));
      return;
    }
    const ParamBlocks b = param_blocks(u);
    ZT_CHECK_CUDA(cudaMemcpyAsync(b.shard, slot, bytes, cudaMemcpyDeviceToHost, Ops::stream()));
    ZT_CHECK_CUDA(cudaStreamSynchronize(Ops::stream()));
    param_file_->write_blocks(b.blocks, b.len, b.at);
  }
#endif
  (void)u;
}

// offload.params "nvme", AdamW on the device: the whole I/O blocks around unit u's shard in its
// swap file, and where they sit in slot 0's read buffer (shard: the shard's first element there).
template <class Ops>
typename ShardedOptimizer<Ops>::ParamBlocks ShardedOptimizer<Ops>::param_blocks(int u) const {
  T* read = store_.get<T>(StateId::param_io) + param_io_offset(part_, 0);
  ZT_ASSERT(part_.unit_shard_numel(u) <= part_.gather_slot_numel(0) / size_t(part_.config().world));
  const size_t off = part_.unit_shard_flat(u) * sizeof(T), a0 = off / offload::kIoAlign * offload::kIoAlign;
  const size_t a1 = offload::io_round_up(off + part_.unit_shard_numel(u) * sizeof(T));
  return {read, read + (off - a0) / sizeof(T), a1 - a0, a0};
}

template <class Ops>
const typename ShardedOptimizer<Ops>::T* ShardedOptimizer<Ops>::read_param_blocks(int u) {
  const ParamBlocks b = param_blocks(u);
  param_file_->read_blocks(b.blocks, b.len, b.at);
  return b.shard;
}

template <class Ops>
double ShardedOptimizer<Ops>::grad_norm(const std::vector<GradSquares>* unit_ss) {
  // Tensor parallelism (zero/grad_squares.h): split tensors' squares from every tensor rank,
  // replicated ones' from tensor rank 0, summed over the data axis and then the tensor group.
  const bool by_tensor = tensor_ != nullptr;
  auto unit = [&](int u, size_t lo, size_t n) { return unit_grad_squares<Ops>(layout_, u, lo, n, grads(u), by_tensor); };
  GradSquares ss;
  const int skip = counts_embedding_ ? 0 : layout_.embedding_units();  // units [0, skip) are counted elsewhere
  if (!rules_.optimizer_sharded) {
    // Every rank holds the same all-reduced gradients.
    for (int u = skip; u < layout_.num_units(); ++u) ss += unit(u, 0, layout_.units()[size_t(u)].padded);
  } else if (!rules_.full_params) {
    // Stage 3: unit by unit, so that a gradient shard on disk, summed as each unit's shard is
    // completed (GradReducer), gives the same norm bit for bit as one in memory.
    ZT_ASSERT(unit_ss || at_.grad < 0);
    for (int u = skip; u < layout_.num_units(); ++u)
      ss += unit_ss ? (*unit_ss)[size_t(u)] : unit(u, part_.unit_shard_begin(u), part_.unit_shard_numel(u));
  } else if (!by_tensor && skip == 0) {
    ss.split = Ops::sum_squares(store_.get<T>(StateId::grad_shard), part_.shard_total());
  } else {
    for (int u = skip; u < layout_.num_units(); ++u) ss += unit(u, part_.unit_shard_begin(u), part_.unit_shard_numel(u));
  }
  double total = ss.mine(!by_tensor || tensor_->rank() == 0);
  if (rules_.optimizer_sharded) comm_.all_reduce_sum(&total, 1);
  if (by_tensor) tensor_->all_reduce_sum(&total, 1);
  if (pipe_) pipe_->all_reduce_sum(&total, 1);
  return std::sqrt(total);
}

template <class Ops>
void ShardedOptimizer<Ops>::step_flat(size_t lo, size_t hi, size_t base, M* const* bufs, double lr, double grad_scale) {
  // The units whose shard slices meet [lo, hi), each updated exactly as the in-memory step does:
  // the same per-tensor calls, cut at sub-group edges (AdamW is elementwise, so bit for bit).
  for (int u = 0; u < layout_.num_units(); ++u) {
    const size_t f = part_.unit_shard_flat(u), a = std::max(lo, f), b = std::min(hi, f + part_.unit_shard_numel(u));
    if (a >= b) continue;
    const size_t k = a - f, at = a - base;
    // Each state from its sub-group buffer when it is swapped, else from memory.
    // (Swapped states are 4-byte elements: offload runs on the CPU backend's fp32 only.)
    auto pick = [&](int i, auto* mem) -> decltype(mem) {
      if (i >= 0) return reinterpret_cast<decltype(mem)>(bufs[i] + at);
      return mem ? mem + k : nullptr;
    };
    adamw_unit_range<Ops>(layout_, u, part_.unit_shard_begin(u) + k, b - a, pick(at_.param, params(u)),
                          pick(at_.master, state(StateId::master, u)), pick(at_.grad, grads(u)),
                          pick(at_.m, state(StateId::adam_m, u)), pick(at_.v, state(StateId::adam_v, u)), optim_, lr,
                          grad_scale, steps_taken_);
  }
}

template <class Ops>
void ShardedOptimizer<Ops>::step(double lr, double grad_scale) {
  if (update_) {  // started by start_update: everything is final now
    ZT_ASSERT(lr == update_lr_ && grad_scale == 1.0);
    const std::unique_ptr<UpdateInBackward> u = std::move(update_);
    return u->join(tr_);
  }
  ++steps_taken_;
  if (host_) return host_->step(lr, grad_scale, steps_taken_);
  if (swap_) {
    swap_->for_each_subgroup([&](size_t begin, size_t n, M* const* bufs) {
      step_flat(begin, begin + n, begin, bufs, lr, grad_scale);
    });
    return;
  }
  // Stage 0: the gradients read are the full ones the next step accumulates into; AdamW leaves
  // them zero in its pass (the sharded stages read a shard the reduction overwrites).
  const bool clear = !rules_.optimizer_sharded;
  for (int u = 0; u < layout_.num_units(); ++u) {
    const size_t begin = rules_.optimizer_sharded ? part_.unit_shard_begin(u) : 0;
    const size_t n = rules_.optimizer_sharded ? part_.unit_shard_numel(u) : layout_.units()[size_t(u)].padded;
    adamw_unit_range<Ops>(layout_, u, begin, n, params_on_device(u), state(StateId::master, u), grads(u),
                          state(StateId::adam_m, u), state(StateId::adam_v, u), optim_, lr, grad_scale, steps_taken_,
                          clear);
    params_back(u);
  }
  grads_cleared_ = clear;
#if ZT_HAVE_CUDA
  // The host may read the pinned shard next (a checkpoint); the next pass's copies are ordered anyway.
  if constexpr (Ops::tier == Tier::device)
    if (params_off_device_) ZT_CHECK_CUDA(cudaStreamSynchronize(Ops::stream()));
#endif
}

template class ShardedOptimizer<CpuOps<float>>;
#if ZT_HAVE_CUDA
template class ShardedOptimizer<CudaOps<float>>;
template class ShardedOptimizer<CudaOps<bf16>>;
#endif

}  // namespace zt
