// `train estimate`: the per-rank memory table (tier x category) and the bytes sent per step for a
// plan at a world size, computed from the same Partition the engine allocates from, without
// allocating or reading data. Tests assert the tracked memory of a real run equals it exactly.
#pragma once
#include <string>

#include <nlohmann/json.hpp>

#include "plan/plan.h"

namespace zt {

struct Estimate {
  nlohmann::json memory;       // {"host": {"params": bytes, ..., "total": bytes}}
  nlohmann::json buffers;      // [{"category", "name", "bytes"}]
  uint64_t bytes_per_step = 0;
  std::string bytes_formula;
  nlohmann::json recompute;    // policy, activation bytes per policy, extra forward FLOPs (docs/design.md §3.11)
  std::string table;           // human-readable
};

// Ranks an estimate accepts: far past any run, and keeps the padding lcm(world, 128) small.
constexpr int kMaxWorld = 65536;

// The --world argument as written: an integer in [1, kMaxWorld], or one clear error line.
int parse_world(const std::string& text);

// world in [1, kMaxWorld]. Throws when a size does not fit in 64 bits.
Estimate estimate_plan(const Plan& plan, int world);

}  // namespace zt
