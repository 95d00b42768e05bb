// `train estimate`: the per-rank memory table (tier x category) and the bytes sent per step for a
// plan at a world size, computed from the same settings (zero/engine_settings.h) and Partition the
// engine allocates from, without allocating or reading data. Tests assert the tracked memory of a
// real run equals it exactly. estimate_plan computes the numbers; estimate_text and estimate_json
// (zero/estimate_report.cpp) render them.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "plan/plan.h"
#include "runtime/memory.h"

namespace zt {

// One buffer of the store's list (zero/store.h), or the activations.
struct EstimatedBuffer {
  Category category;
  std::string name;
  Tier tier;
  size_t bytes;
};

// The recompute policy's price next to the alternatives (docs/design.md §3.11).
struct RecomputeEstimate {
  std::string policy;
  int every = 1;
  size_t activation_bytes = 0;  // this plan's
  int classifier_rows = 0;      // positions per classifier chunk (B * seq_len: whole)
  size_t logits_bytes = 0;      // one chunk's logits
  // Activation bytes of each policy (none, selective, block; every 1) with this plan's classifier
  // chunk, and with whole logits.
  std::map<std::string, size_t> by_policy, by_policy_whole_logits;
  // Per micro-step: forward FLOPs (matmuls and attention) and those backward spends again.
  double forward_flops = 0, extra_forward_flops = 0;
};

// How the collectives move on the CUDA backend (comm.backend as resolved: "nccl" or "mpi").
struct CommEstimate {
  std::string backend;             // "nccl", or "mpi" (on the CUDA backend: host-staged)
  size_t pinned_staging = 0;       // this plan's pinned host mirrors (the buffers list has them too)
  size_t host_staged_pinned = 0;   // what the host-staged path would pin for the same plan
  // NCCL's own device buffers (nccl only): zerotrain does not allocate or track them, so this is
  // an approximation from NCCL's defaults, not a measurement: channels x connections x the three
  // protocols' FIFOs.
  int nccl_channels = 0, nccl_connections = 0;
  size_t nccl_conn_bytes = 0;
  size_t nccl_internal = 0;
};

struct Estimate {
  // What was estimated.
  std::string plan_source;
  int stage = 0, world = 1, micro_batch = 0, seq_len = 0;
  size_t num_params = 0, padded_params = 0;
  Tier backend_tier = Tier::host;
  std::string backend_name;
  bool cpu_for_gpu_plan = false;  // the CPU backend's sizes for a plan that names cuda or bf16 (no CUDA build)

  std::vector<EstimatedBuffer> buffers;                  // in allocation order, activations last
  std::map<std::pair<Tier, Category>, size_t> by_tier_category;
  std::map<Tier, size_t> tier_totals;                    // tiers that hold anything
  uint64_t bytes_per_step = 0;
  std::string bytes_formula;
  // The data mesh (zero/data_mesh.h): ranks per shard group, shard groups (replicas), and
  // bytes_per_step within the shard group and across the replicas (which, with the shard group a
  // host, is all that crosses between hosts).
  int shard_group = 1, replicas = 1;
  uint64_t bytes_shard_group = 0, bytes_replicas = 0;
  // Tensor parallelism (docs/design.md §3.13): ranks per tensor group, the data axis's size, and the
  // tensor group's bytes (activations' partial sums, model/tensor_parallel.h), part of bytes_per_step.
  int tensor = 1, data_world = 1;
  uint64_t bytes_tensor = 0;
  // With T > 1: this plan's activations with and without mesh.sequence_parallel (the rest alike).
  size_t activations_sp = 0, activations_no_sp = 0;
  RecomputeEstimate recompute;
  CommEstimate comm;  // device backends only (backend_tier == Tier::device)
  // Pipeline parallelism (docs/design.md §3.14): this estimate is of stage `pipeline_stage` (the
  // first: the world's rank 0), which holds blocks [first_layer, first_layer + layers) and the
  // activations of activation_slots micro-batches at once; `stages` holds every stage's estimate
  // (the first one's too) when pipeline > 1.
  int pipeline = 1, pipeline_stage = 0, first_layer = 0, layers = 0, activation_slots = 1;
  std::vector<std::pair<int, int>> layer_runs;  // (first layer, blocks) per model chunk (interleaved: several)
  std::vector<Estimate> stages;

  size_t tier_total(Tier t) const {
    const auto it = tier_totals.find(t);
    return it == tier_totals.end() ? 0 : it->second;
  }
};

// Ranks an estimate accepts: far past any run, and keeps the padding lcm(world, 128) small.
constexpr int kMaxWorld = 65536;

// The --world argument as written: an integer in [1, kMaxWorld], or one clear error line.
int parse_world(const std::string& text);

// world in [1, kMaxWorld]. Throws when a size does not fit in 64 bits. ranks_per_host: for
// zero.shard_group "host" (0 = not known: "host" is then refused; a run records the number).
Estimate estimate_plan(const Plan& plan, int world, int ranks_per_host = 0);

// What `train estimate` prints, and with --json: {"memory": {tier: {category: bytes, ..., "total"}},
// "buffers": [{"category", "name", "tier", "bytes"}], "bytes_per_step", "world", "stage", "recompute",
// and on a device backend "comm": {"backend", "pinned_staging_bytes", "host_staged_pinned_bytes",
// with nccl "nccl_internal_bytes_approx" and its "nccl_internal_formula"}}.
std::string estimate_text(const Estimate& e);
nlohmann::json estimate_json(const Estimate& e);

}  // namespace zt
