// The CUDA backend's tier moves (docs/design.md §3.6): which of list_model_state's buffers go to
// pinned host memory (offload.params / offload.optimizer "cpu"), the host buffers that come with
// them, and the pinned mirrors of the buffers collectives touch (MPI under the CUDA backend).
#include <vector>

#include "runtime/checked.h"
#include "zero/store.h"

namespace zt {

std::vector<StateId> host_mirrored(int stage, bool replicas) {
  std::vector<StateId> ids;
  switch (stage) {
    case 0: ids = {StateId::grads}; break;
    case 1: ids = {StateId::params, StateId::grads, StateId::grad_shard}; break;
    case 2: ids = {StateId::params, StateId::embedding_staging, StateId::bucket_staging, StateId::rs_receive}; break;
    default:
      ids = {StateId::param_shard,    StateId::param_upload, StateId::embedding_staging, StateId::bucket_staging,
             StateId::rs_receive, StateId::gathered_units};
  }
  // Hybrid sharding: the gradient shard is summed across the replicas (zero/data_mesh.h).
  if (replicas && stage >= 2) ids.push_back(StateId::grad_shard);
  return ids;
}
std::vector<MirroredRegion> host_mirror_regions(const StateStore& store, DType elem, int stage, bool replicas) {
  std::vector<MirroredRegion> regions;
  float* host = store.get<float>(StateId::host_mirrors);
  if (!host) return regions;  // a world of one: device-to-device copies, no mirror
  for (StateId id : host_mirrored(stage, replicas)) {
    // offload.params "cpu" / "nvme": the shard itself is not a collective's (its upload buffers are)
    if (!store.has(id) || store.info(id).tier == Tier::pinned || store.info(id).tier == Tier::nvme) continue;
    const StateBuffer& b = store.info(id);
    ZT_ASSERT(b.dtype == elem && b.tier == Tier::device);
    regions.push_back({store.raw(id), b.numel, host});
    host += b.numel;
  }
  ZT_ASSERT(host == store.get<float>(StateId::host_mirrors) + store.info(StateId::host_mirrors).numel);
  return regions;
}

namespace {
// CUDA backend with offload.params "cpu" (stage 3, docs/design.md §3.6): my parameter shard lives in
// pinned host memory; a unit's shard goes to the device through param_upload for its all-gather
// (world > 1; a world of one copies it into its slot). The gradient shard joins it when the AdamW
// runs on the host (add_host_optimizer); with the optimizer on the device it stays there, where the
// AdamW reads it, and each unit's parameter shard is staged through a gathered-unit slot for its update.
void add_host_shards(std::vector<StateBuffer>& out, const Partition& part, const StateTypes& ty) {
  if (!ty.host_shards) return;
  ZT_ASSERT(ty.tier == Tier::device && part.config().stage == 3);
  for (StateBuffer& b : out)
    if (b.id == StateId::param_shard || (ty.host_optimizer && b.id == StateId::grad_shard)) b.tier = Tier::pinned;
  if (part.config().world > 1)
    out.push_back({StateId::param_upload, Category::comm, ty.param, Tier::device,
                   param_upload_offset(part, part.gather_slots()), false, {}});
}

// CUDA backend with offload.optimizer "cpu" / "nvme" (docs/design.md §3.6): the CPU AdamW updates
// pinned host copies of my parameter and gradient shard (with offload.params "cpu": the shards
// themselves); the moments and master weights are pinned host memory unless already swapped to files.
void add_host_optimizer(std::vector<StateBuffer>& out, const Partition& part, const StateTypes& ty) {
  if (!ty.host_optimizer) return;
  ZT_ASSERT(ty.tier == Tier::device && part.config().stage >= 1);
  for (StateBuffer& b : out)
    if ((b.cat == Category::optimizer || b.cat == Category::master) && b.tier == Tier::device) b.tier = Tier::pinned;
  // The shards themselves are what it updates: pinned (offload.params "cpu") or streamed from their
  // swap files (offload.params "nvme").
  for (const StateBuffer& b : out)
    if (b.id == StateId::param_shard && b.tier != Tier::device) return;
  const size_t sh = part.shard_total();
  out.push_back({StateId::host_params, Category::staging, ty.param, Tier::pinned, sh, false, {}});
  out.push_back({StateId::host_grads, Category::staging, ty.param, Tier::pinned, sh, false, {}});
}

// CUDA backend, several ranks: the MPI comm sees host memory only, so every buffer a collective
// touches gets a pinned fp32 mirror (bf16 is widened there and summed in fp32), carved in
// host_mirrored() order from one allocation. A world of one sends nothing and needs none; NCCL needs none.
void add_host_mirrors(std::vector<StateBuffer>& out, const Partition& part, const StateTypes& ty) {
  const bool replicas = part.config().replicas > 1;
  if (ty.tier != Tier::device || !ty.host_mirror_comm || (part.config().world == 1 && !replicas)) return;
  size_t n = 0;
  for (StateId id : host_mirrored(part.config().stage, replicas))
    for (const StateBuffer& b : out)
      if (b.id == id && b.tier == Tier::device) n = checked_add(n, b.numel, "model: collective host staging (elements)");
  out.push_back({StateId::host_mirrors, Category::comm, DType::f32, Tier::pinned, n, false, {}});
  checked_mul(n, size_t(4), "model: bytes of the collective host staging");
}

}  // namespace

void move_to_host_tiers(std::vector<StateBuffer>& out, const Partition& part, const StateTypes& ty) {
  add_host_shards(out, part, ty);
  add_host_optimizer(out, part, ty);
  add_host_mirrors(out, part, ty);
}

}  // namespace zt
