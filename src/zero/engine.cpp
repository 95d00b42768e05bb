#include "zero/engine.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <future>
#include <memory>
#include <type_traits>
#include <utility>
#include <vector>

#include "backend/ops_cpu.h"
#if ZT_HAVE_CUDA
#include "backend/ops_cuda.h"
#endif
#include "runtime/error.h"

namespace zt {

template <class Ops>
ZeroEngine<Ops>::ZeroEngine(GPT<Ops>& model, const Partition& part, StateStore& store, Comm& shard_group,
                            const OptimSection& optim, StepTokens step_tokens, Comm* replicas)
    : model_(model), part_(part), store_(store), group_(shard_group), replicas_(replicas), rules_(part.rules()),
      reducer_(model, part, store, shard_group, replicas), gatherer_(model, part, store, shard_group),
      optimizer_(model.layout(), part, store, shard_group, optim),
      lookup_(make_embedding_exchange(*this, model, part, store, shard_group, reducer_, std::move(step_tokens))) {
  // The partition's rank and world are this rank's place in the group (not necessarily the world:
  // nothing here needs a global identity; swap files are named by SwapSpec::rank, given apart).
  ZT_ASSERT(shard_group.world() == part.config().world && shard_group.rank() == part.config().rank);
  // Device buffers go only to a comm that takes device buffers of their type (NCCL, or MPI through
  // host staging; comm/comm_ptr.h).
  ZT_ASSERT(shard_group.device_elem_bytes() == (Ops::tier == Tier::device ? int(sizeof(T)) : 0));
  const ParamLayout& layout = model.layout();
  T* params = store.get<T>(StateId::params);
  T* grads = store.get<T>(StateId::grads);
  for (int u = 0; u < layout.num_units(); ++u) {
    const size_t off = layout.units()[size_t(u)].offset;
    model_.set_unit_params(u, params ? params + off : nullptr);
    model_.set_unit_grads(u, grads ? grads + off : nullptr);
  }
  model_.set_hooks(&hooks());
  // offload.optimizer "cpu" on the CUDA backend: a unit's shards go to the CPU AdamW as soon as its
  // gradient shard is final (zero/host_optimizer.cpp).
  if (optimizer_.host_overlaps())
    reducer_.on_shards_final([this](const std::vector<int>& units) { optimizer_.host()->units_final(units); });
  if (optimizer_.updates_in_backward()) {
    // The edge starts at the end of the last unit's shard (the shard's padding beyond is nobody's).
    for (int u = 0; u < model.layout().num_units(); ++u)
      units_end_ = std::max(units_end_, part.unit_shard_flat(u) + part.unit_shard_numel(u));
    reducer_.leave_pool_to_optimizer();
    reducer_.on_shards_final([this](const std::vector<int>& units) {
      size_t lo = SIZE_MAX, hi = 0;
      for (int u : units) {
        lo = std::min(lo, part_.unit_shard_flat(u));
        hi = std::max(hi, part_.unit_shard_flat(u) + part_.unit_shard_numel(u));
      }
      final_.add(lo, hi, reducer_.shard_writes_queued());
    });
  }
}

template <class Ops>
ZeroEngine<Ops>::~ZeroEngine() {
  model_.set_hooks(nullptr);
}

template <class Ops>
void ZeroEngine<Ops>::init_parameters(uint64_t seed, const std::string& llmc_path) {
  if (rules_.full_params) {
    // Every rank computes the same values (counter-based RNG, or the same file).
    if (llmc_path.empty()) model_.init_gpt2(seed);
    else model_.load_llmc(llmc_path);
  } else {
    init_param_shard(model_, store_, seed, llmc_path);  // stage 3: my shard only (zero/shard_init.h)
  }
  optimizer_.init_master();
}

template <class Ops>
void ZeroEngine<Ops>::save_llmc(const typename GPT<Ops>::LlmcSink& sink) {
  // One unit at a time: the gatherer hands each unit whole (stage 3: gathered into a slot), the
  // model gives its tensors to the sink (at their places in the file).
  model_.save_llmc_units(sink, [&](int u) { return gatherer_.whole_unit(u); });
}

template <class Ops>
void ZeroEngine<Ops>::set_tracer(Tracer* t) {
  tr_ = t;
  reducer_.set_tracer(t);
  optimizer_.set_tracer(t);
  gatherer_.set_tracer(t);
  if (lookup_) lookup_->set_tracer(t);
  if constexpr (Ops::tier == Tier::host) Ops::tracer = t;  // the CPU backend's ops track (ops_cpu.h)
  traced_.reset(t ? new TracedHooks(hooks(), *t, micro_) : nullptr);
  model_.set_hooks(traced_ ? static_cast<UnitHooks*>(traced_.get()) : &hooks());
}

// ---- the step: gradients complete, norm, update, parameters back --------------------------------

template <class Ops>
void ZeroEngine<Ops>::begin_step(int64_t step) {
  // The first step's lookup, prepared and completed before the step's count starts.
  if (lookup_ && lookup_->begin_step(step)) params_ready();
  group_.begin_step(step);
  if (replicas_) replicas_->begin_step(step);
  reducer_.begin_step(optimizer_.take_grads_cleared());
}

template <class Ops>
void ZeroEngine<Ops>::begin_pass(int micro, bool with_backward) {
  micro_ = micro;
  if (lookup_) lookup_->begin_pass(micro, with_backward);
  reducer_.begin_pass(micro);
  gatherer_.begin_pass(with_backward);
}

template <class Ops>
void ZeroEngine<Ops>::finish_gradients() {
  TraceSpan s(tr_, "finish gradients", Tracer::kCompute);
  reducer_.finish();
}

template <class Ops>
double ZeroEngine<Ops>::grad_norm() {
  TraceSpan s(tr_, "grad norm", Tracer::kOptimizer);
  return optimizer_.grad_norm(reducer_.unit_sum_squares());
}

// The queue on the link after the update (stages 1-2, prepared lookup, overlap on):
//
//   comm thread | ids AG (prepared) | rows RS | AG u0 (embedding) ... AG u1 | AG u2 | ... |
//   training    | grad norm | AdamW | rows | fwd: lookup (waits RS) | block 0 (waits u1) | ...
//
// Without the preparation the lookup's two collectives would be issued by the forward, behind
// every all-gather, and the forward's first unit would wait for the whole embedding to cross.
template <class Ops>
void ZeroEngine<Ops>::optimizer_step(double lr, double grad_scale) {
  if (lookup_) lookup_->before_update();  // the next step's lookup: its token ids cross now
  {
    TraceSpan s(tr_, "adamw", Tracer::kOptimizer);
    const auto t0 = std::chrono::steady_clock::now();
    optimizer_.step(lr, grad_scale);
    last_update_s_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (tr_) s.args = "\"steps_taken\":" + std::to_string(optimizer_.steps_taken());
  }
  // With overlap only started here (waited in the next forward).
  TraceSpan s(rules_.gather_params ? tr_ : nullptr, "parameter all-gather", Tracer::kOptimizer);
  if (lookup_) lookup_->after_update();  // a prepared lookup's rows, from the updated shard
  gatherer_.after_optimizer_step();
}

// ---- hooks: stage 3 gathers around each use; the others progress what is in flight ----------

template <class Ops>
void ZeroEngine<Ops>::gather_or_progress(int u) {
  if (rules_.gather_units) {
    gatherer_.use(u);
    return;
  }
  if (gatherer_.params_pending()) gatherer_.wait_unit(u);  // stages 1-2: the last step's all-gather
  group_.test(CommHandle{});
}

template <class Ops>
void ZeroEngine<Ops>::before_forward(int u) {  // the lookup from the shards: the exchange's before_forward(0)
  if (head_by_rows_) {
    group_.test(CommHandle{});  // the head waits for its rows range by range (before_head_rows)
    return;
  }
  gather_or_progress(u);
}

template <class Ops>
void ZeroEngine<Ops>::after_forward(int u) {
  head_by_rows_ = false;
  if (rules_.gather_units) gatherer_.release(u);
}

// The embedding's all-gather after the update, still in flight at the LM head (it goes last,
// ParamGatherer::after_optimizer_step): the head's logits over this rank's own rows first, then
// over the other ranks' rows as the ring delivers them, instead of waiting for all of them.
template <class Ops>
std::vector<VocabRows> ZeroEngine<Ops>::head_rows(int u) {
  std::vector<VocabRows> order;
  if (!rules_.gather_units) order = gatherer_.head_rows(u);
  head_by_rows_ = !order.empty();
  return order;
}

template <class Ops>
void ZeroEngine<Ops>::before_head_rows(int u, int k) {
  gatherer_.wait_head_rows(u, k);
}

template <class Ops>
void ZeroEngine<Ops>::before_backward(int u) {
  if (final_.pending()) publish_final();
  gather_or_progress(u);
  in_backward_ = true;
}

template <class Ops>
void ZeroEngine<Ops>::before_grads(int u) {
  reducer_.before_grads(u);
  if (!in_backward_) group_.test(CommHandle{});  // gradients without parameters: the embedding's, last
}

template <class Ops>
void ZeroEngine<Ops>::grads_ready(int u) {
  reducer_.grads_ready(u);
  if (optimizer_.updates_in_backward()) {
    reducer_.complete_arrived();
    publish_final();
  }
  if (optimizer_.host_overlaps()) optimizer_.host()->progress();  // the CPU AdamW beside backward
}

template <class Ops>
void ZeroEngine<Ops>::update_args_known(double lr) {
  if (optimizer_.host_overlaps()) optimizer_.host_update_args(lr, 1.0);
  if (optimizer_.updates_in_backward()) {
    final_.reset(units_end_);
    optimizer_.start_update(lr);
    optimizer_.grads_final_from(final_.edge());
  }
}

template <class Ops>
void ZeroEngine<Ops>::publish_final() {
  if (final_.advance([this](uint64_t writes) { return reducer_.shard_written(writes); }))
    optimizer_.grads_final_from(final_.edge());
}

template <class Ops>
void ZeroEngine<Ops>::after_backward(int u) {
  in_backward_ = false;
  if (rules_.gather_units) gatherer_.release(u);
}

template class ZeroEngine<CpuOps<float>>;
#if ZT_HAVE_CUDA
template class ZeroEngine<CudaOps<float>>;
template class ZeroEngine<CudaOps<bf16>>;
#endif

}  // namespace zt
