// Parameter gathering (docs/design.md §3.4): every all-gather of parameters.
//
//   stages 1-2  after_optimizer_step(): each rank updated its shard of the full parameters in
//               place; all-gather them back, unit by unit. With overlap they are not waited
//               there: they run under the next forward (docs/design.md §3.4), each waited by
//               wait_unit(u) before unit u's first use (the comm thread starts them in issue order,
//               a few at a time, so the one forward needs first is not slowed by the others);
//               wait_all() before anything else reads the parameters (checkpoint, export, end of
//               run). lookup_rows(): the forward's lookup without the whole embedding
//               (Partition::lookup_numel() > 0): the rows of the batch's tokens and wpe from every
//               rank's shard through one reduce-scatter, so that the embedding's gather is needed
//               only at the LM head, after the blocks: after_optimizer_step() then issues it last.
//               lookup_begin/start_rows/finish: the same lookup in steps, prepared for the next
//               step ahead of the parameter gathers (ZeroEngine::prepare_lookup).
//   stage 3     units are gathered before use and released after. begin_pass() writes the
//               schedule of parameter uses for the pass (UnitHooks' order: forward E-1..0 (lookup),
//               blocks, final norm, 0..E-1 (LM head); backward E-1..0 (LM head), final norm, blocks
//               in reverse); consecutive uses of one unit share one gather (the head's last chunk).
//               Where a unit is gathered: use() (on demand) and prefetch() (up to prefetch_units
//               gathers ahead, into free slots); where it is released: release() after its last
//               consecutive use. The naive path gathers on demand into a single slot. Slots are
//               sized by what they hold (Partition::gather_slot_numel): with the embedding in
//               block-sized chunks every slot fits the largest unit; a one-unit embedding fits only
//               slot 0. A unit takes the smallest free slot it fits; at most gather_slots() are
//               alive at once.
//   offload     with offload.params "nvme" (docs/design.md §3.6) the parameter shard is a swap file:
//               start() queues the read of the unit's shard (io_uring, O_DIRECT, into the slot's
//               read buffer in param_io) where it would have started the all-gather, and the
//               all-gather starts from the read buffer at the next hook (use / release), after
//               waiting for the read. Collectives must start in the same order on every rank, so
//               when a gather starts may depend only on the hook sequence, never on when a read
//               happens to finish: each queued read is gathered at the first hook after the one
//               that queued it (or at once, when the unit is needed now). A read thus overlaps one
//               unit's compute, and with prefetch_units >= 2 the all-gather another's.
//   any stage   for_each_unit(): unit by unit, whole, for streaming the weights out (stage 3
//               gathers each into a slot: no rank ever holds the whole model).
#pragma once
#include <deque>
#include <memory>
#include <vector>

#include "offload/uring.h"

#include "comm/comm.h"
#include "model/gpt.h"
#include "runtime/trace.h"
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
  // Stages 1-2 with Partition::lookup_numel() > 0: encoded (B, Tn, C) = wte[tokens] + wpe[t] from
  // the shards (tokens in the backend's memory), bit for bit the lookup's values. Collective.
  void lookup_rows(const int* tokens, int B, int Tn, T* encoded);
  // The same lookup in its three collective steps, so that it can be prepared ahead (ZeroEngine::
  // prepare_lookup): lookup_begin() starts the all-gather of every rank's token ids;
  // lookup_start_rows() waits for it, writes my shard's parts of every rank's rows and starts their
  // reduce-scatter; lookup_finish() waits for that and writes encoded. lookup_rows = all three.
  void lookup_begin(const int* tokens, int B, int Tn);
  void lookup_start_rows();
  void lookup_finish(T* encoded);
  bool lookup_started() const { return lk_stage_ != LookupStage::idle; }
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
    T* rbuf = nullptr;          // offload: the read buffer (whole blocks around the shard)
    const T* send = nullptr;    // offload: where in rbuf the unit's shard is
    int queued_at = -1;         // offload: the hook whose start() queued its read; -1 = no read pending
  };
  void start(int pos, GatherSlot& s);
  void launch_gather(GatherSlot& s, const T* src);
  // offload: queue the read of unit u's shard into rbuf under `tag`; returns where the shard will be.
  const T* read_shard(int u, T* rbuf, int tag);
  // offload: start the gathers of reads queued before this hook, and through `target` if given.
  void pump(GatherSlot* target);
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
  int pos_ = 0;
  std::vector<GatherSlot> slots_;
  // Stages 1-2 with overlap: the all-gather of each unit after the optimizer step (valid: not yet
  // waited); pending_: how many.
  std::vector<CommHandle> ag_;
  int pending_ = 0;
  // The lookup's progress (lookup_begin / lookup_start_rows / lookup_finish) and its collective.
  enum class LookupStage { idle, ids, rows } lk_stage_ = LookupStage::idle;
  CommHandle lk_h_;
  int lk_B_ = 0, lk_T_ = 0;
  int max_alive_ = 0;
  Tracer* tr_ = nullptr;
  offload::SwapFile* pfile_ = nullptr;     // the parameter shard's swap file (offload.params nvme)
  std::unique_ptr<offload::Uring> ring_;
  std::deque<GatherSlot*> reading_;        // slots whose read is queued, gather not started (in order)
  int hook_ = 0;                           // counts use() / release() calls
};

}  // namespace zt
