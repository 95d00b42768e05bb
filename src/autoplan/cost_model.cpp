#include "autoplan/cost_model.h"

#include <algorithm>

#include "backend/ops_cpu.h"
#include "model/gpt.h"
#include "model/layout.h"
#include "model/recompute.h"
#include "model/tensor_parallel.h"
#include "train/pipeline_step.h"
#include "zero/engine_settings.h"
#include "zero/partition.h"

namespace zt::autoplan {

// docs/autoplan.md, "The cost model": each line below is one formula there.
Prediction predict(const StepShape& s, const Rates& r) {
  Prediction p;
  const double A = s.grad_accum;
  // Forward + backward of one micro-batch on each stage: its blocks (those recomputed at their own
  // measured cost) and, on the last, the rest (the head and loss; the lookup is a small part of it).
  const int P = std::max(1, s.pipeline);
  double busiest = 0, all_stages = 0, recomputed = 0, busiest_blocks = 0;
  for (int i = 0; i < P; ++i) {
    const double blocks = i < int(s.stage_blocks.size()) ? s.stage_blocks[i] : 0;
    const double lr = i < int(s.stage_recomputed.size()) ? s.stage_recomputed[i] : 0;
    const double t_blocks = (blocks - lr) * r.block_s + lr * r.block_recomputed_s;
    const double t = t_blocks + (i == P - 1 ? r.fixed_s : 0);
    p.stage_s.push_back(t);
    if (t > busiest) busiest = t, recomputed = lr, busiest_blocks = t_blocks;
    all_stages += t;
  }
  // The probes measured every rank of the host computing at once. With stages on one host, a rank
  // of a lighter stage waits part of the step (all of it but its share of the busiest stage's
  // time), and the busy ones get what its wait leaves of the cores: the idle-share probe measured
  // the busiest computing while every other stage waits; in between, in proportion to the wait.
  // Until 2026-12-03 this was derived from the cores and the ranks (as if a waiting rank left its
  // core whole); on this machine the probe agrees with that (0.50-0.65 against 0.52-0.56), and it
  // also holds where a wait polls and leaves less (docs/autoplan.md, "Measured: the mesh").
  if (s.ranks_per_host == s.ranks && P > 1 && busiest > 0) {
    const double others_wait = (P * busiest - all_stages) / ((P - 1) * busiest);
    p.core_share = 1 - (1 - r.idle_share) * others_wait;
  }
  busiest *= p.core_share, all_stages *= p.core_share;
  // What the data axis's collectives can run beside: the blocks of the micro-steps that have them.
  // A unit's gradient is ready only after its backward and its parameters are needed at its forward;
  // the embedding (the first unit reduced and, with the lookup on the shards, the last gathered)
  // waits for the head's backward and is needed at the head's forward, so the head and the loss
  // hide none of it. Stages 0-1 sum the gradients in the last micro-step's backward (and gather at
  // stage 1 in the next step's first forward): one micro-step's blocks; stages 2-3 every micro-step's.
  p.overlap_window_s = (s.stage >= 2 ? A : 1) * busiest_blocks * p.core_share;
  p.compute_s = A * busiest + s.grad_path_bytes / r.memory_bytes_per_s;
  p.recompute_s = A * recomputed * std::max(0.0, r.block_recomputed_s - r.block_s) * p.core_share;
  // The pipeline (docs/pipeline.md): the busiest stage runs its m micro-batches back to back; before
  // its first and after its last it waits for the other stages' work on one micro-batch, a
  // v-th of it with v chunks per rank (interleaved); each boundary on that path is a message, and
  // the tied embedding's gradient is summed between the first and the last stage after backward,
  // piece by piece, each exchange waited for (a latency each).
  p.bubble_s = (all_stages - busiest) / std::max(1, s.chunks);
  if (P > 1)
    p.p2p_s = 2 * (P - 1) * (r.p2p_alpha_s + s.p2p_bytes / r.p2p_bytes_per_s) + s.tie_pieces * r.p2p_alpha_s +
              s.tie_bytes / r.p2p_bytes_per_s;
  // The tensor group's collectives complete each split product before the next op can start.
  p.tensor_comm_s = A * s.tensor_collectives * r.tensor_alpha_s + s.tensor_bytes / r.tensor_bytes_per_s;
  // Communication: gathers and reductions at their own measured latency and bandwidth.
  if (s.world > 1) {
    const double gather_bytes = s.all_gather_share * s.comm_bytes, reduce_bytes = s.comm_bytes - gather_bytes;
    const double gathers = s.all_gather_share * s.collectives, reductions = s.collectives - gathers;
    // Hybrid sharding: the replicas' sums of each shard, once a step; at stage 1 of the whole shard
    // after the last bucket (nothing left to overlap it with), at stages 2-3 bucket by bucket.
    p.replica_s = s.replica_collectives * r.replica_alpha_s + s.replica_bytes / r.replica_bytes_per_s;
    p.comm_s = reductions * r.reduce_alpha_s + reduce_bytes / r.reduce_bytes_per_s + gathers * r.gather_alpha_s +
               gather_bytes / r.gather_bytes_per_s + p.replica_s;
    // With overlap, the communication thread runs beside forward and backward, except the last
    // unit's collective, which starts when backward ends: what could be hidden is the shorter of
    // the rest and the blocks' compute it runs beside, and of that the overlap probe's share stays
    // exposed (ranks that share their cores with the comm thread).
    p.tail_s = std::min(p.comm_s, r.reduce_alpha_s + s.tail_bytes / r.reduce_bytes_per_s + (s.stage == 1 ? p.replica_s : 0));
    const double hideable = std::min(p.comm_s - p.tail_s, p.overlap_window_s);
    p.exposed_comm_s = s.overlap ? p.comm_s - (1 - r.overlap_exposed) * hideable : p.comm_s;
  }
  // Parameters on disk: each micro-step's transfers as measured, less the part the overlap probe
  // found hidden behind that micro-step's compute (a unit's shard is read while the unit before
  // computes), and the gradient writes still in flight when the last backward ends.
  // (All 0 without parameter offload.)
  const double compute_per_micro = p.compute_s / A;
  auto exposed = [&](double io) { return io - (1 - r.pass_exposed) * std::min(compute_per_micro, io); };
  p.pass_io_s = exposed(r.pass_first_s) + (A - 1) * exposed(r.pass_next_s) + r.pass_flush_s;
  // The optimizer step: AdamW over the shard in memory, or, offloaded, the bytes its sub-group
  // pipeline moves at the rate its probe measured (transfers and update overlapped).
  const bool offloaded = s.optimizer_io_bytes > 0;
  p.optimizer_s = offloaded ? s.optimizer_io_bytes * r.pipeline_s_per_byte : s.shard_params * r.adamw_s_per_param;
  p.step_s = p.compute_s + p.tensor_comm_s + p.bubble_s + p.p2p_s + p.pass_io_s + p.exposed_comm_s + p.optimizer_s;

  const double io_s = p.pass_io_s + (offloaded ? p.optimizer_s : 0);
  const double opt_s = offloaded ? 0 : p.optimizer_s;
  p.bound = "compute";
  double most = std::min(p.compute_s, p.step_s);
  for (const auto& [name, t] : {std::pair<const char*, double>{"comm", p.exposed_comm_s}, {"I/O", io_s}, {"optimizer", opt_s},
                                {"tensor comm", p.tensor_comm_s}, {"bubble", p.bubble_s + p.p2p_s}})
    if (t > most) most = t, p.bound = name;
  return p;
}

double transfers_behind(double exposed, double compute, double share) {
  if (exposed <= 0) return 0;
  // io >= compute: exposed = io - (1 - share) * compute; io < compute: exposed = share * io.
  if (exposed >= share * compute) return exposed + (1 - share) * compute;
  return exposed / share;  // share > 0 here: exposed < share * compute
}

nlohmann::json Prediction::to_json() const {
  return {{"stage_s", stage_s}, {"tensor_comm_s", tensor_comm_s}, {"bubble_s", bubble_s}, {"p2p_s", p2p_s},
          {"replica_s", replica_s}, {"core_share", core_share}, {"compute_s", compute_s},   {"recompute_s", recompute_s},       {"comm_s", comm_s}, {"tail_s", tail_s}, {"overlap_window_s", overlap_window_s},
          {"exposed_comm_s", exposed_comm_s}, {"pass_io_s", pass_io_s},
          {"optimizer_s", optimizer_s}, {"step_s", step_s},             {"bound", bound}};
}

// docs/autoplan.md, "The cost model": the shape's terms.
StepShape step_shape(const Plan& plan, const Estimate& est, int whole_world) {
  const EngineSettings s = engine_settings<CpuOps<float>>(plan, DataMesh::of(plan, whole_world, 0, 0));
  const ParamLayout layout = s.layout();
  const Partition part(layout, s.zero);
  const int world = est.shard_group;  // ZeRO's ranks: the data axis, or with hybrid sharding its shard group
  StepShape sh;
  sh.stage = plan.zero.stage;
  sh.world = world;
  sh.grad_accum = plan.batch.grad_accum;
  sh.layers = plan.model.n_layer;
  const Recompute rc = Recompute::from(plan.recompute.policy, plan.recompute.every, 0);
  sh.recomputed_blocks = rc.blocks_recomputed_before(sh.layers);
  sh.pipeline = plan.mesh.pipeline, sh.chunks = plan.mesh.chunks, sh.tensor = plan.mesh.tensor;
  if (est.stages.empty()) {
    sh.stage_blocks = {double(sh.layers)}, sh.stage_recomputed = {double(sh.recomputed_blocks)};
  } else {
    for (const Estimate& st : est.stages)
      sh.stage_blocks.push_back(st.layers), sh.stage_recomputed.push_back(rc.blocks_recomputed_before(st.layers));
  }
  sh.tensor_bytes = double(est.bytes_tensor);
  sh.tensor_collectives = double(tensor_collectives_per_micro_step(s.model, rc));
  if (sh.pipeline > 1) {
    sh.p2p_bytes = double(GPT<CpuOps<float>>::boundary_bytes(s.model, s.micro_batch, s.seq_len));
    // The optimizer's gradient of the embedding: its shard above stage 0, the whole unit at stage 0.
    const size_t tie_numel = sh.stage == 0 ? part.unit_padded(0) : part.unit_shard_numel(0);
    sh.tie_bytes = 4.0 * double(tie_numel);
    sh.tie_pieces = double((tie_numel + kTiePieceNumel - 1) / kTiePieceNumel);
  }
  sh.overlap = plan.zero.overlap_comm;
  const double psi = double(part.total()), N = world, A = sh.grad_accum;
  sh.shard_params = sh.stage == 0 ? psi : psi / N;
  sh.comm_bytes = double(est.bytes_shard_group);  // the data axis's (within the shard group)
  sh.replicas = est.replicas;
  if (est.replicas > 1)
    sh.replica_collectives = double(part.replica_all_reduces().size()), sh.replica_bytes = double(est.bytes_replicas);
  const double buckets = double(part.buckets().size()), units = double(layout.units().size());
  sh.padded_params = psi, sh.units = units, sh.buckets = buckets;
  sh.collectives = sh.stage == 0 ? buckets : sh.stage == 1 ? buckets + units : sh.stage == 2 ? A * buckets + units
                                                                                             : A * (buckets + 2 * units);
  sh.all_gather_share = sh.stage == 0 ? 0 : sh.stage == 1 ? 0.5 : sh.stage == 2 ? 1 / (A + 1) : 2.0 / 3;
  // The last unit reduced is the embedding's (at stage 3: one of its block-sized chunks).
  const double last_unit = double(part.unit_padded(0));
  sh.tail_bytes = world == 1 ? 0 : (sh.stage == 0 ? 2 * (N - 1) / N : (N - 1) / N) * 4 * last_unit;
  const double shard_bytes = 4 * psi / N;  // one fp32 state's shard
  if (plan.offload.optimizer == "nvme") sh.optimizer_io_bytes = 2 * shard_bytes + 2 * shard_bytes;  // m, v read and written
  if (plan.offload.params == "nvme") sh.optimizer_io_bytes += 2 * shard_bytes + shard_bytes;  // p, g read; p written
  // The gradient path in memory: each bucket summed into the gradient shard (read the bucket, read
  // and write the shard), per micro-step at stages 2-3, once per step at stage 1.
  const double path = 4 * psi + 2 * 4 * psi / N;
  sh.grad_path_bytes = sh.stage >= 2 ? A * path : sh.stage == 1 ? path : 0;
  return sh;
}

EngineBase back_out_passes(const StepShape& shape, double one_block_s, double one_fixed_s, double first_micro_s,
                           double next_micro_s, double flush_s, Rates& r) {
  Rates r1 = r;
  r1.block_s = r1.block_recomputed_s = one_block_s, r1.fixed_s = one_fixed_s;
  r1.pass_first_s = r1.pass_next_s = r1.pass_flush_s = 0;
  StepShape s1 = shape;
  const double A = s1.grad_accum;
  s1.grad_accum = 1, s1.recomputed_blocks = 0;
  s1.stage_recomputed.assign(s1.stage_recomputed.size(), 0.0);
  s1.comm_bytes /= A, s1.grad_path_bytes /= A;  // parameter offload is at stage 3: all of them per micro-step
  s1.collectives = s1.buckets + 2 * s1.units, s1.optimizer_io_bytes = 0;
  const Prediction p1 = predict(s1, r1);
  EngineBase b;
  b.compute_s = p1.compute_s, b.tail_s = p1.tail_s;
  b.micro_s = p1.compute_s + p1.exposed_comm_s;
  r.pass_first_s = transfers_behind(first_micro_s - b.micro_s, p1.compute_s, r.pass_exposed);
  r.pass_next_s = transfers_behind(next_micro_s - b.micro_s, p1.compute_s, r.pass_exposed);
  // The flush: all exposed (backward has ended), less the last collective the model counts apart.
  r.pass_flush_s = std::max(0.0, flush_s - p1.tail_s);
  return b;
}

}  // namespace zt::autoplan
