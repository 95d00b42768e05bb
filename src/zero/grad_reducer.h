// Gradient reduction (docs/design.md §3.4): buckets, staging slots, overlap. Where a bucket fires:
// grads_ready() when the bucket's last unit (in backward order) is complete, -> launch().
//
//   stage 0  full gradients; on the last micro-step, all-reduce(bucket) in place
//   stage 1  full gradients; on the last micro-step, reduce-scatter(unit) into my gradient shard
//   stages 2-3  every micro-step: before_backward() points the bucket's units at a staging slot;
//            launch() reduce-scatters it into the slot's receive buffer; complete() adds that to my
//            gradient shard. Two slots with overlap (one filling while the other is in flight), one
//            without; a one-unit embedding (stages 2-3 when not split, far larger than a bucket) has
//            a slot of its own; stage 3's block-sized embedding chunks use the bucket slots.
//
// With offload.params "nvme" (stage 3, docs/design.md §3.6) the gradient shard is a swap file:
// complete() adds a bucket's reduce-scatter result into the blocks of the file that hold its shard
// (read, add, write, synchronously, through param_io's gradient buffer; the first micro-step reads
// only the two edge blocks it shares with its neighbours) and, on the last micro-step, sums each
// unit's squares for the gradient norm while the values are in memory.
//
// The naive path (zero.overlap_comm false) waits on each collective where it starts, beside the
// overlapped one; Partition makes every unit its own bucket there.
//
// Deferred lookup (Partition::lookup_numel() > 0: stages 0-2, N > 1, CPU backend; stages 0-1 on
// the last micro-step only, the others accumulate locally): the model writes the embedding's
// LM-head gradient first, so its bucket is reduced while the blocks' backward runs, and leaves the
// lookup part to lookup_deferred(): every rank's output gradient and token ids are all-gathered
// (a few MB, against the embedding's hundreds) and each rank adds every rank's lookup rows (and
// wpe) to the reduced embedding gradient, or to its shard of it, in rank order: the same sums on
// every rank.
#pragma once
#include <cstdint>
#include <vector>

#include "comm/comm.h"
#include "model/gpt.h"
#include "runtime/trace.h"
#include "zero/partition.h"
#include "zero/store.h"

namespace zt {

template <class Ops>
class GradReducer {
 public:
  using T = typename Ops::T;

  GradReducer(GPT<Ops>& model, const Partition& part, StateStore& store, Comm& comm);

  void begin_step();                  // zero the gradients this stage accumulates into
  void begin_pass(int micro) { micro_ = micro; }
  void before_grads(int u);           // stages 2-3: the unit's gradients go to a staging slot
  void grads_ready(int u);            // fires the bucket whose last unit u is
  void finish();                      // every gradient collective done, shards complete
  bool defer_lookup(int micro) const;  // this micro-step's backward defers the lookup gradient
  void lookup_deferred();             // the model's UnitHooks::embedding_lookup_deferred
  // Per-unit sums of squares of the completed gradient shard when it is on disk, else nullptr.
  const std::vector<double>* unit_sum_squares() const { return gfile_ ? &unit_ss_ : nullptr; }
  void set_tracer(Tracer* t) { tr_ = t; }  // tags each collective with its bucket and unit

 private:
  struct StagingSlot {
    T* buf = nullptr;
    T* recv = nullptr;
    int bucket = -1;
    uint64_t taken = 0;  // when it was last assigned a bucket
    int micro = 0;       // the micro-step its bucket was launched in (complete() may come a micro-step later)
    std::vector<CommHandle> hs;
  };
  void launch(int b);
  // Adds every rank's lookup gradient (all-gathered in exchange_) to dst, which holds elements
  // [lo, hi) of the embedding unit (all of it, or my shard).
  void add_lookup(T* dst, size_t lo, size_t hi) const;
  void complete(StagingSlot& s);
  void add_to_file(const Bucket& bk, const T* recv, int micro);  // the gradient shard on disk
  StagingSlot* take_slot();

  GPT<Ops>& model_;
  const ParamLayout& layout_;
  const Partition& part_;
  StateStore& store_;
  Comm& comm_;
  StageRules rules_;
  int micro_ = 0;
  std::vector<CommHandle> inflight_;  // stages 0-1
  T* exchange_ = nullptr;             // (N, lookup_numel): per rank (B, T, C) gradient, then (B, T) token ids
  int lookup_B_ = 0, lookup_T_ = 0;   // shape of the exchanged micro-step
  bool lookup_pending_ = false;       // stages 0-1: gathered, to add in finish()

  std::vector<StagingSlot> slots_;
  StagingSlot s0_;  // a one-unit embedding's own (buf nullptr when the embedding is split)
  // The slot each bucket of the current micro-step accumulates into. Looked up by bucket, never by
  // searching the slots' `bucket` fields: with accumulation, a bucket's previous micro-step may still
  // be in flight in another slot, so two slots can hold the same bucket at once.
  std::vector<StagingSlot*> slot_of_bucket_;
  uint64_t slots_taken_ = 0;
  offload::SwapFile* gfile_ = nullptr;  // the gradient shard's swap file (offload.params nvme)
  T* gbuf_ = nullptr;                   // (param_io) a bucket's gradient shard, in whole blocks
  std::vector<double> unit_ss_;         // (units) sum of squares of each unit's gradient shard
  Tracer* tr_ = nullptr;
  void tag(int b, int unit) {  // the next collective's bucket and unit
    if (!tr_) return;
    tr_->tag_next("bucket", b);
    if (unit >= 0) tr_->tag_next("unit", unit);
  }
};

}  // namespace zt
