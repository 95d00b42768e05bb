#include "zero/store.h"

#include <algorithm>
#include <filesystem>
#include <string>

#include "offload/swap_pipeline.h"
#include "runtime/checked.h"

namespace zt {

const char* state_name(StateId id) {
  switch (id) {
    case StateId::params: return "parameters";
    case StateId::grads: return "gradients";
    case StateId::param_shard: return "parameter shard";
    case StateId::grad_shard: return "gradient shard";
    case StateId::adam_m: return "AdamW first moment";
    case StateId::adam_v: return "AdamW second moment";
    case StateId::master: return "master weights";
    case StateId::embedding_staging: return "embedding gradient staging";
    case StateId::bucket_staging: return "bucket gradient staging";
    case StateId::rs_receive: return "reduce-scatter receive";
    case StateId::gathered_units: return "gathered units";
    case StateId::swap_buffers: return "optimizer swap buffers";
    case StateId::lookup_exchange: return "embedding lookup exchange";
    case StateId::param_io: return "parameter and gradient read buffers";
    case StateId::host_mirrors: return "collective host staging";
    case StateId::host_params: return "host parameter shard";
    case StateId::host_grads: return "host gradient shard";
    case StateId::param_upload: return "parameter shard upload buffers";
    case StateId::count: break;
  }
  ZT_ASSERT(false);
  return "";
}

size_t dtype_bytes(DType t) { return t == DType::bf16 ? 2 : 4; }

namespace {
const char* const kStateSize = "model: model-state buffer size (elements)";

// Every tensor, whole, in layout order.
std::vector<TensorRange> whole(const ParamLayout& layout) {
  std::vector<TensorRange> out;
  for (size_t k = 0; k < layout.tensors().size(); ++k)
    out.push_back({int(k), 0, layout.tensors()[k].numel, layout.tensors()[k].offset});
  return out;
}

// My shard of each unit, cut into the tensors it overlaps (a shard may cut through a tensor).
std::vector<TensorRange> shard(const ParamLayout& layout, const Partition& part) {
  std::vector<TensorRange> out;
  for (int u = 0; u < layout.num_units(); ++u) {
    const Unit& unit = layout.units()[size_t(u)];
    const size_t b = unit.offset + part.unit_shard_begin(u), e = b + part.unit_shard_numel(u);
    for (int k : unit.tensors) {
      const TensorSlot& s = layout.tensors()[size_t(k)];
      const size_t lo = std::max(b, s.offset), hi = std::min(e, s.offset + s.numel);
      if (lo < hi) out.push_back({k, lo - s.offset, hi - lo, part.unit_shard_flat(u) + (lo - b)});
    }
  }
  return out;
}
}  // namespace

size_t param_read_numel(size_t shard_numel, size_t elem_bytes) {
  // A shard starts anywhere in a block: the blocks it touches, plus one for the start's offset.
  return (offload::io_round_up(shard_numel * elem_bytes) + offload::kIoAlign) / elem_bytes;
}

size_t param_io_offset(const Partition& part, size_t i) {
  const size_t N = size_t(part.config().world);
  size_t at = 0;
  for (size_t k = 0; k < i && k < part.gather_slots(); ++k) at += param_read_numel(part.gather_slot_numel(k) / N, part.config().elem_bytes);
  return at;
}

size_t param_upload_offset(const Partition& part, size_t i) {
  size_t at = 0;
  for (size_t k = 0; k < i && k < part.gather_slots(); ++k) at += part.gather_slot_numel(k) / size_t(part.config().world);
  return at;
}

size_t param_io_numel(const Partition& part, bool grads_on_disk) {
  if (!grads_on_disk) return param_io_offset(part, part.gather_slots());
  // The largest gradient shard completed at once: a bucket's, or a one-unit embedding's.
  const size_t N = size_t(part.config().world);
  const size_t grad = std::max(part.staging_slot_numel(), part.embedding_staging_numel()) / N;
  return param_io_offset(part, part.gather_slots()) + param_read_numel(grad, part.config().elem_bytes);
}
std::vector<StateId> host_mirrored(int stage) {
  switch (stage) {
    case 0: return {StateId::grads};
    case 1: return {StateId::params, StateId::grads, StateId::grad_shard};
    case 2: return {StateId::params, StateId::embedding_staging, StateId::bucket_staging, StateId::rs_receive};
    default: return {StateId::param_shard, StateId::param_upload, StateId::embedding_staging, StateId::bucket_staging, StateId::rs_receive,
                     StateId::gathered_units};
  }
}
std::vector<MirroredRegion> host_mirror_regions(const StateStore& store, DType elem, int stage) {
  std::vector<MirroredRegion> regions;
  float* host = store.get<float>(StateId::host_mirrors);
  if (!host) return regions;  // a world of one: device-to-device copies, no mirror
  for (StateId id : host_mirrored(stage)) {
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
  if (ty.tier != Tier::device || !ty.host_mirror_comm || part.config().world == 1) return;
  size_t n = 0;
  for (StateId id : host_mirrored(part.config().stage))
    for (const StateBuffer& b : out)
      if (b.id == id && b.tier == Tier::device) n = checked_add(n, b.numel, "model: collective host staging (elements)");
  out.push_back({StateId::host_mirrors, Category::comm, DType::f32, Tier::pinned, n, false, {}});
  checked_mul(n, size_t(4), "model: bytes of the collective host staging");
}
}  // namespace

std::vector<StateBuffer> list_model_state(const ParamLayout& layout, const Partition& part, const StateTypes& ty,
                                          const offload::SwapSpec& swap) {
  const size_t psi = part.total(), sh = part.shard_total(), N = size_t(part.config().world);
  const int s = part.config().stage;
  std::vector<StateBuffer> out;
  auto add = [&](StateId id, Category cat, DType dt, size_t numel, bool persistent, std::vector<TensorRange> holds) {
    out.push_back({id, cat, dt, ty.tier, numel, persistent, std::move(holds)});
    checked_mul(numel, dtype_bytes(dt), std::string("model: bytes of the ") + state_name(id));
  };
  // What the optimizer owns: everything at stage 0, my shard of every unit otherwise.
  auto owned = [&] { return s == 0 ? whole(layout) : shard(layout, part); };
  const size_t mv = s == 0 ? psi : sh;

  if (s <= 2) add(StateId::params, Category::params, ty.param, psi, true, whole(layout));
  if (s <= 1) add(StateId::grads, Category::grads, ty.param, psi, false, whole(layout));
  if (s == 3) add(StateId::param_shard, Category::params, ty.param, sh, true, shard(layout, part));
  if (s >= 1) add(StateId::grad_shard, Category::grads, ty.param, sh, false, shard(layout, part));
  add(StateId::adam_m, Category::optimizer, ty.state, mv, true, owned());
  add(StateId::adam_v, Category::optimizer, ty.state, mv, true, owned());
  if (ty.state != ty.param) add(StateId::master, Category::master, ty.state, mv, true, owned());
  if (s >= 2) {
    const size_t p0 = part.embedding_staging_numel();
    const size_t staging = checked_mul(part.staging_slots(), part.staging_slot_numel(), kStateSize);
    if (p0 > 0) add(StateId::embedding_staging, Category::comm, ty.param, p0, false, {});
    add(StateId::bucket_staging, Category::comm, ty.param, staging, false, {});
    add(StateId::rs_receive, Category::comm, ty.param, checked_add(staging / N, p0 / N, kStateSize), false, {});
  }
  if (part.lookup_exchange_numel() > 0)
    add(StateId::lookup_exchange, Category::comm, ty.param, part.lookup_exchange_numel(), false, {});
  if (s == 3)
    add(StateId::gathered_units, Category::comm, ty.param, part.gather_slots_numel(), false, {});
  if (swap.enabled()) {
    // Only a shard is swapped (the plan refuses stage 0, and parameters below stage 3): one flat
    // range per state, streamed in sub-groups through a pool of buffer_count sets
    // (offload/swap_pipeline.h).
    ZT_ASSERT(s >= 1 && ty.state == DType::f32 && (!swap.params || (s == 3 && !ty.host_shards)));
    // The CUDA backend's AdamW on the device (offload.params "nvme", offload.optimizer "none"): only
    // the parameter shard goes to disk; the gradient shard stays where that AdamW reads it, and each
    // unit's parameter shard is staged through a gathered-unit slot for its update (no pipeline).
    const bool device_adamw = ty.tier == Tier::device && !ty.host_optimizer;
    int states = 0;
    for (StateBuffer& b : out) {
      const bool opt = b.cat == Category::optimizer || b.cat == Category::master;
      const bool par = b.id == StateId::param_shard || (b.id == StateId::grad_shard && !device_adamw);
      if ((swap.optimizer && opt) || (swap.params && par)) b.tier = Tier::nvme, ++states;
    }
    if (!device_adamw) {  // the pool the optimizer pipeline streams its swapped states through
      add(StateId::swap_buffers, Category::staging, ty.state, offload::pool_numel(swap, sh, states), false, {});
      out.back().tier = Tier::host;
    }
    if (swap.params) {  // pinned on the CUDA backend: its reads go on to the device, its sums come back
      add(StateId::param_io, Category::staging, ty.param, param_io_numel(part, !device_adamw), false, {});
      out.back().tier = ty.tier == Tier::device ? Tier::pinned : Tier::host;
      if (ty.tier == Tier::device && N > 1)  // the all-gathers' device send buffers, as for "cpu"
        add(StateId::param_upload, Category::comm, ty.param, param_upload_offset(part, part.gather_slots()), false, {});
    }
  }
  add_host_shards(out, part, ty);
  add_host_optimizer(out, part, ty);
  add_host_mirrors(out, part, ty);
  return out;
}

StateStore::StateStore(std::vector<StateBuffer> list, MemoryTracker& mem, const offload::SwapSpec& swap)
    : list_(std::move(list)), swap_(swap) {
  index_.fill(-1);
  for (size_t i = 0; i < list_.size(); ++i) {
    const StateBuffer& b = list_[i];
    ZT_ASSERT(index_[size_t(b.id)] < 0);
    index_[size_t(b.id)] = int(i);
    // The pool is read into with O_DIRECT: whole I/O blocks, aligned.
    const bool io = b.id == StateId::swap_buffers || b.id == StateId::param_io;
    const size_t align = io ? offload::kIoAlign : MemoryTracker::kAlign;
    alloc_[size_t(b.id)] = mem.alloc(b.bytes(), b.tier, b.cat, b.name(), align);
    if (b.tier != Tier::nvme) continue;
    ZT_ASSERT(swap_.enabled());
    if (!std::filesystem::is_directory(swap_.dir)) {
      std::error_code ec;
      std::filesystem::create_directories(swap_.dir, ec);
      if (ec) fail_at(__FILE__, __LINE__, "create_directories(\"" + swap_.dir + "\"): " + ec.message());
    }
    const std::string tag = b.id == StateId::adam_m        ? "adam_m"
                            : b.id == StateId::adam_v      ? "adam_v"
                            : b.id == StateId::param_shard ? "param"
                            : b.id == StateId::grad_shard  ? "grad"
                                                           : "master";
    files_[size_t(b.id)] = std::make_unique<offload::SwapFile>(offload::swap_file_path(swap_.dir, swap_.rank, tag),
                                                               b.bytes(), swap_.direct);
  }
}

}  // namespace zt
