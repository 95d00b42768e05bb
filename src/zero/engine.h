// The ZeRO engine: one implementation for stages 0-3 (DESIGN ideas 3 and 4). It owns the sharded
// state (optimizer moments, gradient shard, stage-3 parameter shard, communication buffers), drives
// the model through its unit hooks, and runs the sharded optimizer step.
//
// Step anatomy (one optimizer step, A micro-steps; "RS" reduce-scatter, "AG" all-gather):
//
//   stage 0  fwd ─> bwd ──┬─ bucket k ready ─> all-reduce(k) ───┐            (last micro-step only)
//                         └─ ... ──────────────────────────────> wait all ─> AdamW(full) on every rank
//   stage 1  fwd ─> bwd ──┬─ bucket k ready ─> RS(k) into my gradient shard   (last micro-step only)
//                         └─ ... ─> wait all ─> AdamW(my shard) ─> AG(params, per unit)
//   stage 2  every micro-step: bucket k ready ─> RS(k) from a staging slot ─> += my gradient shard;
//            a full gradient buffer never exists; then AdamW(my shard) ─> AG(params)
//   stage 3  per unit: AG(u + 1 .. u + prefetch) in flight while u computes; release u after use;
//            backward re-gathers; RS gradients as in stage 2; AdamW(my shard); no final AG
//
// Overlap (zero.overlap_comm = true), drawn for backward with two staging slots:
//
//   compute  | bwd L+1 | bwd L | bwd L-1 | bwd L-2 | ... | bwd 0 (head+enc) |
//   comm     |         |  RS(bucket{L+1,L}) ───────────┐   |  RS(...)  | RS(0) | wait all
//                                 slot 0 busy ─────────┘ slot 1 ──────────...
//   Open MPI moves a non-blocking collective forward only inside MPI calls, so every hook calls
//   comm.test() to progress whatever is in flight between units of work.
//
// The naive path (overlap_comm = false): one collective per unit, started and waited on the spot,
// no prefetch. Kept for teaching and A/B.
#pragma once
#include <cstdint>
#include <type_traits>
#include <vector>

#include "comm/comm.h"
#include "model/gpt.h"
#include "plan/plan.h"
#include "zero/partition.h"

namespace zt {

template <class Ops>
class ZeroEngine : public UnitHooks {
 public:
  using T = typename Ops::T;  // parameters and gradients
  using M = typename Ops::M;  // optimizer moments and master weights
  static constexpr bool kMixed = !std::is_same_v<T, M>;

  // The model must have been built with full parameters iff stage <= 2 and full gradients iff
  // stage <= 1 (Partition::buffers lists what is whose). Parameters must be initialised through
  // init_parameters() below.
  ZeroEngine(GPT<Ops>& model, const Partition& part, Comm& comm, MemoryTracker& mem, const OptimSection& optim);
  ~ZeroEngine() override;

  // Random GPT-2 init or an llm.c file; every rank ends with the same parameters (or its shard).
  void init_parameters(uint64_t seed, const std::string& llmc_path);

  void begin_step(int64_t step);
  // Before each micro-step's forward (with_backward) or each evaluation / sampling forward.
  void begin_pass(int micro, bool with_backward);
  // After the last micro-step's backward: completes all gradient communication.
  void finish_gradients();
  double grad_norm();
  void optimizer_step(double lr, double grad_scale);

  // Full parameters into `out` (layout.total() elements), on every rank (collective).
  void gather_full_parameters(T* out);

  // Largest number of gathered (stage-3) units that were alive at once.
  int max_gathered_alive() const { return max_alive_; }

  // UnitHooks
  void before_forward(int u) override;
  void after_forward(int u) override;
  void before_backward(int u) override;
  void after_backward(int u) override;
  void grads_ready(int u) override;

 private:
  struct GatherSlot {
    T* buf = nullptr;
    int unit = -1;
    int first = -1, last = -1;  // range of schedule positions served by this gather
    CommHandle h;
  };
  struct StagingSlot {
    T* buf = nullptr;
    T* recv = nullptr;
    int bucket = -1;
    uint64_t taken = 0;  // when it was last assigned a bucket
    std::vector<CommHandle> hs;
  };

  T* unit_full_params(int u);
  void use_unit(int u);      // stage 3: make unit u's parameters present for schedule position pos_
  void release_unit(int u);  // stage 3: after the use at pos_
  void start_gather(int pos, GatherSlot& s);
  void prefetch();
  void launch_bucket(int b);
  void complete_staging(StagingSlot& s);
  void progress() { comm_.test(CommHandle{}); }
  void init_master();

  GPT<Ops>& model_;
  const ParamLayout& layout_;
  const Partition& part_;
  Comm& comm_;
  OptimSection optim_;
  int stage_, world_, micro_ = 0, accum_ = 1, steps_taken_ = 0;
  bool overlap_, backward_pass_ = false;

  Allocation param_shard_, grad_shard_, m_, v_, g0_, staging_, recv_, gathered_;
  Allocation master_;  // (my parameters) fp32 master weights, mixed precision only
  std::vector<CommHandle> inflight_;  // stage 0/1 gradient collectives, param all-gathers

  // stage 3 schedule of unit uses for the current pass, and the slots
  std::vector<int> sched_;
  int pos_ = 0;
  std::vector<GatherSlot> gslots_;
  int max_alive_ = 0;

  // stages 2-3 gradient staging
  std::vector<StagingSlot> sslots_;
  StagingSlot s0_;  // the embedding's own
  // The slot each bucket of the current micro-step accumulates into. Looked up by bucket, never by
  // searching the slots' `bucket` fields: with accumulation, a bucket's previous micro-step may still
  // be in flight in another slot, so two slots can hold the same bucket at once.
  std::vector<StagingSlot*> slot_of_bucket_;
  uint64_t slots_taken_ = 0;
  bool head_seen_ = false;
};

}  // namespace zt
