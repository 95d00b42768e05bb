// The space the planner searches and each point of it sized (docs/autoplan.md, "Candidates" and
// "Fitting"): the choices that keep the global batch, each one's exact memory estimate
// (zero/estimate.h) against what this host (and GPU) offers, and its step's shape for the cost model.
#pragma once
#include <cstdint>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "autoplan/cost_model.h"
#include "autoplan/plan_inputs.h"
#include "autoplan/planner.h"
#include "comm/comm.h"
#include "offload/swap_file.h"
#include "plan/plan.h"

namespace zt::autoplan {

// What a process holds besides the tracked buffers (docs/autoplan.md, "Fitting"): shared libraries,
// runtimes, heap; test/zero/memory_formulas.py holds a run's peak RSS to at most this above its
// tracked total plus the init transient.
constexpr uint64_t kRuntimeOverhead = uint64_t(256) << 20;

// One point of the space the planner searches (docs/autoplan.md, "Candidates").
struct Choice {
  // The mesh (docs/autoplan.md, "Candidates"): pipeline stages, tensor ranks, model chunks per rank
  // (> 1: the interleaved schedule, else 1F1B), sequence parallelism; the data axis is the rest:
  // data = world / (pipeline x tensor) ranks, over which everything below is chosen as before.
  int pipeline = 1, tensor = 1, chunks = 1, data = 1;
  bool sequence_parallel = false;
  int stage = 0;
  bool optimizer_offloaded = false, params_offloaded = false;  // to offload_to
  std::string offload_to = "nvme";  // where: "nvme" (CPU backend), "cpu" (CUDA backend: pinned host memory)
  std::string policy = "none";
  int every = 1;
  int micro_batch = 1, grad_accum = 1;
  double bucket_mb = 25;
  // ZeRO's shard group (zero.shard_group): "world" (the data axis), or a number of consecutive ranks,
  // one host's, whose shards the other hosts' groups replicate (hybrid sharding: only the
  // replicas' sums cross between hosts).
  std::string shard_group = "world";
  bool overlap = true;

  bool meshed() const { return pipeline > 1 || tensor > 1; }
  std::string schedule() const { return chunks > 1 ? "interleaved" : "1f1b"; }
  void apply(nlohmann::json& j) const {
    j["mesh"]["pipeline"] = pipeline;
    j["mesh"]["tensor"] = tensor;
    j["mesh"]["chunks"] = chunks;
    j["mesh"]["schedule"] = schedule();
    j["mesh"]["sequence_parallel"] = sequence_parallel;
    j["zero"]["stage"] = stage;
    j["zero"]["bucket_mb"] = bucket_mb;
    j["zero"]["overlap_comm"] = overlap;
    j["zero"]["shard_group"] = shard_group;
    j["offload"]["optimizer"] = optimizer_offloaded ? offload_to : "none";
    j["offload"]["params"] = params_offloaded ? offload_to : "none";
    j["recompute"]["policy"] = policy;
    j["recompute"]["every"] = every;
    j["batch"]["micro_batch"] = micro_batch;
    j["batch"]["grad_accum"] = grad_accum;
  }
  std::string offload() const {
    const std::string what = params_offloaded ? "opt+params" : optimizer_offloaded ? "opt" : "-";
    return offload_to == "cpu" && optimizer_offloaded ? what + " cpu" : what;
  }
  std::string recompute() const { return policy == "block" && every > 1 ? "block/" + std::to_string(every) : policy; }
  // "P2 x T1 x D2" (with "/2" chunks and "+sp" where they apply): pipeline x tensor x data.
  std::string mesh() const {
    std::ostringstream os;
    os << "P" << pipeline << (chunks > 1 ? "/" + std::to_string(chunks) : "") << " x T" << tensor
       << (sequence_parallel ? "+sp" : "") << " x D" << data;
    return os.str();
  }
  std::string label() const {
    std::ostringstream os;
    if (meshed()) os << "mesh " << mesh() << ", ";
    os << "stage " << stage << ", B " << micro_batch << " x " << grad_accum << ", recompute " << recompute();
    if (optimizer_offloaded) os << ", offload " << offload();
    if (shard_group != "world") os << ", shard group " << shard_group;
    return os.str();
  }
  nlohmann::json to_json() const {
    return {{"mesh.pipeline", pipeline}, {"mesh.tensor", tensor}, {"mesh.chunks", chunks},
            {"mesh.sequence_parallel", sequence_parallel}, {"zero.stage", stage},       {"offload.optimizer", optimizer_offloaded ? offload_to : "none"},
            {"offload.params", params_offloaded ? offload_to : "none"}, {"recompute.policy", policy},
            {"recompute.every", every},  {"batch.micro_batch", micro_batch}, {"batch.grad_accum", grad_accum},
            {"zero.bucket_mb", bucket_mb}, {"zero.overlap_comm", overlap}, {"zero.shard_group", shard_group}};
  }
};

struct Candidate {
  Choice choice;
  nlohmann::json resolved;  // the base plan with the choice applied: what --out gets
  uint64_t host = 0, nvme = 0;  // per rank: estimate (host + pinned) + init transient + overhead; swap files
  uint64_t device = 0;  // per rank, CUDA backend: the estimate's device tier (+ NCCL's own buffers)
  bool fits = false;
  int embedding_rows = 0;  // as the engine splits the embedding (stage 3 at N > 1), for the compute probe
  offload::SwapSpec swap;  // offload: the plan's sub-groups, buffer sets, queue depth (for the I/O probes)
  std::vector<size_t> unit_shards;  // parameter offload: this rank's shard of each unit, for the pass probe
  int embedding_units = 1;
  bool regather = false;   // the chunked classifier regathers the embedding in backward
  StepShape shape;
  Rates rates;  // the calibrated rates its prediction used
  // Parameter offload, from the engine run (docs/autoplan.md, "Calibration"): its first and each
  // later micro-step at micro-batch 1, and the model's time for such a micro-step without the
  // transfers (its compute part apart), from which pass_first_s and pass_next_s are backed out;
  // and the gradient flush after the last backward (pass_flush_s).
  double engine_first_micro_s = 0, engine_next_micro_s = 0, engine_flush_s = 0;
  double engine_base_micro_s = 0, engine_base_compute_s = 0, engine_base_tail_s = 0;
  Prediction pred;
  double measured_s = -1;              // the fastest of measured_runs_s
  std::vector<double> measured_runs_s;  // one per --validate round
  std::vector<double> measured_update_runs_s;  // the optimizer update's part of each, beside the prediction's
};

// The space (docs/autoplan.md, "Candidates"). At one rank, stages 1-3 shard nothing: they appear
// only where the offload needs them (optimizer: 2; parameters: 3). Offload goes to `offload_to`:
// "nvme" on the CPU backend (where `offload` says the directory takes it), "cpu" on the CUDA
// backend (pinned host memory, the memory ladder's GPU rung; docs/plans.md).
// Over the mesh: every pipeline x tensor x data factorisation of `world` whose data axis divides
// `global` sequences, with chunks 1 and 2 (pipeline > 1) and sequence parallelism off and on
// (tensor > 1); offload only where the data axis is the whole world. Meshes whose data axis does not
// divide the global batch are counted in `dropped` (reason -> candidates). mesh false: the data
// axis alone (the CUDA backend's memory plan). ranks_per_host: where the data axis is the world and
// spans hosts, ZeRO stages 1-3 also with one host's ranks as the shard group (hybrid sharding).
std::vector<Choice> enumerate(const Plan& base, int world, long global, bool offload, const std::string& offload_to,
                              bool mesh, int ranks_per_host, std::map<std::string, long>& dropped);

// Every candidate of the space that keeps the keys --set fixes, sized (memory, fit, shape, the
// offload layout its probes need). Rank 0 says what --set fixed.
// Candidates the plan's own checks refuse (heads the tensor ranks do not divide, a stage or chunk
// without a block, ZeRO stages 2-3 with stages, ...) are counted in `dropped` by reason, not sized.
std::vector<Candidate> size_candidates(const PlanRequest& req, const PlanInputs& in, Comm& comm,
                                       std::map<std::string, long>& dropped);

// Those that fit. Overlap off sends the same bytes and waits for all of them: a candidate only
// where its twin with overlap on (two staging slots and a prefetched unit more) does not fit.
std::vector<Candidate*> fitting(std::vector<Candidate>& all);

// Rank 0's line: how many candidates, how many fit in what.
// `dropped`: candidates left out before sizing, by reason (docs/autoplan.md, "Candidates").
void print_fit(const PlanRequest& req, const PlanInputs& in, size_t all, size_t fit,
               const std::map<std::string, long>& dropped, bool root);

// The CPU backend's refusal when none fits: what the smallest needs against what there is.
[[noreturn]] void refuse_no_fit(const std::vector<Candidate>& all, const PlanInputs& in);

}  // namespace zt::autoplan
