// `train plan`'s inputs checked and what this machine offers (docs/autoplan.md, "Fitting"), before
// anything is measured: the request's ranges, the base plan (with the comm settings the ranks run),
// every output path, the global batch, and the host memory, offload directory and GPU memory every
// rank agrees on.
#pragma once
#include <cstdint>
#include <string>

#include "autoplan/planner.h"
#include "comm/comm.h"
#include "plan/plan.h"
#include "runtime/memory.h"

namespace zt::autoplan {

struct PlanInputs {
  int world = 1;
  Plan base;
  std::string backend;     // planned_backend: "cpu-fp32" or "cuda-*"
  bool on_device = false;  // the CUDA backend: memory only, nothing predicted
  std::string cache, out, report;  // the calibration cache, --out and its report
  long global = 0, per_rank = 0;   // sequences per step, in all and per rank
  HostMemory avail;  // the least any rank has
  int local = 1;     // ranks on this host
  bool nvme = true, direct = true;  // offload.nvme_dir takes swap files on every rank (with O_DIRECT)
  uint64_t nvme_free = 0;
  std::string nvme_why;       // why there is no offload
  uint64_t device_avail = 0;  // per rank (device_plan.h: device_bytes_per_rank)
};

// Collective. Throws zt::Error (one line) on bad input, or where no candidate can fit by arithmetic.
PlanInputs check_inputs(const PlanRequest& req, Comm& comm);

}  // namespace zt::autoplan
