#include "train/offload_setup.h"

#include <cstdio>
#include <sstream>

#include "offload/nvme_dir.h"
#include "offload/uring.h"
#include "runtime/error.h"
#include "runtime/memory.h"
#include "zero/estimate.h"
#include "zero/offload_plan.h"
#include "zero/store.h"

namespace zt {

namespace {
// The swap files of one rank as `train estimate` lists them (Tier::nvme), padded to whole blocks,
// and the host pool they are streamed through.
uint64_t swap_file_bytes(const Plan& plan, int world, int* files, uint64_t* pool = nullptr) {
  uint64_t total = 0;
  *files = 0;
  for (const EstimatedBuffer& b : estimate_plan(plan, world).buffers) {
    if (b.tier == Tier::nvme) total += offload::io_round_up(b.bytes), ++*files;
    if (pool && (b.name == state_name(StateId::swap_buffers) || b.name == state_name(StateId::param_io))) *pool += b.bytes;
  }
  return total;
}
}  // namespace

offload::SwapSpec prepare_offload(const Plan& plan, int world, int rank, int local_world, bool host_backend) {
  if (plan.offload.optimizer == "none" && plan.offload.params == "none") return {};
  // "cpu" reached the CPU backend only through device "auto" on a machine without a GPU.
  ZT_REQUIRE(!host_backend || plan.offload.optimizer != "cpu",
             "offload.optimizer: \"cpu\" changes nothing on the CPU backend (device \"auto\" found no GPU), which "
             "already keeps everything in host memory; use \"nvme\" or \"none\"");
  ZT_REQUIRE(!host_backend || plan.offload.params != "cpu",
             "offload.params: \"cpu\" changes nothing on the CPU backend (device \"auto\" found no GPU), which "
             "already keeps everything in host memory; use \"nvme\" or \"none\"");
  if (plan.offload.optimizer != "nvme" && plan.offload.params != "nvme") return {};
  int files = 0;
  const uint64_t per_rank = swap_file_bytes(plan, world, &files);
  std::ostringstream detail;
  detail << format_bytes(double(per_rank)) << " per rank in " << files << " files x " << local_world
         << " rank(s) on this host, as ./train estimate reports";
  const offload::NvmeDir d = offload::check_nvme_dir(plan.offload.nvme_dir, per_rank * uint64_t(local_world), detail.str());
  // Said by the rank that removed them (one per host), before the banner: the next line may be a refusal.
  if (!d.removed.empty()) {
    std::printf("%s\n", d.removed.c_str());
    std::fflush(stdout);
  }
  return swap_spec_of(plan.offload, rank, d.direct);
}

std::string describe_offload(const offload::SwapSpec& spec, const Plan& plan, int world, bool host_backend) {
  if (!spec.enabled()) return "";
  int files = 0;
  uint64_t pool = 0;
  const uint64_t per_rank = swap_file_bytes(plan, world, &files, &pool);
  const offload::Uring probe(1);
  std::ostringstream os;
  // The CUDA backend's AdamW on the device keeps the gradient shard there (zero/store.cpp).
  const bool device_adamw = !host_backend && !spec.optimizer;
  const char* what = spec.optimizer && spec.params ? "optimizer state, parameter and gradient shards"
                     : device_adamw                ? "parameter shard"
                     : spec.params                ? "parameter and gradient shards"
                                                  : "optimizer state";
  os << "offload: " << what << " on disk, " << files << (files == 1 ? " swap file of " : " swap files of ") << format_bytes(double(per_rank) / files)
     << " per rank in " << spec.dir << " (" << (spec.direct ? "O_DIRECT" : "buffered: the filesystem refused O_DIRECT")
     << ", " << (probe.available() ? "io_uring" : "synchronous pread/pwrite: io_uring is not permitted here")
     << ")";
  if (device_adamw) {
    os << "; each unit's shard read before its all-gather, and read, updated on the device and written back "
          "at the step";
    return os.str();
  }
  os << "; sub-groups of " << format_bytes(double(spec.subgroup_numel) * 4) << " per state, " << spec.buffer_count
     << " buffer sets, queue depth " << spec.queue_depth;
  // Legal, but the run then keeps more host memory than it moved to disk.
  if (pool >= per_rank)
    os << "\nnote: the " << format_bytes(double(pool)) << " host pool is as large as the state it streams; lower "
       << "offload.subgroup_mb, or offload only larger shards";
  return os.str();
}

}  // namespace zt
