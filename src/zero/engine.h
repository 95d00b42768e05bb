// The ZeRO engine (docs/design.md §3.3, §3.4): one implementation for stages 0-3, in three parts
// read side by side, over one model-state store:
//
//   zero/store.h           every model-state buffer of the rank, listed once (where memory is listed)
//   zero/grad_reducer.h    gradient buckets, staging slots, overlap (where a bucket fires)
//   zero/param_gatherer.h  stage-3 schedule, prefetch, release; stage 1-2 all-gather after the step
//                          (where a unit is gathered and released)
//   zero/optimizer.h       AdamW over the store's owned slices (where a shard is updated)
//
// beside them the strategies that change how a step is carried out, not what it computes:
// zero/embedding_exchange.h (the lookup's rows and gradients between ranks, stages 0-2, CPU
// backend: a decorator over these hooks, which prepares each step's lookup in optimizer_step from
// the next step's tokens, StepTokens given at assembly),
// zero/param_shard_source.h and zero/grad_shard_sink.h (where stage 3's shards live: memory,
// pinned host memory or NVMe), zero/host_optimizer.h (the CUDA backend's AdamW on the host),
// zero/update_in_backward.h (the swapped update on a worker thread during backward),
// zero/shard_init.h (stage 3's parameters initialised shard-wise) and zero/traced_hooks.h
// (run.trace around the hooks).
//
// This class wires them to the model's unit hooks, initialises the parameters shard-wise, and
// streams them out. What a stage does is data (StageRules, partition.h), read by the parts.
//
// Step anatomy (one optimizer step, A micro-steps; "RS" reduce-scatter, "AG" all-gather):
//
//   stage 0  fwd ─> bwd ──┬─ bucket k ready ─> all-reduce(k) ───┐            (last micro-step only)
//                         └─ ... ──────────────────────────────> wait all ─> AdamW(full) on every rank
//   stage 1  fwd ─> bwd ──┬─ bucket k ready ─> RS(k) into my gradient shard   (last micro-step only)
//                         └─ ... ─> wait all ─> AdamW(my shard) ─> AG(params, per unit): with
//            overlap, waited unit by unit in the next forward, prefetch_units + 1 in flight
//   stage 2  every micro-step: bucket k ready ─> RS(k) from a staging slot ─> += my gradient shard;
//            a full gradient buffer never exists; then AdamW(my shard) ─> AG(params)
//   stage 3  per unit: AG(u + 1 .. u + prefetch) in flight while u computes; release u after use;
//            backward re-gathers; RS gradients as in stage 2; AdamW(my shard); no final AG
//
// Overlap (zero.overlap_comm = true), drawn for backward with two staging slots:
//
//   compute  | head | bwd L+1 | bwd L | ... | bwd 0 (embedding: head dW + lookup) |
//   comm     |         |  RS(bucket{L+1,L}) ───────────┐   |  RS(...)  | RS(0) | wait all
//                                 slot 0 busy ─────────┘ slot 1 ──────────...
//   Open MPI moves a non-blocking collective forward only inside MPI calls, so every hook calls
//   comm.test() to progress whatever is in flight between units of work.
//
// The naive path (overlap_comm = false): one collective per unit, started and waited on the spot,
// no prefetch. Kept for teaching and A/B.
#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include "comm/comm.h"
#include "model/gpt.h"
#include "plan/plan.h"
#include "runtime/trace.h"
#include "zero/embedding_exchange.h"
#include "zero/grad_reducer.h"
#include "zero/optimizer.h"
#include "zero/param_gatherer.h"
#include "zero/partition.h"
#include "zero/shard_init.h"
#include "zero/store.h"
#include "zero/traced_hooks.h"
#include "zero/update_in_backward.h"

namespace zt {

template <class Ops>
class ZeroEngine : public UnitHooks {
 public:
  using T = typename Ops::T;

  // The model is built without parameters or gradients of its own (GPT(..., false, false)): the
  // engine points its units at the store's buffers (or, at stage 3, at gathered slots).
  // shard_group: the ranks the model state is sharded over (the world, or with hybrid sharding a
  // shard group), whose rank and size are the partition's.
  // step_tokens: micro-step 0's tokens of a training step, for the lookup from the shards to be
  // prepared a step ahead (zero/embedding_exchange.h; the training loader, train/engine_assembly.cpp).
  // replicas: the replicate group of hybrid sharding (zero/data_mesh.h; nullptr: one shard group),
  // over which the reducer sums each gradient shard once per step.
  ZeroEngine(GPT<Ops>& model, const Partition& part, StateStore& store, Comm& shard_group,
             const OptimSection& optim, StepTokens step_tokens = {}, Comm* replicas = nullptr);
  ~ZeroEngine() override;

  // Random GPT-2 init or an llm.c file. Each rank writes only what it keeps: every rank the same
  // full parameters at stages 0-2, its own shard at stage 3 (never the whole model).
  void init_parameters(uint64_t seed, const std::string& llmc_path);
  // The parameters, one unit at a time, into `sink` on the writing rank (empty elsewhere); collective
  // (GPT::save_llmc_units).
  void save_llmc(const typename GPT<Ops>::LlmcSink& sink);

  void begin_step(int64_t step);
  // Before each micro-step's forward (with_backward) or each evaluation / sampling forward.
  void begin_pass(int micro, bool with_backward);
  // After the last micro-step's backward: completes all gradient communication.
  void finish_gradients();
  double grad_norm();
  // Tensor parallelism: the gradient norm also sums over this group (ShardedOptimizer). Not owned.
  void set_tensor_group(Comm* tensor) { optimizer_.set_tensor_group(tensor); }
  // Pipeline parallelism: see ShardedOptimizer::set_pipeline_group.
  void set_pipeline_group(Comm* pipe, bool counts_embedding) { optimizer_.set_pipeline_group(pipe, counts_embedding); }
  // Without gradient clipping (optim.grad_clip 0) the update's arguments are known at the start of
  // the step (scale 1): the CPU AdamW of offload.optimizer "cpu" then runs beside backward.
  // optimizer_step must get the same lr. A no-op elsewhere.
  void update_args_known(double lr);
  // Stages 1-2 with overlap: the parameter all-gather it starts runs under the next forward
  // (each unit waited before its first use); params_ready() waits for all of it, before anything
  // else reads the parameters (checkpoint, captured state, end of run; save_llmc waits itself).
  // With the lookup from the shards it first prepares the next step's lookup (its tokens from
  // step_tokens), ahead of the parameter all-gathers (zero/embedding_exchange.h).
  void optimizer_step(double lr, double grad_scale);
  // Seconds the last optimizer_step spent in the update itself (AdamW, with offload its swap
  // pipeline), apart from what follows it (the parameter all-gather): the planner's engine runs.
  double last_update_s() const { return last_update_s_; }
  void params_ready() {
    gatherer_.wait_all();
    if (lookup_) lookup_->wait();
  }
  ShardedOptimizer<Ops>& optimizer() { return optimizer_; }

  // run.trace (docs/traces.md): forward / backward per unit on the compute track, the
  // optimizer's parts on the optimizer track, and the bucket / unit of each collective as tags
  // (zero/traced_hooks.h). nullptr (the default) = off.
  void set_tracer(Tracer* t);

  // Largest number of gathered (stage-3) units that were alive at once.
  int max_gathered_alive() const { return gatherer_.max_alive(); }

  // UnitHooks
  void before_forward(int u) override;
  void after_forward(int u) override;
  void before_backward(int u) override;
  void after_backward(int u) override;
  void before_grads(int u) override;
  void grads_ready(int u) override;
  // Stages 1-2 with overlap: the LM head reads the embedding's rows as its all-gather delivers them.
  std::vector<VocabRows> head_rows(int u) override;
  void before_head_rows(int u, int k) override;

 private:
  GPT<Ops>& model_;
  const Partition& part_;
  StateStore& store_;
  Comm& group_;  // the shard group
  Comm* replicas_;  // the replicate group, or nullptr
  StageRules rules_;
  GradReducer<Ops> reducer_;
  ParamGatherer<Ops> gatherer_;
  ShardedOptimizer<Ops> optimizer_;
  // The lookup exchange over these hooks (nullptr where Partition::lookup_numel() is 0).
  std::unique_ptr<EmbeddingLookup> lookup_;
  UnitHooks& hooks() { return lookup_ ? static_cast<UnitHooks&>(*lookup_) : *this; }
  void gather_or_progress(int u);
  // The optimizer step inside backward (zero/update_in_backward.h): the buckets whose gradient
  // shard is final, handed to the optimizer as one edge (publish_final, at the hooks).
  FinalEdge final_;
  size_t units_end_ = 0;  // the end of the last unit's shard: the edge at the start of a step
  void publish_final();
  int micro_ = 0;
  bool in_backward_ = false;  // between before_backward and after_backward of a unit
  bool head_by_rows_ = false;  // the head's forward waits for its rows range by range (head_rows)
  double last_update_s_ = 0;  // host time: on the CUDA backend only what the host waited for
  Tracer* tr_ = nullptr;
  std::unique_ptr<TracedHooks> traced_;  // the model's hooks while tracing
};

}  // namespace zt
