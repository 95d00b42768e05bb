// Parameter gathering (docs/design.md §3.4): every all-gather of parameters.
//
//   stages 1-2  after_optimizer_step(): each rank updated its shard of the full parameters in
//               place; all-gather them back, unit by unit. With overlap they are not waited
//               there: they run under the next forward (docs/design.md §3.4), each waited by
//               wait_unit(u) before unit u's first use (the comm thread starts them in issue order,
//               a few at a time, so the one forward needs first is not slowed by the others);
//               wait_all() before anything else reads the parameters (checkpoint, export, end of
//               run). Where the lookup reads the shards (zero/embedding_exchange.h), forward
//               needs the embedding only at the LM head: after_optimizer_step() gathers it last.
//   stage 3     units are gathered before use and released after. begin_pass() writes the
//               schedule of parameter uses for the pass (UnitHooks' order: forward E-1..0 (lookup),
//               blocks, final norm, 0..E-1 (LM head); backward E-1..0 (LM head), final norm, blocks
//               in reverse); consecutive uses of one unit share one gather (the head's last chunk).
//               Where a unit is gathered: use() (on demand) and prefetch() (up to prefetch_units
//               gathers ahead, into free slots); where it is released: release() after its last
//               consecutive use. use() orders the compute stream after the gather
//               (Comm::order_compute_after: an event wait on NCCL, the host goes on); the host
//               waits for those gathers at the end of the forward and of the pass (release()).
//               The naive path gathers on demand into a single slot. Slots are
//               sized by what they hold (Partition::gather_slot_numel): with the embedding in
//               block-sized chunks every slot fits the largest unit; a one-unit embedding fits only
//               slot 0. A unit takes the smallest free slot it fits; at most gather_slots() are
//               alive at once.
//   offload     where the shard is (memory, pinned host memory, a swap file) and how it reaches the
//               device is zero/param_shard_source.h's: start() asks it for the unit's shard where it
//               would have started the all-gather, and the all-gather starts when it is delivered,
//               at a later hook (use / release) where it is read or copied (docs/design.md §3.6).
//   any stage   whole_unit(): unit by unit, whole, for streaming the weights out (stage 3
//               gathers each into a slot: no rank ever holds the whole model).
#pragma once
#include <memory>
#include <vector>

#include "comm/comm.h"
#include "model/gpt.h"
#include "runtime/trace.h"
#include "zero/param_shard_source.h"
#include "zero/partition.h"
#include "zero/store.h"

namespace zt {

template <class Ops>
class ParamGatherer {
 public:
  using T = typename Ops::T;

  ParamGatherer(GPT<Ops>& model, const Partition& part, StateStore& store, Comm& comm);

  void begin_pass(bool with_backward);  // stage 3: the schedule of this pass
  void use(int u);                      // stage 3: unit u's parameters present for the next use
  void release(int u);                  // stage 3: after that use
  void after_optimizer_step();          // stages 1-2: all-gather the updated shards
  bool params_pending() const { return pending_ > 0; }  // stages 1-2, overlap
  void wait_unit(int u);                // stages 1-2: unit u's gather complete
  void wait_all();                      // stages 1-2: every gather complete (no-op when none pending)
  // Stages 1-2, overlap, one embedding unit u whose all-gather is in flight: its wte rows (row0
  // relative to the unit) in ranges, in the order the ring makes them whole (Comm::all_gather_arrived):
  // this rank's own rows first, then ranges of at most kHeadRangeElems elements; empty otherwise.
  // wait_head_rows(u, k): range k's rows are present (the unit stays pending for wait_unit).
  std::vector<VocabRows> head_rows(int u);
  void wait_head_rows(int u, int k);
  static constexpr size_t kHeadRangeElems = size_t(1) << 20, kHeadRanges = 16;
  // Unit u's full parameters, valid until the next call (collective at stage 3: gathered into
  // the first slot, between passes).
  const T* whole_unit(int u);

  // Tags each all-gather with its unit; stage 3 marks each release on the compute track.
  void set_tracer(Tracer* t) { tr_ = t; }

  // Largest number of gathered units that were alive at once.
  int max_alive() const { return max_alive_; }

 private:
  struct GatherSlot {
    T* buf = nullptr;
    size_t numel = 0;
    int unit = -1;
    int first = -1, last = -1;  // range of schedule positions served by this gather
    CommHandle h;
  };
  void start(int pos, GatherSlot& s);
  void launch_gather(int slot, const T* shard);  // the shard source's delivery: start the all-gather
  GatherSlot* free_slot_for(int u);  // smallest free slot that fits u; nullptr if none
  void prefetch();
  CommHandle gather(int u, const T* src, T* dst);

  GPT<Ops>& model_;
  const ParamLayout& layout_;
  const Partition& part_;
  StateStore& store_;
  Comm& comm_;
  StageRules rules_;
  std::vector<int> sched_;
  int forward_positions_ = 0;  // sched_'s first positions that are the forward's
  int pos_ = 0;
  std::vector<CommHandle> ordered_;  // gathers the compute stream waits for, not yet waited on the host
  std::vector<GatherSlot> slots_;
  // Stages 1-2 with overlap: the all-gather of each unit after the optimizer step (valid: not yet
  // waited); pending_: how many.
  std::vector<CommHandle> ag_;
  int pending_ = 0;
  std::vector<VocabRows> head_ranges_;  // head_rows' answer, computed once
  std::vector<size_t> head_need_;       // per range: elements of the gather that must have arrived
  int max_alive_ = 0;
  Tracer* tr_ = nullptr;
  std::unique_ptr<ParamShardSource<Ops>> shards_;  // stage 3: my parameter shard, for slot i
};

}  // namespace zt
