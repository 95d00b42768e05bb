#include "zero/engine.h"

#include <algorithm>
#include <vector>

#include "backend/ops_cpu.h"
#if ZT_HAVE_CUDA
#include "backend/ops_cuda.h"
#endif
#include "runtime/error.h"
#include "zero/staged_comm.h"

namespace zt {

template <class Ops>
ZeroEngine<Ops>::ZeroEngine(GPT<Ops>& model, const Partition& part, StateStore& store, Comm& comm,
                            const OptimSection& optim)
    : model_(model), part_(part), store_(store), comm_(comm), rules_(part.rules()),
      reducer_(model, part, store, comm), gatherer_(model, part, store, comm),
      optimizer_(model.layout(), part, store, comm, optim) {
  ZT_ASSERT(comm.world() == part.config().world && comm.rank() == part.config().rank);
#if ZT_HAVE_CUDA
  // Device buffers reach MPI only through host staging, and bf16 ones only through a StagedComm
  // that knows they are bf16 (zero/comm_ptr.h).
  if constexpr (Ops::tier == Tier::device) {
    const auto* staged = dynamic_cast<const StagedComm*>(&comm);
    ZT_ASSERT(staged && staged->elem() == state_types_of<Ops>().param);
  }
#endif
  const ParamLayout& layout = model.layout();
  T* params = store.get<T>(StateId::params);
  T* grads = store.get<T>(StateId::grads);
  for (int u = 0; u < layout.num_units(); ++u) {
    const size_t off = layout.units()[size_t(u)].offset;
    model_.set_unit_params(u, params ? params + off : nullptr);
    model_.set_unit_grads(u, grads ? grads + off : nullptr);
  }
  model_.set_hooks(this);
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
    // Stage 3: my shard's ranges only (StateBuffer::holds), written where the shard keeps them.
    const StateBuffer& shard = store_.info(StateId::param_shard);
    T* dst = store_.get<T>(StateId::param_shard);
    using M = typename Ops::M;
    offload::SwapFile* file = store_.file(StateId::param_shard);  // offload.params nvme: write the file
    if (file && llmc_path.empty()) {
      // In pieces: the values depend only on (seed, tensor, element), and a tensor range of the
      // largest model would otherwise be a transient of its own (wte: V x C).
      constexpr size_t kPiece = size_t(1) << 22;
      size_t largest = 0;
      for (const TensorRange& r : shard.holds) largest = std::max(largest, r.count);
      std::vector<M> host(std::min(kPiece, largest));
      for (const TensorRange& r : shard.holds)
        for (size_t i = 0; i < r.count; i += kPiece) {
          const size_t n = std::min(kPiece, r.count - i);
          model_.init_gpt2_values(seed, r.tensor, r.offset + i, n, host.data());
          file->write_at(host.data(), n * sizeof(M), (r.at + i) * sizeof(T));
        }
    } else if (llmc_path.empty()) {
      std::vector<M> host;
      for (const TensorRange& r : shard.holds) {
        host.resize(r.count);
        model_.init_gpt2_values(seed, r.tensor, r.offset, r.count, host.data());
        GPT<Ops>::upload(dst + r.at, host.data(), r.count);
      }
    } else {
      model_.read_llmc(llmc_path, [&](int k, const M* values) {
        for (const TensorRange& r : shard.holds) {
          if (r.tensor != k) continue;
          if (file) file->write_at(values + r.offset, r.count * sizeof(M), r.at * sizeof(T));
          else GPT<Ops>::upload(dst + r.at, values + r.offset, r.count);
        }
      });
    }
  }
  optimizer_.init_master();
}

template <class Ops>
void ZeroEngine<Ops>::save_llmc(const std::string& path, bool writer) {
  // One unit at a time: the gatherer hands each unit whole (stage 3: gathered into a slot), the
  // model writes its tensors at their places in the file.
  model_.save_llmc_units(path, writer, [&](int u) { return gatherer_.whole_unit(u); });
}

template <class Ops>
void ZeroEngine<Ops>::begin_step(int64_t step) {
  comm_.begin_step(step);
  reducer_.begin_step();
}

template <class Ops>
void ZeroEngine<Ops>::set_tracer(Tracer* t) {
  tr_ = t;
  reducer_.set_tracer(t);
  gatherer_.set_tracer(t);
}

template <class Ops>
void ZeroEngine<Ops>::finish_gradients() {
  const double t0 = tr_ ? Tracer::now_us() : 0;
  reducer_.finish();
  if (tr_) tr_->complete("finish gradients", Tracer::kCompute, t0, Tracer::now_us() - t0);
}

template <class Ops>
double ZeroEngine<Ops>::grad_norm() {
  const double t0 = tr_ ? Tracer::now_us() : 0;
  const double norm = optimizer_.grad_norm(reducer_.unit_sum_squares());
  if (tr_) tr_->complete("grad norm", Tracer::kOptimizer, t0, Tracer::now_us() - t0);
  return norm;
}

template <class Ops>
void ZeroEngine<Ops>::begin_pass(int micro, bool with_backward) {
  micro_ = micro;
  model_.set_defer_lookup_grads(with_backward && reducer_.defer_lookup(micro));
  // Stages 1-2: the first micro-step of every optimizer step looks its rows up from the shards, so
  // the embedding's all-gather (still in flight from the last step) is needed only at the LM head.
  // Every step, the first one too, so that every step sends the same bytes.
  lookup_pass_ = with_backward && micro == 0 && rules_.gather_params && part_.lookup_numel() > 0;
  lookup_done_ = false;
  reducer_.begin_pass(micro);
  gatherer_.begin_pass(with_backward);
}

template <class Ops>
bool ZeroEngine<Ops>::prepare_lookup(const int* tokens, int B, int Tn) {
  // The naive path (overlap off) keeps the lookup where the forward needs it.
  if (!lookup_preparable() || gatherer_.lookup_started())
    return false;
  prepared_tokens_.assign(tokens, tokens + size_t(B) * size_t(Tn));
  prepared_B_ = B, prepared_T_ = Tn;
  gatherer_.lookup_begin(tokens, B, Tn);
  return true;
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
  if (!tr_) {
    optimizer_.step(lr, grad_scale);
    if (gatherer_.lookup_started()) gatherer_.lookup_start_rows();  // from the updated shard
    gatherer_.after_optimizer_step();
    return;
  }
  const double t0 = Tracer::now_us();
  optimizer_.step(lr, grad_scale);
  const double t1 = Tracer::now_us();
  tr_->complete("adamw", Tracer::kOptimizer, t0, t1 - t0, "\"steps_taken\":" + std::to_string(optimizer_.steps_taken()));
  if (gatherer_.lookup_started()) gatherer_.lookup_start_rows();
  gatherer_.after_optimizer_step();
  if (rules_.gather_params)  // with overlap only started here (waited in the next forward)
    tr_->complete("parameter all-gather", Tracer::kOptimizer, t1, Tracer::now_us() - t1);
}

// ---- hooks: stage 3 gathers around each use; the others progress what is in flight ----------

template <class Ops>
void ZeroEngine<Ops>::gather_or_progress(int u) {
  if (rules_.gather_units) {
    gatherer_.use(u);
    return;
  }
  if (gatherer_.params_pending()) gatherer_.wait_unit(u);  // stages 1-2: the last step's all-gather
  comm_.test(CommHandle{});
}

// Traced spans start after the hook's own work (a gather's wait, a staging slot's completion) and
// end before the next hook's: they are the unit's compute.
template <class Ops>
void ZeroEngine<Ops>::before_forward(int u) {
  if (u == 0 && lookup_pass_ && !lookup_done_) {
    lookup_done_ = true;
    const int B = model_.last_batch(), Tn = model_.last_seq_len();
    const int* tokens = model_.lookup_inputs();
    const bool prepared = !prepared_tokens_.empty() && B == prepared_B_ && Tn == prepared_T_ &&
                          std::equal(prepared_tokens_.begin(), prepared_tokens_.end(), tokens);
    if (!prepared_tokens_.empty()) {  // completed either way: the collectives are under way
      prepared_tokens_.clear();
      gatherer_.lookup_finish(model_.lookup_output());
    }
    if (!prepared) gatherer_.lookup_rows(tokens, B, Tn, model_.lookup_output());
    model_.lookup_given();
    comm_.test(CommHandle{});
  } else {
    gather_or_progress(u);
  }
  if (tr_) span_t0_ = Tracer::now_us();
}

template <class Ops>
void ZeroEngine<Ops>::after_forward(int u) {
  if (tr_)
    tr_->complete("fwd u" + std::to_string(u), Tracer::kCompute, span_t0_, Tracer::now_us() - span_t0_,
                  "\"unit\":" + std::to_string(u) + ",\"micro\":" + std::to_string(micro_));
  if (rules_.gather_units) gatherer_.release(u);
}

template <class Ops>
void ZeroEngine<Ops>::before_backward(int u) {
  gather_or_progress(u);
  in_backward_span_ = true;
  if (tr_) span_t0_ = Tracer::now_us();
}

template <class Ops>
void ZeroEngine<Ops>::before_grads(int u) {
  reducer_.before_grads(u);
  if (grads_opened_at_.size() <= size_t(u)) grads_opened_at_.resize(size_t(u) + 1, 0);
  grads_opened_at_[size_t(u)] = spans_closed_;
  // Gradients written without parameters (the embedding's, last) are a backward span of their own.
  grads_span_ = !in_backward_span_;
  if (grads_span_) comm_.test(CommHandle{});
  if (tr_) span_t0_ = Tracer::now_us();
}

template <class Ops>
void ZeroEngine<Ops>::grads_ready(int u) {
  if (grads_span_ && tr_) backward_span(u);
  if (!grads_span_ && !in_backward_span_ && tr_ && size_t(u) < grads_opened_at_.size() &&
      spans_closed_ - grads_opened_at_[size_t(u)] > 1) {
    span_t0_ = last_close_t_;
    backward_span(u);
  }
  grads_span_ = false;
  reducer_.grads_ready(u);
}

template <class Ops>
void ZeroEngine<Ops>::embedding_lookup_deferred() {
  const double t0 = tr_ ? Tracer::now_us() : 0;
  reducer_.lookup_deferred();
  if (tr_) tr_->complete("embedding lookup gradient", Tracer::kCompute, t0, Tracer::now_us() - t0);
}

template <class Ops>
void ZeroEngine<Ops>::backward_span(int u) {
  tr_->complete("bwd u" + std::to_string(u), Tracer::kCompute, span_t0_, Tracer::now_us() - span_t0_,
                "\"unit\":" + std::to_string(u) + ",\"micro\":" + std::to_string(micro_));
}

template <class Ops>
void ZeroEngine<Ops>::after_backward(int u) {
  if (tr_) backward_span(u);
  in_backward_span_ = false;
  ++spans_closed_;
  if (tr_) last_close_t_ = Tracer::now_us();
  if (rules_.gather_units) gatherer_.release(u);
}

template class ZeroEngine<CpuOps<float>>;
#if ZT_HAVE_CUDA
template class ZeroEngine<CudaOps<float>>;
template class ZeroEngine<CudaOps<bf16>>;
#endif

}  // namespace zt
