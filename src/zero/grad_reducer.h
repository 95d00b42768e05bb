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
// Where complete() adds a bucket's result into my gradient shard, in memory, in a swap file
// (offload.params "nvme") or in pinned host memory (offload.params "cpu", CUDA backend), is
// zero/grad_shard_sink.h's (docs/design.md §3.6).
//
// The naive path (zero.overlap_comm false) waits on each collective where it starts, beside the
// overlapped one; Partition makes every unit its own bucket there.
//
// Replicas (hybrid sharding, zero/data_mesh.h): `comm` is the shard group; on the last micro-step
// each bucket's part of my gradient shard, once complete, is summed over the replicate group (an
// all-reduce started at once, so it crosses the slow link while backward goes on; stage 1: the
// whole shard in finish()). A shard is final, for on_shards_final, when its all-reduce is done.
//
// Deferred lookup (Partition::lookup_numel() > 0, zero/embedding_exchange.h): the embedding's
// LM-head gradient is reduced as a bucket while the blocks' backward runs; the exchange, having
// gathered every rank's lookup gradient, hands add_to_reduced_embedding() what to add where the
// embedding's reduction completes (stage 2: into my shard at once; stages 0-1: in finish()).
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "comm/comm.h"
#include "model/gpt.h"
#include "runtime/trace.h"
#include "zero/grad_shard_sink.h"
#include "zero/partition.h"
#include "zero/store.h"

namespace zt {

template <class Ops>
class GradReducer {
 public:
  using T = typename Ops::T;

  // replicas: the replicate group, or nullptr (one shard group).
  GradReducer(GPT<Ops>& model, const Partition& part, StateStore& store, Comm& comm, Comm* replicas = nullptr);

  // Zero the gradients this stage accumulates into (full ones: unless the optimizer's last step
  // left them zero, ShardedOptimizer::take_grads_cleared).
  void begin_step(bool full_grads_zero);
  // Before the micro-step's forward, whose loss the host reads: the last micro-step's reductions
  // that only the compute stream waited for are waited here (a hang becomes a timeout, not a
  // host stuck in the loss's copy).
  void begin_pass(int micro) {
    micro_ = micro;
    comm_.wait_all(ordered_);
  }
  void before_grads(int u);           // stages 2-3: the unit's gradients go to a staging slot
  void grads_ready(int u);            // fires the bucket whose last unit u is
  void finish();                      // every gradient collective done, shards complete
  // add(dst, lo, hi) adds to the reduced embedding gradient, dst holding the embedding unit's
  // elements [lo, hi) (all of it, or my shard), once its reduction is complete.
  using EmbeddingAdd = std::function<void(T* dst, size_t lo, size_t hi)>;
  void add_to_reduced_embedding(EmbeddingAdd add);
  // Per-unit sums of squares of the completed gradient shard when it is on disk, else nullptr.
  const std::vector<GradSquares>* unit_sum_squares() const { return shard_ ? shard_->unit_sum_squares() : nullptr; }
  void set_tracer(Tracer* t) { tr_ = t; }  // tags each collective with its bucket and unit
  // Called with a bucket's units when the last micro-step's reduction has made their gradient shard
  // final on this rank (stages 2-3, during backward): the host optimizer sends them to the host.
  void on_shards_final(std::function<void(const std::vector<int>&)> f) { on_final_ = std::move(f); }
  // A gradient shard on disk: the writes queued so far, and whether the first n are on disk
  // (without waiting; in memory: always). The optimizer step inside backward reads a bucket's
  // gradient only once the write queued for it is complete.
  uint64_t shard_writes_queued() const { return shard_ ? shard_->writes_queued() : 0; }
  bool shard_written(uint64_t n) { return !shard_ || shard_->written(n); }
  // The optimizer pipeline's pool is no longer idle during backward (the step inside it): a
  // bucket's write-back goes through the gradient read buffer alone.
  void leave_pool_to_optimizer() { shard_->keep_to_first_buffer(); }
  // Adds into the shard every bucket whose reduction has completed, oldest first, instead of when
  // its slot is next taken (without waiting): the step inside backward gets its gradients sooner.
  void complete_arrived();

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
  void complete(StagingSlot& s);
  void shard_final(int b);          // bucket b's gradient shard is complete on this rank
  bool replicas_arrived(bool wait);  // hands over the buckets whose replica sum is done; true if none left
  StagingSlot* take_slot();

  GPT<Ops>& model_;
  const ParamLayout& layout_;
  const Partition& part_;
  StateStore& store_;
  Comm& comm_;
  Comm* replicas_;  // the replicate group (nullptr: one shard group)
  StageRules rules_;
  int micro_ = 0;
  std::vector<CommHandle> inflight_;  // stages 0-1
  std::vector<CommHandle> ordered_;   // stages 2-3: completed for the compute stream, not yet waited on the host
  EmbeddingAdd lookup_add_;            // stages 0-1: to add in finish()

  std::vector<StagingSlot> slots_;
  StagingSlot s0_;  // a one-unit embedding's own (buf nullptr when the embedding is split)
  // The slot each bucket of the current micro-step accumulates into. Looked up by bucket, never by
  // searching the slots' `bucket` fields: with accumulation, a bucket's previous micro-step may still
  // be in flight in another slot, so two slots can hold the same bucket at once.
  std::vector<StagingSlot*> slot_of_bucket_;
  uint64_t slots_taken_ = 0;
  std::unique_ptr<GradShardSink<Ops>> shard_;  // stages 2-3: my gradient shard, wherever it lives
  std::vector<std::pair<CommHandle, int>> replica_sums_;  // (all-reduce, bucket) in flight, oldest first
  Tracer* tr_ = nullptr;
  std::function<void(const std::vector<int>&)> on_final_;
  void tag(int b, int unit) {  // the next collective's bucket and unit
    if (!tr_) return;
    tr_->tag_next("bucket", b);
    if (unit >= 0) tr_->tag_next("unit", unit);
  }
};

}  // namespace zt
