// On the CUDA backend: memory only (docs/autoplan.md, "On the CUDA backend"). No rates are measured
// for the GPU (this machine has none to measure; the device README's runs are benchmarks, not a
// calibration), so nothing is predicted there: the planner sizes every candidate against the GPU it
// runs on and takes the first that fits in the memory ladder's order.
#pragma once
#include <cstdint>
#include <vector>

#include "autoplan/candidates.h"
#include "autoplan/plan_inputs.h"
#include "comm/comm.h"

namespace zt::autoplan {

// Kept free on the device beyond the estimate: what it does not count (NCCL's communicators beside
// the approximation added per candidate, cuBLASLt's heuristics, the allocator's rounding). On an H100
// the runs used 5.6-15.7 MiB more than their estimates (scripts/device/RESULTS.md).
constexpr uint64_t kDeviceReserve = uint64_t(64) << 20;

// What one rank's device offers the run: the free memory of the GPU it will take (local rank r
// takes GPU r % gpus, as train does) once every local rank's CUDA context and cuBLASLt workspace
// exist (as the trainer counts it: free at start), shared evenly among the ranks on that GPU, less
// kDeviceReserve; the least over all ranks (they must agree on what fits). Collective.
uint64_t device_bytes_per_rank(Comm& comm);

// The first candidate that fits in the ladder's order, written with its report (rank 0); refuses
// when none fits. Collective. Returns the exit code.
int plan_for_device(const PlanRequest& req, const PlanInputs& in, const std::vector<Candidate>& all,
                    std::vector<Candidate*> fit, Comm& comm);

}  // namespace zt::autoplan
