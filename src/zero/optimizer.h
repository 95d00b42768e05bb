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
#include "zero/grad_squares.h"
#include "zero/host_optimizer.h"
#include "zero/partition.h"
#include "zero/shard_view.h"
#include "zero/store.h"
#include "zero/update_in_backward.h"

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
  // gradient shard is off the device or in a swap file, and the reducer summed each unit as it
  // completed it).
  double grad_norm(const std::vector<GradSquares>* unit_ss = nullptr);
  // Tensor parallelism (docs/design.md §3.13): the norm also sums over this group, each split
  // tensor's squares from every tensor rank and each replicated one's once. Not owned.
  void set_tensor_group(Comm* tensor) { tensor_ = tensor; }
  // Pipeline parallelism (docs/design.md §3.14): the norm also sums over the pipeline group, every
  // stage its own units but the embedding, which the first stage counts (the last holds the same
  // summed gradient of it: the tied head's). Not owned.
  void set_pipeline_group(Comm* pipe, bool counts_embedding) {
    pipe_ = pipe;
    counts_embedding_ = counts_embedding;
  }
  // What this rank holds of unit u's reduced gradient after the gradients are complete: the whole
  // unit (stage 0) or its shard (stage 1), and how many elements.
  T* reduced_grads(int u) const { return grads(u); }
  size_t reduced_grads_numel(int u) const {
    return rules_.optimizer_sharded ? part_.unit_shard_numel(u) : layout_.units()[size_t(u)].padded;
  }
  // One AdamW step on the owned slices; `steps_taken` (AdamW's t) counts from the TrainState.
  void step(double lr, double grad_scale);
  // Whether the last step() left the gradients it read zero (stage 0, in memory: AdamW clears them
  // in its own pass, so the next step needs no zeroing pass); false again once asked.
  bool take_grads_cleared() { return std::exchange(grads_cleared_, false); }
  int steps_taken() const { return steps_taken_; }
  void set_steps_taken(int t) { steps_taken_ = t; }

  // The step inside backward (offload.overlap_update, zero/update_in_backward.h): at stage 3 on the
  // CPU backend with the state in swap files and optim.grad_clip 0, start_update() at the start of
  // the step starts the walk over the shard's sub-groups; grads_final_from() says how far backward
  // has made the gradient final; step() then says all of it is and waits for the walk.
  bool updates_in_backward() const { return updates_in_backward_; }
  void start_update(double lr);
  // The gradient shard is final, and on disk where it lives there, for flat elements [from, end).
  void grads_final_from(size_t from);

  // The CUDA backend's AdamW on the host (zero/host_optimizer.h), nullptr otherwise. The engine
  // feeds it the units whose gradient shards are final while backward runs (when it overlaps()).
  HostOptimizer<Ops>* host() { return host_.get(); }
  bool host_overlaps() const { return host_ && host_->overlaps(); }
  // The update's arguments, known before backward ends (optim.grad_clip 0): for the host AdamW.
  void host_update_args(double lr, double grad_scale) { host_->update_args(lr, grad_scale, steps_taken_ + 1); }
  // run.trace: the CPU updates on their own track (Tracer::kHostOptimizer).
  void set_tracer(Tracer* t);

 private:
  // The owned slice of unit u in each buffer (stage 0: the whole unit).
  T* params(int u) const { return shard_.params(u); }
  T* grads(int u) const { return shard_.grads(u); }
  M* state(StateId id, int u) const { return shard_.state(id, u); }
  // AdamW on elements [lo, hi) of the flat shard, whose state for [base, ...) is in bufs.
  void step_flat(size_t lo, size_t hi, size_t base, M* const* bufs, double lr, double grad_scale);

  const ParamLayout& layout_;
  const Partition& part_;
  Comm* tensor_ = nullptr;
  Comm* pipe_ = nullptr;
  bool counts_embedding_ = true;
  StateStore& store_;
  Comm& comm_;
  OptimSection optim_;
  StageRules rules_;
  ShardView<Ops> shard_;
  int steps_taken_ = 0;
  bool grads_cleared_ = false;
  std::unique_ptr<offload::SwapPipeline> swap_;
  SwapSlots at_;

  // The CUDA backend with offload.optimizer "cpu" / "nvme": the whole update is the host AdamW's.
  std::unique_ptr<HostOptimizer<Ops>> host_;
  // offload.params "cpu" / "nvme" with the AdamW on the device: the parameter shard is pinned host
  // memory or a swap file, each unit's part staged through a device slot for its update
  // (params_on_device / params_back).
  bool params_off_device_ = false;
  T* params_on_device(int u);
  void params_back(int u);
  // offload.params "nvme" with the AdamW on the device: the parameter shard's swap file, which
  // params_on_device / params_back read and write unit by unit (nullptr otherwise).
  offload::SwapFile* param_file_ = nullptr;
  struct ParamBlocks {
    T* blocks;     // the read buffer
    T* shard;      // unit u's shard in it
    size_t len;    // bytes: whole I/O blocks
    uint64_t at;   // their offset in the file
  };
  ParamBlocks param_blocks(int u) const;
  const T* read_param_blocks(int u);
  Tracer* tr_ = nullptr;

  bool updates_in_backward_ = false;
  std::unique_ptr<UpdateInBackward> update_;  // this step's, between start_update and step
  double update_lr_ = 0;
};

}  // namespace zt
