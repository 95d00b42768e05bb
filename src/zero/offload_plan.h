// The plan's `offload` section as the store and the optimizer take it: an offload::SwapSpec
// (offload/swap_file.h), built here because the offload layer knows no plan (docs/design.md §2, §3.6).
#pragma once
#include <algorithm>
#include <cmath>

#include "offload/swap_file.h"
#include "plan/plan.h"

namespace zt {

// Disabled unless offload.optimizer or offload.params is "nvme". direct: what the start-up check of nvme_dir found
// (an estimate assumes O_DIRECT; the sizes do not depend on it).
inline offload::SwapSpec swap_spec_of(const OffloadSection& o, int rank, bool direct = true) {
  offload::SwapSpec s;
  if (o.optimizer != "nvme" && o.params != "nvme") return s;
  s.optimizer = o.optimizer == "nvme", s.params = o.params == "nvme";
  s.dir = o.nvme_dir, s.rank = rank, s.direct = direct;
  s.queue_depth = unsigned(o.queue_depth), s.buffer_count = o.buffer_count;
  s.overlap_update = o.overlap_update;
  // Whole I/O blocks: subgroup_mb rounded down to a multiple of 8 KiB, at least 8 KiB (two blocks:
  // a sub-group of 2-byte elements, the CUDA backend's bf16 shards, also starts on a block).
  const double pairs = std::floor(o.subgroup_mb * 1048576.0 / double(2 * offload::kIoAlign));
  s.subgroup_numel = size_t(std::max(1.0, pairs)) * 2 * offload::kIoAlign / 4;
  return s;
}

}  // namespace zt
