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
//             can be prepared ahead of the parameter all-gathers (prepare(), ZeroEngine::
//             optimizer_step): the ids cross before the update, the rows right after it.
//   backward  the model defers the lookup part of the embedding's gradient (stages 0-1 on the last
//             micro-step, stage 2 every micro-step), so the large LM-head part is reduced while
//             the blocks' backward runs; gather_gradient() all-gathers every rank's output gradient
//             and token ids, and add_gradient() adds every rank's lookup rows (and wpe) to the
//             reduced embedding gradient, or to my shard of it, in rank order: the same sums on
//             every rank. GradReducer calls both (where its embedding reduction is complete).
//
// One buffer (StateId::lookup_exchange) serves both: (N, max_tokens, C) rows or gradients, then
// (N, max_tokens) token ids as int32 bits (a collective only moves bytes); -1 marks unused positions.
#pragma once
#include <cstddef>
#include <vector>

#include "comm/comm.h"
#include "model/gpt.h"
#include "runtime/trace.h"
#include "zero/partition.h"
#include "zero/store.h"

namespace zt {

template <class Ops>
class EmbeddingExchange {
 public:
  using T = typename Ops::T;

  EmbeddingExchange(GPT<Ops>& model, const Partition& part, StateStore& store, Comm& comm);

  // ---- forward: the lookup from the shards (stages 1-2) ----
  // Before each pass: whether this pass's lookup comes from the shards, and whether its backward
  // defers the lookup gradient (set on the model).
  void begin_pass(int micro, bool with_backward);
  // The lookup from shards with overlap on: the next training forward's tokens (host memory, B*Tn)
  // may be prepared (the naive path keeps the lookup where the forward needs it).
  bool preparable() const;
  // Starts the token ids' all-gather now; after_update() starts the rows' reduce-scatter. Returns
  // false (and does nothing) where not preparable or a lookup is already under way.
  bool prepare(const int* tokens, int B, int Tn);
  void after_update();  // after the optimizer step: a prepared lookup's rows, from the updated shard
  // At before_forward(0): does this pass's lookup (a prepared one when its tokens match, else one
  // of its own) into the model's lookup output; false where this pass's lookup is the model's.
  bool forward_lookup();
  void wait();  // completes whatever is in flight (its rows stay for the forward)

  // ---- backward: the deferred lookup gradient ----
  void gather_gradient();  // collective: every rank's output gradient and token ids
  // Adds every rank's lookup rows to dst, which holds elements [lo, hi) of the embedding unit (all
  // of it, or my shard).
  void add_gradient(T* dst, size_t lo, size_t hi) const;

  void set_tracer(Tracer* t) { tr_ = t; }  // tags its collectives "lookup"

 private:
  void begin(const int* tokens, int B, int Tn);
  void start_rows();
  void finish(T* encoded);

  GPT<Ops>& model_;
  const ParamLayout& layout_;
  const Partition& part_;
  StateStore& store_;
  Comm& comm_;
  StageRules rules_;
  T* buf_ = nullptr;      // StateId::lookup_exchange
  size_t max_tokens_ = 0;  // positions per rank: lookup_numel / (C + 1)
  enum class Stage { idle, ids, rows } stage_ = Stage::idle;
  CommHandle h_;
  int B_ = 0, T_ = 0;                 // shape of the forward's lookup
  int grad_B_ = 0, grad_T_ = 0;       // shape of the gathered gradient
  bool lookup_pass_ = false;          // this pass's lookup comes from the shards
  bool lookup_done_ = false;
  std::vector<int> prepared_tokens_;  // prepare()'s tokens (empty: none prepared)
  int prepared_B_ = 0, prepared_T_ = 0;
  Tracer* tr_ = nullptr;
};

}  // namespace zt
