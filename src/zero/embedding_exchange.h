// The embedding-lookup exchange (docs/design.md §3.4): where Partition::lookup_numel() > 0 (stages
// 0-2, N > 1, CPU backend) the embedding's lookup moves rows and token ids between ranks instead
// of waiting for the whole embedding (hundreds of MB at GPT-2 sizes; the rows are a few MB).
//
//   forward   stages 1-2, first micro-step of every step: encoded = wte[tokens] + wpe[t] from the
//             shards. Every rank's token ids are all-gathered; each rank writes, for every rank's
//             positions, the parts of the rows in its own (updated) shard, zero elsewhere; one
//             reduce-scatter sums them (each element has one owner: the sum is exact). The
//             embedding's all-gather is then needed only at the LM head (ParamGatherer issues it
//             last). In three steps (begin / start_rows / finish) so that the next step's lookup
//             can be prepared ahead of the parameter all-gathers: the engine's optimizer_step
//             reads the next step's micro-step-0 tokens (StepTokens, given at assembly) and
//             starts the ids' all-gather before the update, the rows right after it.
//   backward  the model defers the lookup part of the embedding's gradient (stages 0-1 on the last
//             micro-step, stage 2 every micro-step), so the large LM-head part is reduced while
//             the blocks' backward runs; gather_gradient() all-gathers every rank's output gradient
//             and token ids, and add_gradient() adds every rank's lookup rows (and wpe) to the
//             reduced embedding gradient, or to my shard of it, in rank order: the same sums on
//             every rank. The first at the model's embedding_lookup_deferred hook, the second
//             where GradReducer's embedding reduction is complete (add_to_reduced_embedding).
//
// It is a UnitHooks decorator over the engine's hooks (as zero/traced_hooks.h is): before_forward(0)
// and embedding_lookup_deferred are its own, the rest pass through. It exists only for the host
// backend (Partition::lookup_numel() is 0 for device backends): make_embedding_exchange() builds
// it where lookup_numel() > 0, and the engine holds it as an optional EmbeddingLookup.
//
// One buffer (StateId::lookup_exchange) serves both: (N, max_tokens, C) rows or gradients, then
// (N, max_tokens) token ids as int32 bits (a collective only moves bytes); -1 marks unused positions.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "comm/comm.h"
#include "model/gpt.h"
#include "runtime/trace.h"
#include "zero/grad_reducer.h"
#include "zero/partition.h"
#include "zero/store.h"

namespace zt {

// Micro-step 0's input tokens of a training step: read(step, tokens) writes B*Tn of them (host
// memory). The training data loader, given at assembly (train/engine_assembly.cpp); without read
// no lookup is prepared (each forward looks its rows up itself).
struct StepTokens {
  int B = 0, Tn = 0;
  std::function<void(int64_t step, int* tokens)> read;
};

// What the engine sees of the exchange, beside the hooks it wraps.
class EmbeddingLookup : public UnitHooks {
 public:
  // Before each pass: whether this pass's lookup comes from the shards, and whether its backward
  // defers the lookup gradient (set on the model).
  virtual void begin_pass(int micro, bool with_backward) = 0;
  // At the start of each step; true where it prepared this step's lookup itself (the first step
  // this process runs: later ones are prepared by the step before), for the engine to wait on.
  virtual bool begin_step(int64_t step) = 0;
  // Around the optimizer step: before it, the next step's lookup is prepared (its token ids'
  // all-gather); after it, its rows' reduce-scatter starts from the updated shard.
  virtual void before_update() = 0;
  virtual void after_update() = 0;
  virtual void wait() = 0;  // completes whatever is in flight (its rows stay for the forward)
  virtual void set_tracer(Tracer* t) = 0;  // tags its collectives "lookup"
};

// The exchange where Partition::lookup_numel() > 0 (the host backend), else nullptr.
template <class Ops>
std::unique_ptr<EmbeddingLookup> make_embedding_exchange(UnitHooks& inner, GPT<Ops>& model, const Partition& part,
                                                         StateStore& store, Comm& comm, GradReducer<Ops>& reducer,
                                                         StepTokens step_tokens);

template <class Ops>
class EmbeddingExchange final : public EmbeddingLookup {
 public:
  using T = typename Ops::T;

  EmbeddingExchange(UnitHooks& inner, GPT<Ops>& model, const Partition& part, StateStore& store, Comm& comm,
                    GradReducer<Ops>& reducer, StepTokens step_tokens);

  void begin_pass(int micro, bool with_backward) override;
  bool begin_step(int64_t step) override;
  void before_update() override;
  void after_update() override;
  void wait() override;
  void set_tracer(Tracer* t) override { tr_ = t; }

  // UnitHooks: the lookup from the shards at before_forward(0), the deferred lookup gradient
  void before_forward(int u) override;
  void after_forward(int u) override { in_.after_forward(u); }
  std::vector<VocabRows> head_rows(int u) override { return in_.head_rows(u); }
  void before_head_rows(int u, int k) override { in_.before_head_rows(u, k); }
  void before_backward(int u) override { in_.before_backward(u); }
  void after_backward(int u) override { in_.after_backward(u); }
  void before_grads(int u) override { in_.before_grads(u); }
  void grads_ready(int u) override { in_.grads_ready(u); }
  void embedding_lookup_deferred() override;

 private:
  // ---- forward: the lookup from the shards (stages 1-2) ----
  // The lookup from shards with overlap on: the next training forward's tokens may be prepared (the
  // naive path keeps the lookup where the forward needs it).
  bool preparable() const;
  // Starts the token ids' all-gather now; after_update() starts the rows' reduce-scatter. Returns
  // false (and does nothing) where not preparable or a lookup is already under way.
  bool prepare(int64_t step);
  // At before_forward(0): does this pass's lookup (a prepared one when its tokens match, else one
  // of its own) into the model's lookup output; false where this pass's lookup is the model's.
  bool forward_lookup();
  void begin(const int* tokens, int B, int Tn);
  void start_rows();
  void finish(T* encoded);

  // ---- backward: the deferred lookup gradient ----
  void gather_gradient();  // collective: every rank's output gradient and token ids
  // Adds every rank's lookup rows to dst, which holds elements [lo, hi) of the embedding unit (all
  // of it, or my shard).
  void add_gradient(T* dst, size_t lo, size_t hi) const;

  UnitHooks& in_;
  GPT<Ops>& model_;
  const ParamLayout& layout_;
  const Partition& part_;
  StateStore& store_;
  Comm& comm_;
  GradReducer<Ops>& reducer_;
  StepTokens step_tokens_;
  StageRules rules_;
  T* buf_ = nullptr;      // StateId::lookup_exchange
  size_t max_tokens_ = 0;  // positions per rank: lookup_numel / (C + 1)
  enum class Stage { idle, ids, rows } stage_ = Stage::idle;
  CommHandle h_;
  int B_ = 0, T_ = 0;                 // shape of the forward's lookup
  int grad_B_ = 0, grad_T_ = 0;       // shape of the gathered gradient
  bool lookup_pass_ = false;          // this pass's lookup comes from the shards
  bool lookup_done_ = false;
  bool started_ = false;              // begin_step has run
  int64_t step_ = 0;                  // the step under way (begin_step)
  std::vector<int> prepared_tokens_;  // prepare()'s tokens (empty: none prepared)
  int prepared_B_ = 0, prepared_T_ = 0;
  Tracer* tr_ = nullptr;
};

}  // namespace zt
