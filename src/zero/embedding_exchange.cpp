#include "zero/embedding_exchange.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <utility>

#include "backend/ops_cpu.h"
#if ZT_HAVE_CUDA
#include "backend/ops_cuda.h"
#endif
#include "comm/comm_ptr.h"

namespace zt {

template <class Ops>
std::unique_ptr<EmbeddingLookup> make_embedding_exchange(UnitHooks& inner, GPT<Ops>& model, const Partition& part,
                                                         StateStore& store, Comm& comm, GradReducer<Ops>& reducer,
                                                         StepTokens step_tokens) {
  if constexpr (Ops::tier == Tier::host) {
    if (part.lookup_numel() > 0)
      return std::make_unique<EmbeddingExchange<Ops>>(inner, model, part, store, comm, reducer, std::move(step_tokens));
  }
  return nullptr;  // Partition::lookup_numel() is 0 for device backends
}

template <class Ops>
EmbeddingExchange<Ops>::EmbeddingExchange(UnitHooks& inner, GPT<Ops>& model, const Partition& part, StateStore& store,
                                          Comm& comm, GradReducer<Ops>& reducer, StepTokens step_tokens)
    : in_(inner), model_(model), layout_(model.layout()), part_(part), store_(store), comm_(comm), reducer_(reducer),
      step_tokens_(std::move(step_tokens)), rules_(part.rules()) {
  buf_ = store.get<T>(StateId::lookup_exchange);
  max_tokens_ = part.lookup_numel() / (size_t(layout_.config().C) + 1);
}

template <class Ops>
void EmbeddingExchange<Ops>::begin_pass(int micro, bool with_backward) {
  const bool active = part_.lookup_numel() > 0;
  model_.set_defer_lookup_grads(with_backward && active &&
                                (rules_.staged_grads || micro == part_.config().grad_accum - 1));
  // Stages 1-2: the first micro-step of every optimizer step looks its rows up from the shards, so
  // the embedding's all-gather (still in flight from the last step) is needed only at the LM head.
  // Every step, the first one too, so that every step sends the same bytes.
  lookup_pass_ = with_backward && micro == 0 && rules_.gather_params && active;
  lookup_done_ = false;
}

template <class Ops>
bool EmbeddingExchange<Ops>::preparable() const {
  return rules_.gather_params && part_.lookup_numel() > 0 && part_.config().overlap && step_tokens_.read;
}

// Stages 1-2 with overlap: each step's lookup is prepared ahead of the parameter all-gathers by the
// step before (before_update), the first one at its begin_step; the last step prepares one that no
// forward uses, so that every step sends the same bytes.
template <class Ops>
bool EmbeddingExchange<Ops>::begin_step(int64_t step) {
  step_ = step;
  if (started_) return false;
  started_ = true;
  return prepare(step);
}

template <class Ops>
void EmbeddingExchange<Ops>::before_update() {
  prepare(step_ + 1);
}

template <class Ops>
bool EmbeddingExchange<Ops>::prepare(int64_t step) {
  if (!preparable()) return false;  // no batch loaded for nothing
  const int B = step_tokens_.B, Tn = step_tokens_.Tn;
  std::vector<int> tokens(size_t(B) * size_t(Tn));
  step_tokens_.read(step, tokens.data());
  if (stage_ != Stage::idle) return false;
  prepared_tokens_ = std::move(tokens);
  prepared_B_ = B, prepared_T_ = Tn;
  begin(prepared_tokens_.data(), B, Tn);
  return true;
}

template <class Ops>
void EmbeddingExchange<Ops>::after_update() {
  if (stage_ == Stage::ids) start_rows();
}

template <class Ops>
bool EmbeddingExchange<Ops>::forward_lookup() {
  if (!lookup_pass_ || lookup_done_) return false;
  lookup_done_ = true;
  const int B = model_.last_batch(), Tn = model_.last_seq_len();
  const int* tokens = model_.lookup_inputs();
  const bool prepared = !prepared_tokens_.empty() && B == prepared_B_ && Tn == prepared_T_ &&
                        std::equal(prepared_tokens_.begin(), prepared_tokens_.end(), tokens);
  if (!prepared_tokens_.empty()) {  // completed either way: the collectives are under way
    prepared_tokens_.clear();
    finish(model_.lookup_output());
  }
  if (!prepared) {
    begin(tokens, B, Tn);
    start_rows();
    finish(model_.lookup_output());
  }
  model_.lookup_given();
  return true;
}

template <class Ops>
void EmbeddingExchange<Ops>::before_forward(int u) {
  if (u == 0 && forward_lookup()) comm_.test(CommHandle{});  // the lookup from the shards
  else in_.before_forward(u);
}

template <class Ops>
void EmbeddingExchange<Ops>::embedding_lookup_deferred() {
  gather_gradient();
  reducer_.add_to_reduced_embedding([this](T* dst, size_t lo, size_t hi) { add_gradient(dst, lo, hi); });
}

template <class Ops>
void EmbeddingExchange<Ops>::wait() {
  if (stage_ == Stage::ids) start_rows();
  if (stage_ == Stage::rows) {
    comm_.wait(h_);
    h_ = CommHandle{};
  }
}

template <class Ops>
void EmbeddingExchange<Ops>::begin(const int* tokens, int B, int Tn) {
  ZT_ASSERT(stage_ == Stage::idle);
  const size_t C = size_t(layout_.config().C), N = size_t(part_.config().world);
  const size_t rank = size_t(part_.config().rank), n = size_t(B) * size_t(Tn);
  ZT_ASSERT(n <= max_tokens_);
  int32_t* ids = reinterpret_cast<int32_t*>(buf_ + N * max_tokens_ * C);  // after the rows
  int32_t* mine = ids + rank * max_tokens_;
  std::memcpy(mine, tokens, n * sizeof(int32_t));
  for (size_t i = n; i < max_tokens_; ++i) mine[i] = -1;
  if (tr_) tr_->tag_next("lookup", 1);
  h_ = comm_.all_gather(comm_ptr(reinterpret_cast<T*>(mine)), comm_ptr(reinterpret_cast<T*>(ids)), max_tokens_);
  B_ = B, T_ = Tn, stage_ = Stage::ids;
}

template <class Ops>
void EmbeddingExchange<Ops>::start_rows() {
  ZT_ASSERT(stage_ == Stage::ids);
  const size_t C = size_t(layout_.config().C), N = size_t(part_.config().world);
  const size_t rank = size_t(part_.config().rank);
  const int32_t* ids = reinterpret_cast<const int32_t*>(buf_ + N * max_tokens_ * C);
  comm_.wait(h_);
  // My shard's parts of wte[token] and wpe[t] for every rank's positions, zero elsewhere.
  const T* P = store_.get<T>(StateId::params) + layout_.units()[0].offset;
  const size_t lo = part_.unit_shard_begin(0), hi = lo + part_.unit_shard_numel(0);
  const size_t wpe = layout_.slot(ParamId::wpe).offset - layout_.units()[0].offset;
  for (size_t r = 0; r < N; ++r)
    for (size_t i = 0; i < max_tokens_; ++i) {
      T* out = buf_ + (r * max_tokens_ + i) * C;
      const int32_t tk = ids[r * max_tokens_ + i];
      if (tk < 0) {
        std::memset(out, 0, C * sizeof(T));
        continue;
      }
      const size_t w = size_t(tk) * C, p = wpe + (i % size_t(T_)) * C;
      for (size_t c = 0; c < C; ++c) {
        const bool ow = w + c >= lo && w + c < hi, op = p + c >= lo && p + c < hi;
        out[c] = ow && op ? P[w + c] + P[p + c] : ow ? P[w + c] : op ? P[p + c] : T(0);
      }
    }
  if (tr_) tr_->tag_next("lookup", 1);
  h_ = comm_.reduce_scatter(comm_ptr(buf_), comm_ptr(buf_ + rank * max_tokens_ * C), max_tokens_ * C);
  stage_ = Stage::rows;
}

template <class Ops>
void EmbeddingExchange<Ops>::finish(T* encoded) {
  if (stage_ == Stage::ids) start_rows();
  ZT_ASSERT(stage_ == Stage::rows);
  const size_t C = size_t(layout_.config().C), rank = size_t(part_.config().rank);
  comm_.wait(h_);
  h_ = CommHandle{};
  std::memcpy(encoded, buf_ + rank * max_tokens_ * C, size_t(B_) * size_t(T_) * C * sizeof(T));
  stage_ = Stage::idle;
}

template <class Ops>
void EmbeddingExchange<Ops>::gather_gradient() {
  const size_t C = size_t(layout_.config().C), slice = part_.lookup_numel();
  grad_B_ = model_.last_batch();
  grad_T_ = model_.last_seq_len();
  const size_t n = size_t(grad_B_) * size_t(grad_T_);
  ZT_ASSERT(n <= max_tokens_ && buf_);
  // My slice: the gradient of the embedding's output, then the token ids.
  T* mine = buf_ + size_t(part_.config().rank) * slice;
  std::memcpy(mine, model_.lookup_grad_out(), n * C * sizeof(T));
  int32_t* ids = reinterpret_cast<int32_t*>(mine + max_tokens_ * C);
  std::memcpy(ids, model_.lookup_inputs(), n * sizeof(int32_t));
  for (size_t i = n; i < max_tokens_; ++i) ids[i] = -1;
  if (tr_) tr_->tag_next("lookup", 1);
  CommHandle h = comm_.all_gather(comm_ptr(mine), comm_ptr(buf_), slice);
  comm_.wait(h);
}

template <class Ops>
void EmbeddingExchange<Ops>::add_gradient(T* dst, size_t lo, size_t hi) const {
  const size_t C = size_t(layout_.config().C), slice = part_.lookup_numel();
  const size_t wpe = layout_.slot(ParamId::wpe).offset - layout_.units()[0].offset;  // within the unit
  const size_t n = size_t(grad_B_) * size_t(grad_T_);
  auto add_row = [&](size_t at, const T* g) {  // unit elements [at, at + C) += g, clipped to [lo, hi)
    const size_t a = std::max(at, lo), b = std::min(at + C, hi);
    for (size_t x = a; x < b; ++x) dst[x - lo] += g[x - at];
  };
  for (int r = 0; r < part_.config().world; ++r) {
    const T* slice_r = buf_ + size_t(r) * slice;
    const int32_t* ids = reinterpret_cast<const int32_t*>(slice_r + max_tokens_ * C);
    for (size_t i = 0; i < n; ++i) {
      if (ids[i] < 0) continue;
      const T* g = slice_r + i * C;
      add_row(size_t(ids[i]) * C, g);                 // wte[token]
      add_row(wpe + (i % size_t(grad_T_)) * C, g);    // wpe[position]
    }
  }
}

template class EmbeddingExchange<CpuOps<float>>;
template std::unique_ptr<EmbeddingLookup> make_embedding_exchange(UnitHooks&, GPT<CpuOps<float>>&, const Partition&,
                                                                  StateStore&, Comm&, GradReducer<CpuOps<float>>&,
                                                                  StepTokens);
#if ZT_HAVE_CUDA
template std::unique_ptr<EmbeddingLookup> make_embedding_exchange(UnitHooks&, GPT<CudaOps<float>>&, const Partition&,
                                                                  StateStore&, Comm&, GradReducer<CudaOps<float>>&,
                                                                  StepTokens);
template std::unique_ptr<EmbeddingLookup> make_embedding_exchange(UnitHooks&, GPT<CudaOps<bf16>>&, const Partition&,
                                                                  StateStore&, Comm&, GradReducer<CudaOps<bf16>>&,
                                                                  StepTokens);
#endif

}  // namespace zt
