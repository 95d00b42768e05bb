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

using MicroKey = std::tuple<int, std::string, int, int, bool>;  // micro-batch, policy, embedding rows, tensor ranks, sp
using LinkKey = std::tuple<std::string, double, std::string>;    // collective, bytes (MiB), group ("" = the world)

// What the probes measured, shared by the candidates (keyed by what they differ in).
struct Measurements {
  std::map<MicroKey, MicroStepCost> micro;
  double adamw = 0;  // seconds per parameter
  std::map<LinkKey, LinkCost> links;  // the data axis's at bucket_mb, the tensor group's at a micro-batch's activations
  std::map<std::pair<int, size_t>, LinkCost> stage_links;  // (stages, bytes): a stage boundary
  std::map<double, double> overlap;  // bucket_mb -> exposed share
  std::map<std::pair<int, int>, double> idle_shares;  // (stages, micro-batch) on one host -> Calibration::stage_idle_share
  double disk = 0;  // bytes per second, mixed reads and writes (0 without offload)
};

// The group names of a mesh's data axis and tensor group (the link probes' keys): "" where the
// group is the whole world.
std::string data_group_name(const Choice& c);
std::string tensor_group_name(const Choice& c);
std::string replica_group_name(const Choice& c);  // hybrid sharding's replicas
// The size the tensor link is probed at for a candidate with tensor ranks (MiB: its links key): one
// micro-batch's activations, (B, T, C) fp32.
double tensor_link_mb(const Candidate& c);
// The size the stage-boundary probe runs at for a candidate with stages (its stage_links key).
size_t stage_link_bytes(const Candidate& c);

// What the link, overlap and engine probes ran on (the comm settings), part of their cache keys.
std::string comm_key(const Plan& base);

// Collective. Offload's rates go into each candidate (its rates and engine_* fields); the rest is
// returned. `out_dir`: where the engine runs' directories go; `threads`: per rank, for the line.
Measurements measure_candidates(const PlanInputs& in, std::vector<Candidate*>& fit, Calibration& cal, Comm& comm,
                                const std::string& out_dir, int threads);

}  // namespace zt::autoplan
