// A rank's model-state store to and from a checkpoint (docs/design.md §3.7, §3.9): the store's
// persistent buffers (parameters or their shard, AdamW moments, master weights) with the global
// ranges each holds, and the backend's copy functions (device memory crosses through Ops::d2h/h2d).
#pragma once
#include <utility>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "offload/swap_file.h"
#include "model/gpt.h"
#include "zero/store.h"

namespace zt::ckpt {

// The store's persistent buffers as checkpoint buffers. Offloaded ones (Tier::nvme, docs/design.md
// §3.6) have no memory of their own: the save reads them from their swap files and the load writes
// them there, range by range through one bounce buffer (never a host copy of the whole state). Only
// Tier::device buffers cross through the backend's copy functions; pinned ones (the CUDA backend's
// host optimizer) are host memory, read and written in place.
inline std::vector<Buffer> persistent_buffers(const StateStore& store) {
  std::vector<Buffer> out;
  for (const StateBuffer& b : store.list()) {
    if (!b.persistent) continue;
    Buffer c{kind_of(b.id), b.dtype, store.raw(b.id), b.holds, b.tier == Tier::device, {}, {}};
    if (offload::SwapFile* f = store.file(b.id)) {
      c.base = nullptr, c.in_backend_memory = false;
      c.read_range = [f](void* dst, size_t n, size_t off) { f->read_at(dst, n, off); };
      c.write_range = [f](const void* src, size_t n, size_t off) { f->write_at(src, n, off); };
    }
    out.push_back(std::move(c));
  }
  return out;
}

// The backend's copy functions, or nullptr for host memory (CopyFn).
template <class Ops>
constexpr CopyFn d2h_of() { return Ops::tier == Tier::host ? nullptr : &Ops::d2h; }
template <class Ops>
constexpr CopyFn h2d_of() { return Ops::tier == Tier::host ? nullptr : &Ops::h2d; }

template <class Ops>
Transfer save_store(Comm& comm, const CheckpointSection& c, const Meta& meta, const ParamLayout& layout,
                    const StateStore& store, const Progress& progress = {}) {
  return save(comm, c.dir, c.keep, size_t(c.chunk_mb * 1048576.0), meta, layout, persistent_buffers(store),
              d2h_of<Ops>(), progress);
}

// fp32 -> the backend's bf16 parameters (GPT::upload rounds to nearest even), or nullptr.
template <class Ops>
constexpr ToBf16Fn to_bf16_of() {
  if constexpr (sizeof(typename Ops::T) == 2)
    return [](void* dst, const float* src, size_t n) { GPT<Ops>::upload(static_cast<typename Ops::T*>(dst), src, n); };
  else
    return nullptr;
}

template <class Ops>
Transfer load_store(const std::string& step_dir, const Plan& plan, int world, const ParamLayout& layout,
                    StateStore& store, Meta& got) {
  return load(step_dir, plan, world, layout, persistent_buffers(store), h2d_of<Ops>(), to_bf16_of<Ops>(), got);
}

}  // namespace zt::ckpt
