#include "autoplan/cost_model.h"

#include <algorithm>

#include "backend/ops_cpu.h"
#include "model/layout.h"
#include "zero/engine_settings.h"
#include "zero/partition.h"

namespace zt::autoplan {

// docs/autoplan.md, "The cost model": each line below is one formula there.
Prediction predict(const StepShape& s, const Rates& r) {
  Prediction p;
  const double A = s.grad_accum, L = s.layers, Lr = s.recomputed_blocks;
  // Forward + backward: the blocks (those recomputed at their own measured cost) and the rest.
  p.compute_s = A * (r.fixed_s + (L - Lr) * r.block_s + Lr * r.block_recomputed_s) + s.grad_path_bytes / r.memory_bytes_per_s;
  p.recompute_s = A * Lr * std::max(0.0, r.block_recomputed_s - r.block_s);
  // Communication: gathers and reductions at their own measured latency and bandwidth.
  if (s.world > 1) {
    const double gather_bytes = s.all_gather_share * s.comm_bytes, reduce_bytes = s.comm_bytes - gather_bytes;
    const double gathers = s.all_gather_share * s.collectives, reductions = s.collectives - gathers;
    p.comm_s = reductions * r.reduce_alpha_s + reduce_bytes / r.reduce_bytes_per_s + gathers * r.gather_alpha_s +
               gather_bytes / r.gather_bytes_per_s;
    // With overlap, the communication thread runs beside forward and backward, except the last
    // unit's collective, which starts when backward ends: what could be hidden is the shorter of
    // the rest and the compute, and of that the overlap probe's share stays exposed (ranks that
    // share their cores with the comm thread).
    p.tail_s = std::min(p.comm_s, r.reduce_alpha_s + s.tail_bytes / r.reduce_bytes_per_s);
    const double hideable = std::min(p.comm_s - p.tail_s, p.compute_s);
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
  p.step_s = p.compute_s + p.pass_io_s + p.exposed_comm_s + p.optimizer_s;

  const double io_s = p.pass_io_s + (offloaded ? p.optimizer_s : 0);
  const double opt_s = offloaded ? 0 : p.optimizer_s;
  p.bound = "compute";
  double most = std::min(p.compute_s, p.step_s);
  for (const auto& [name, t] : {std::pair<const char*, double>{"comm", p.exposed_comm_s}, {"I/O", io_s}, {"optimizer", opt_s}})
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
  return {{"compute_s", compute_s},   {"recompute_s", recompute_s},       {"comm_s", comm_s}, {"tail_s", tail_s},
          {"exposed_comm_s", exposed_comm_s}, {"pass_io_s", pass_io_s},
          {"optimizer_s", optimizer_s}, {"step_s", step_s},             {"bound", bound}};
}

// docs/autoplan.md, "The cost model": the shape's terms.
StepShape step_shape(const Plan& plan, const Estimate& est, int world) {
  const EngineSettings s = engine_settings<CpuOps<float>>(plan, DataMesh::of(plan, world, 0, 0));
  const ParamLayout layout = s.layout();
  const Partition part(layout, s.zero);
  StepShape sh;
  sh.stage = plan.zero.stage;
  sh.world = world;
  sh.grad_accum = plan.batch.grad_accum;
  sh.layers = plan.model.n_layer;
  sh.recomputed_blocks = plan.recompute.policy == "block" ? (sh.layers + plan.recompute.every - 1) / plan.recompute.every : 0;
  sh.overlap = plan.zero.overlap_comm;
  const double psi = double(part.total()), N = world, A = sh.grad_accum;
  sh.shard_params = sh.stage == 0 ? psi : psi / N;
  sh.comm_bytes = double(est.bytes_per_step);
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
