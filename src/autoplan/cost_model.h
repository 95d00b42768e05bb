// The planner's cost model (docs/autoplan.md has the formulas; test/autoplan/cost_model_test.cpp
// checks terms against arithmetic done by hand): a step's time from the plan's shapes and bytes
// and the rates calibrate.h measured. Pure arithmetic: no probes, no allocation.
#pragma once
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "plan/plan.h"
#include "zero/estimate.h"

namespace zt::autoplan {

// What the model needs to know of one candidate plan (all per rank, per optimizer step).
struct StepShape {
  // world: the data axis's ranks (the whole world without tensor or pipeline parallelism); the
  // ZeRO terms below are over them. grad_accum: micro-batches per step (with stages: the pipeline's).
  int stage = 0, world = 1, grad_accum = 1, layers = 0;
  // The mesh: pipeline stages, model chunks per rank, tensor ranks; per stage its blocks and how
  // many of them are recomputed (one entry without stages).
  int pipeline = 1, chunks = 1, tensor = 1;
  std::vector<double> stage_blocks, stage_recomputed;
  double tensor_bytes = 0;            // sent on the tensor group per step (train estimate's bytes_tensor)
  double tensor_collectives = 0;      // the tensor group's collectives per micro-step (latency count)
  double p2p_bytes = 0;               // one micro-batch's activations (or their gradient) at a stage boundary
  double tie_bytes = 0;               // the tied embedding's gradient (its shard above stage 0) summed between the first and last stage
  double tie_pieces = 0;              // the exchanges it is summed in (train/pipeline_step.h, kTiePieceNumel)
  // Hybrid sharding: world is then the shard group's ranks, comm_bytes what moves within it, and
  // these the replicas' all-reduces of each shard (once a step) and their bytes.
  int replicas = 1;
  double replica_collectives = 0, replica_bytes = 0;
  // The world's ranks and this host's. The probes ran every rank at once; a pipeline's stages on
  // one host are not all busy at once, and where they share the cores the busy ones get more.
  int ranks = 1, ranks_per_host = 1;
  int recomputed_blocks = 0;          // blocks under the block policy (blocks 0, every, 2*every, ...)
  bool overlap = true;
  double padded_params = 0;           // Ψ: the model's parameters as padded for N ranks
  double units = 0, buckets = 0;      // the engine's units (gathered one at a time) and gradient buckets
  double shard_params = 0;            // parameters this rank's AdamW updates (Ψ at stage 0, Ψ/N above)
  double comm_bytes = 0;              // model-state bytes sent per step (train estimate's bytes_per_step)
  double collectives = 0;             // collectives per step (latency count)
  double tail_bytes = 0;              // bytes sent by the one collective nothing overlaps (the last unit's)
  double all_gather_share = 0;        // share of comm_bytes sent by all-gathers (the rest: reductions)
  double optimizer_io_bytes = 0;      // swap-file bytes read + written by the optimizer step
  double grad_path_bytes = 0;         // bytes the gradient path moves in memory (bucket to shard, accumulation)
};

// The shape of one candidate's step, for the cost model (docs/autoplan.md gives each term): the
// plan's partition (as rank 0's engine builds it) and `est`'s bytes per step.
StepShape step_shape(const Plan& plan, const Estimate& est, int world);

// The calibrated rates it multiplies by (calibrate.h).
struct Rates {
  double block_s = 0, block_recomputed_s = 0, fixed_s = 0;  // per micro-step
  double adamw_s_per_param = 0;
  double reduce_alpha_s = 0, reduce_bytes_per_s = 1e30;   // all-reduce at stage 0, else reduce-scatter
  double gather_alpha_s = 0, gather_bytes_per_s = 1e30;   // all-gather (stages 1-3)
  double overlap_exposed = 0;         // share of the overlapped time not hidden (the overlap probe)
  double pipeline_s_per_byte = 0;     // the optimizer step over swapped state, per byte it moves (engine run)
  double pass_first_s = 0, pass_next_s = 0;  // parameter offload's transfers in a micro-step: the first, each later one
  double pass_flush_s = 0;  // and the gradient writes the step waits for after the last backward (engine run)
  double pass_exposed = 1;            // share of their overlap with compute not hidden (the pass probe)
  double memory_bytes_per_s = 1e30;   // the AdamW probe's: 28 bytes per parameter
  double tensor_alpha_s = 0, tensor_bytes_per_s = 1e30;  // all-reduce on the tensor group, at activation sizes
  double p2p_alpha_s = 0, p2p_bytes_per_s = 1e30;        // send + receive between neighbouring stages
  double replica_alpha_s = 0, replica_bytes_per_s = 1e30;  // all-reduce across the replicas (hybrid sharding)
  double idle_share = 1;  // stages on one host: the busiest's compute while the others wait, over all busy (the probe's)
};

struct Prediction {
  std::vector<double> stage_s;  // one micro-batch's forward + backward on each stage (tensor collectives apart)
  double core_share = 1;       // compute's time where fewer ranks than the probes' are busy at once, over the probes' (<= 1)
  double compute_s = 0;        // forward + backward of every micro-step on the busiest stage, recomputation included, and the gradient path
  double tensor_comm_s = 0;    // the tensor group's collectives (blocking: all of it waited for)
  double bubble_s = 0;         // the pipeline's fill and drain: the other stages' work the busiest waits for
  double p2p_s = 0;            // stage boundaries on the fill's and drain's critical path, and the tied embedding's sum
  double recompute_s = 0;      // the part of compute_s that recomputes forward work
  double replica_s = 0;        // the replicas' all-reduces (hybrid sharding), part of comm_s
  double comm_s = 0;           // every collective of the step, back to back
  double tail_s = 0;           // the last unit's collective, which nothing overlaps
  double overlap_window_s = 0; // the blocks' compute the data axis's other collectives can run beside
  double exposed_comm_s = 0;   // the part of comm_s the step waits for
  double pass_io_s = 0;        // parameter offload's transfers during forward and backward
  double optimizer_s = 0;      // AdamW over the shard (streamed through its swap files where offloaded)
  double step_s = 0;
  std::string bound;           // "compute", "comm", "I/O" or "optimizer": the largest part of step_s

  nlohmann::json to_json() const;
};

Prediction predict(const StepShape& s, const Rates& r);

// The inverse of pass_io_s's per-micro-step term: the transfers `io` whose exposed part beside
// `compute` is `exposed` (io - (1 - share) * min(compute, io) = exposed), for transfers measured
// with compute around them (the engine run) rather than alone.
double transfers_behind(double exposed, double compute, double share);

// Parameter offload's passes backed out of the engine run's micro-steps (docs/autoplan.md,
// "Calibration"): what each took beyond the model's time for the same micro-step without
// parameter offload (micro-batch 1 at `one_block_s` / `one_fixed_s`, no recomputation, one
// micro-step's collectives) is the transfers' exposed part beside that compute; the transfers
// themselves follow by transfers_behind, and are then exposed beside each candidate's compute as
// pass_io_s says. Sets r.pass_first_s, pass_next_s and pass_flush_s; returns that base micro-step.
struct EngineBase {
  double micro_s = 0, compute_s = 0, tail_s = 0;  // its compute + exposed communication; compute; last collective
};
EngineBase back_out_passes(const StepShape& shape, double one_block_s, double one_fixed_s, double first_micro_s,
                           double next_micro_s, double flush_s, Rates& r);

}  // namespace zt::autoplan
