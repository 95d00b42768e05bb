// The CUDA backend's AdamW on the host (offload.optimizer "cpu" / "nvme", docs/design.md §3.6): a
// strategy beside ShardedOptimizer, which hands it the whole update when the store keeps the
// optimizer state in host memory (or swap files). How it overlaps backward: host_optimizer.cpp.
#pragma once
#include <memory>
#include <type_traits>
#include <vector>

#include "offload/swap_pipeline.h"
#include "plan/plan.h"
#include "runtime/trace.h"
#include "zero/shard_view.h"

namespace zt {

template <class Ops>
class HostOptimizer {
 public:
  using T = typename Ops::T;
  using M = typename Ops::M;
  static constexpr bool kMixed = !std::is_same_v<T, M>;

  // shards_on_host: offload.params "cpu" / "nvme" (stage 3): the parameter and gradient shards are
  // pinned memory (or streamed from their swap files) already, and the CPU updates them in place;
  // otherwise it updates host copies of my shard (StateId::host_params / host_grads). swap: the
  // pipeline over the swapped states (offload.optimizer "nvme"), else nullptr.
  HostOptimizer(const ShardView<Ops>& shard, const OptimSection& optim, bool shards_on_host,
                offload::SwapPipeline* swap, SwapSlots at);
  ~HostOptimizer();

  // Whether the update overlaps backward (offload.optimizer "cpu": the "nvme" pipeline streams the
  // whole shard after backward).
  bool overlaps() const { return !swap_; }
  // Master = my shard of the parameters, widened (mixed precision only).
  void init_master();
  // Units whose gradient shard is final on the device (the reducer, last micro-step): their
  // shards start for the host now. Embedding units are left for step() (the deferred lookup
  // part of their gradient comes at the end of backward).
  void units_final(const std::vector<int>& units);
  // The update's arguments, known before backward ends (optim.grad_clip 0: no norm to wait for):
  // the CPU updates each unit as soon as its shard has arrived. step() must then get the same.
  // t: AdamW's step of this update.
  void update_args(double lr, double grad_scale, int t);
  // Called at each unit of backward: hands arrived units to the CPU, sends updated ones back.
  void progress();
  // The update of every unit (t: AdamW's step); the compute stream then waits for the copies back.
  void step(double lr, double grad_scale, int t);
  // run.trace: the CPU updates on their own track (Tracer::kHostOptimizer).
  void set_tracer(Tracer* t) { tr_ = t; }

 private:
  T* host_params() const;  // the shards the CPU AdamW reads and writes
  T* host_grads() const;
  void update_unit(int u, double lr, double grad_scale, int t);  // the CPU AdamW of one unit
  void send(const std::vector<int>& units);  // their shards to the host, on the copy stream

  ShardView<Ops> shard_;
  OptimSection optim_;
  bool shards_on_host_;
  offload::SwapPipeline* swap_;
  SwapSlots at_;
  struct Copies;  // the copy stream, per-unit events, the CPU worker
  std::unique_ptr<Copies> copies_;
  Copies& copies();
  Tracer* tr_ = nullptr;
};

}  // namespace zt
