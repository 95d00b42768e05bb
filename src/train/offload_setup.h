// offload.optimizer "nvme" at start-up (docs/design.md §3.6, §3.8): check offload.nvme_dir against
// the swap files `train estimate` lists, before anything is allocated or written, and say how the
// state will move.
#pragma once
#include <string>

#include "offload/swap_file.h"
#include "plan/plan.h"

namespace zt {

// The spec the store and optimizer run with (disabled without offload); prints the line of
// check_nvme_dir on stale swap files it removed. Throws one line when
// nvme_dir cannot take this host's swap files (local_world ranks share it), or when a "cpu"
// placement reaches the CPU backend (host_backend), where it would change nothing.
offload::SwapSpec prepare_offload(const Plan& plan, int world, int rank, int local_world, bool host_backend);

// One line for the start-up banner: where the state goes, how it is streamed.
std::string describe_offload(const offload::SwapSpec& spec, const Plan& plan, int world, bool host_backend);

}  // namespace zt
