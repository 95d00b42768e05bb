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
  move_to_host_tiers(out, part, ty);  // zero/store_tiers.cpp
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
