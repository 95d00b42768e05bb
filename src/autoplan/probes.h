// Calibration for the candidates that fit (docs/autoplan.md, "Calibration"): the probes each one's
// prediction needs, every rank at once, from the cache where they were measured before
// (calibrate.h): micro-steps per micro-batch, policy and embedding split; AdamW; the link and the
// overlap per bucket size; offload's optimizer step and passes (engine runs where there is data to
// train on, else the pipeline and pass probes); the disk alone, reported beside them.
#pragma once
#include <map>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "autoplan/calibrate.h"
#include "autoplan/candidates.h"
#include "autoplan/plan_inputs.h"
#include "comm/comm.h"

namespace zt::autoplan {

using MicroKey = std::tuple<int, std::string, int>;  // micro-batch, policy, embedding rows

// What the probes measured, shared by the candidates (keyed by what they differ in).
struct Measurements {
  std::map<MicroKey, MicroStepCost> micro;
  double adamw = 0;  // seconds per parameter
  std::map<std::pair<std::string, double>, LinkCost> links;  // (collective, bucket_mb)
  std::map<double, double> overlap;  // bucket_mb -> exposed share
  double disk = 0;  // bytes per second, mixed reads and writes (0 without offload)
};

// What the link, overlap and engine probes ran on (the comm settings), part of their cache keys.
std::string comm_key(const Plan& base);

// Collective. Offload's rates go into each candidate (its rates and engine_* fields); the rest is
// returned. `out_dir`: where the engine runs' directories go; `threads`: per rank, for the line.
Measurements measure_candidates(const PlanInputs& in, std::vector<Candidate*>& fit, Calibration& cal, Comm& comm,
                                const std::string& out_dir, int threads);

}  // namespace zt::autoplan
