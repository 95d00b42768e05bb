// The sharded optimizer (docs/design.md §3.3): AdamW over the slices of the model-state store that
// this rank owns. Stage 0 owns everything; stages 1-3 own their shard of every unit, so the
// moments, master weights and gradient shard are the store's flat shard buffers and the
// parameters are either the full buffer (stages 1-2: my shard of it, in place) or the parameter
// shard (stage 3). Where a shard is updated: step() below. With the optimizer state in swap files
// (offload.optimizer "nvme", docs/design.md §3.6) the same update runs over sub-groups of the flat
// shard as offload::SwapPipeline reads, hands over and writes them back; with offload.params "nvme"
// (stage 3) the parameter and gradient shards are streamed beside them (the gradients read only).
#pragma once
#include <memory>
#include <type_traits>
#include <utility>
#include <vector>

#include "comm/comm.h"
#include "model/layout.h"
#include "offload/swap_pipeline.h"
#include "plan/plan.h"
#include "runtime/trace.h"
#include "zero/partition.h"
#include "zero/store.h"

namespace zt {

template <class Ops>
class ShardedOptimizer {
 public:
  using T = typename Ops::T;  // parameters and gradients
  using M = typename Ops::M;  // optimizer moments and master weights
  static constexpr bool kMixed = !std::is_same_v<T, M>;

  ShardedOptimizer(const ParamLayout& layout, const Partition& part, StateStore& store, Comm& comm,
                   const OptimSection& optim);

  // Master = the owned parameters, widened (exact: every bf16 value is an fp32 value). A no-op
  // unless the store keeps master weights (mixed precision).
  void init_master();
  // Global L2 norm of the reduced gradients (collective for stages 1-3). Stage 3 sums the squares
  // unit by unit, in unit order; unit_ss, when given, holds those per-unit sums already (the
  // gradient shard is in a swap file, and the reducer summed each unit as it completed it).
  double grad_norm(const std::vector<double>* unit_ss = nullptr);
  // One AdamW step on the owned slices; `steps_taken` (AdamW's t) counts from the TrainState.
  void step(double lr, double grad_scale);
  // Whether the last step() left the gradients it read zero (stage 0, in memory: AdamW clears them
  // in its own pass, so the next step needs no zeroing pass); false again once asked.
  bool take_grads_cleared() { return std::exchange(grads_cleared_, false); }
  int steps_taken() const { return steps_taken_; }
  void set_steps_taken(int t) { steps_taken_ = t; }
  // The swap pipeline when the state is offloaded, else nullptr.
  const offload::SwapPipeline* swap() const { return swap_.get(); }

  // The step inside backward (offload.overlap_update, docs/offload.md): at stage 3 on the CPU
  // backend with the state in swap files and optim.grad_clip 0 (no norm to wait for), the update
  // runs on a worker thread while backward still runs: start_update() at the start of the step
  // walks the shard's sub-groups from its end, each read once grads_final_from() has said its
  // gradient is final (backward finishes the shard from its end: the last blocks first, the
  // embedding last); step() then says all of it is and waits for the walk.
  bool updates_in_backward() const { return in_backward_; }
  void start_update(double lr);
  // The gradient shard is final, and on disk where it lives there, for flat elements [from, end).
  void grads_final_from(size_t from);
  ~ShardedOptimizer();

  // The CUDA backend's AdamW on the host, overlapped with backward (zero/host_optimizer.cpp; only
  // with offload.optimizer "cpu": the "nvme" pipeline streams the whole shard after backward).
  bool host_overlaps() const { return host_ && !swap_; }
  // Units whose gradient shard is final on the device (the reducer, last micro-step): their
  // shards start for the host now. Embedding units are left for step() (the deferred lookup
  // part of their gradient comes at the end of backward).
  void host_units_final(const std::vector<int>& units);
  // The update's arguments, known before backward ends (optim.grad_clip 0: no norm to wait for):
  // the CPU updates each unit as soon as its shard has arrived. step() must then get the same.
  void host_update_args(double lr, double grad_scale);
  // Called at each unit of backward: hands arrived units to the CPU, sends updated ones back.
  void host_progress();
  // run.trace: the CPU updates on their own track (Tracer::kHostOptimizer).
  void set_tracer(Tracer* t) { tr_ = t; }

 private:
  // The owned slice of unit u in each buffer (stage 0: the whole unit).
  T* params(int u) const;
  T* grads(int u) const;
  M* state(StateId id, int u) const;
  // AdamW on elements [lo, hi) of the flat shard, whose state for [base, ...) is in bufs.
  void step_flat(size_t lo, size_t hi, size_t base, M* const* bufs, double lr, double grad_scale);

  const ParamLayout& layout_;
  const Partition& part_;
  StateStore& store_;
  Comm& comm_;
  OptimSection optim_;
  StageRules rules_;
  int steps_taken_ = 0;
  bool grads_cleared_ = false;
  std::unique_ptr<offload::SwapPipeline> swap_;
  // Index in the pipeline's buffers of each swapped state, -1 where the state is in memory.
  int at_m_ = -1, at_v_ = -1, at_master_ = -1, at_param_ = -1, at_grad_ = -1;

  // The CUDA backend with offload.optimizer "cpu" / "nvme" (zero/host_optimizer.cpp): the CPU AdamW
  // updates host copies of my shard (StateId::host_params / host_grads), streamed per unit on a
  // copy stream of its own. With offload.params "cpu" (stage 3) the shards are in pinned memory
  // already (shards_on_host_): the CPU AdamW updates them in place, nothing crosses the bus here.
  bool host_ = false;
  bool shards_on_host_ = false;
  // offload.params "cpu" / "nvme" with the AdamW on the device: the parameter shard is pinned host
  // memory or a swap file, each unit's part staged through a device slot for its update
  // (staged_in / staged_out).
  bool params_staged_ = false;
  T* staged_in(int u);
  void staged_out(int u);
  // offload.params "nvme" with the AdamW on the device: the parameter shard's swap file, which
  // staged_in / staged_out read and write unit by unit (nullptr otherwise).
  offload::SwapFile* param_file_ = nullptr;
  struct ParamBlocks {
    T* blocks;     // the read buffer
    T* shard;      // unit u's shard in it
    size_t len;    // bytes: whole I/O blocks
    uint64_t at;   // their offset in the file
  };
  ParamBlocks param_blocks(int u) const;
  const T* read_param_blocks(int u);
  T* host_params() const;  // the shards the CPU AdamW reads and writes
  T* host_grads() const;
  struct HostCopies;                    // the copy stream, per-unit events, the CPU worker
  std::shared_ptr<HostCopies> copies_;  // shared_ptr: HostCopies is complete only there
  HostCopies& host_copies();
  void host_init_master();
  void host_step(double lr, double grad_scale);
  void host_update_unit(int u, double lr, double grad_scale, int t);  // the CPU AdamW of one unit
  void host_send(const std::vector<int>& units);  // their shards to the host, on the copy stream
  Tracer* tr_ = nullptr;

  bool in_backward_ = false;
  struct UpdateWorker;  // the thread, the gradient's final edge, its error
  std::unique_ptr<UpdateWorker> worker_;
  double worker_lr_ = 0;
  void join_update();
};

}  // namespace zt
