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
// §3.6) have no memory of their own: they are staged through host memory for the save or the load,
// one host copy of the rank's offloaded state while the checkpoint runs. Only Tier::device buffers
// cross through the backend's copy functions; pinned ones (the CUDA backend's host optimizer) and
// staged ones are host memory.
struct StoreBuffers {
  std::vector<Buffer> list;
  std::vector<std::pair<offload::SwapFile*, std::vector<char>>> staged;
  void write_back() {
    for (auto& [file, bytes] : staged) file->write_all(bytes.data());
  }
};

inline StoreBuffers persistent_buffers(const StateStore& store, bool read_swapped) {
  StoreBuffers out;
  for (const StateBuffer& b : store.list()) {
    if (!b.persistent) continue;
    void* base = store.raw(b.id);
    if (offload::SwapFile* f = store.file(b.id)) {
      out.staged.emplace_back(f, std::vector<char>(b.bytes()));
      if (read_swapped) f->read_all(out.staged.back().second.data());
      base = out.staged.back().second.data();
    }
    const bool staged = store.file(b.id) != nullptr;
    out.list.push_back(Buffer{kind_of(b.id), b.dtype, base, b.holds, b.tier == Tier::device && !staged});
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
  const StoreBuffers b = persistent_buffers(store, /*read_swapped=*/true);
  return save(comm, c.dir, c.keep, meta, layout, b.list, d2h_of<Ops>(), progress);
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
  StoreBuffers b = persistent_buffers(store, /*read_swapped=*/false);
  const Transfer t = load(step_dir, plan, world, layout, b.list, h2d_of<Ops>(), to_bf16_of<Ops>(), got);
  b.write_back();
  return t;
}

}  // namespace zt::ckpt
