#include "autoplan/cost_model.h"

#include <algorithm>

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

}  // namespace zt::autoplan
