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
  std::string table;           // human-readable
};

Estimate estimate_plan(const Plan& plan, int world);

}  // namespace zt
