// Explicit training state (docs/design.md §3.9): everything a run needs to continue at a step, so
// the loop is built from a TrainState and can start at any step.
//
//   step           the next optimizer step (= steps done = AdamW's t)
//   seed           run.seed. Every RNG is counter-based on it: parameter init (seed, tensor,
//                  element), the data order (seed, epoch) and sampling (seed, step), so (seed, step)
//                  is the whole RNG state.
//   next_sequence  the data loader's position: the global index of the next training sequence
//                  (step x global batch; the loader is a pure function of it, data/loader.h)
//   buffers        the store's persistent buffers (parameters or parameter shard, AdamW moments,
//                  master weights: StateBuffer::persistent), copied to host memory by capture_buffers().
//                  In a running trainer the live views are the store's own buffers; offloaded
//                  ones (Tier::nvme) are read from and written to their swap files.
//
// capture_buffers() and restore_buffers() are the in-memory form of a checkpoint; src/checkpoint/
// writes the same state to sharded files (§3.7).
#pragma once
#include <cstdint>
#include <cstring>
#include <vector>

#include "runtime/error.h"
#include "zero/store.h"

namespace zt {

struct TrainState {
  int64_t step = 0;
  uint64_t seed = 0;
  int64_t next_sequence = 0;
  struct Saved {
    StateId id;
    std::vector<unsigned char> bytes;
  };
  std::vector<Saved> buffers;
};

// The store's persistent buffers into host memory (device memory crosses through Ops::d2h).
template <class Ops>
void capture_buffers(const StateStore& store, TrainState& st) {
  st.buffers.clear();
  for (const StateBuffer& b : store.list()) {
    if (!b.persistent) continue;
    TrainState::Saved s{b.id, std::vector<unsigned char>(b.bytes())};
    if (offload::SwapFile* f = store.file(b.id)) f->read_all(s.bytes.data());
    else if (b.tier == Tier::device) Ops::d2h(s.bytes.data(), store.raw(b.id), b.bytes());
    else std::memcpy(s.bytes.data(), store.raw(b.id), b.bytes());  // pinned: the CUDA host optimizer's
    st.buffers.push_back(std::move(s));
  }
}

// The saved buffers back into a store built for the same plan and rank; refuses a state whose
// buffers do not match the store's list one for one.
template <class Ops>
void restore_buffers(const TrainState& st, StateStore& store) {
  size_t i = 0;
  for (const StateBuffer& b : store.list()) {
    if (!b.persistent) continue;
    ZT_REQUIRE(i < st.buffers.size() && st.buffers[i].id == b.id && st.buffers[i].bytes.size() == b.bytes(),
               "train state: saved buffers do not match this plan's " << b.name() << " (" << b.bytes() << " bytes)");
    if (offload::SwapFile* f = store.file(b.id)) f->write_all(st.buffers[i].bytes.data());
    else if (b.tier == Tier::device) Ops::h2d(store.raw(b.id), st.buffers[i].bytes.data(), b.bytes());
    else std::memcpy(store.raw(b.id), st.buffers[i].bytes.data(), b.bytes());
    ++i;
  }
  ZT_REQUIRE(i == st.buffers.size(), "train state: " << st.buffers.size() - i << " saved buffer(s) this plan does not keep");
}

}  // namespace zt
