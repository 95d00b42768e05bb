// The model-state store (docs/design.md §3.9): every model-state buffer of a rank, listed once.
//
// Each buffer has a typed name (StateId, never a string), an element type, a tier, and the global
// (tensor, offset, count) ranges of the parameter layout it holds. list_model_state() computes the
// list from the layout and the partition without allocating; StateStore allocates exactly that list
// through the MemoryTracker. `train estimate` prints the same list, so "estimate = tracked" holds
// by construction (and test/zero/zero_equivalence.py, memory_formulas.py check it per category).
//
//   id                 stage  elements       holds (global ranges)
//   params             0-2    Ψ              every tensor, whole
//   grads              0-1    Ψ              every tensor, whole
//   param_shard        3      Ψ/N            my shard of each unit
//   grad_shard         1-3    Ψ/N            my shard of each unit
//   adam_m, adam_v     0-3    Ψ (0), Ψ/N     what the optimizer owns: everything (stage 0), my shard
//   master             0-3    as adam_m      fp32 copy of the owned parameters (mixed precision only)
//   embedding_staging  2-3    P_0            communication slot: the embedding's gradient while it is one
//                                            unit (stage 2; stage 3 only when wte fits one block)
//   bucket_staging     2-3    slots x bucket communication slots: bucket gradients (stage 3: blocks and
//                                            the embedding's block-sized row chunks)
//   rs_receive         2-3    (...)/N        communication slot: reduce-scatter results
//   gathered_units     3      (prefetch + 1) x max(block, chunk)   communication slots: gathered units
//   swap_buffers       1-3    B x S x sub-group          offload nvme: the optimizer pipeline's pool
//   param_io           3      one read buffer per gathered-unit slot + one gradient bucket shard
//                                            (each in whole I/O blocks): offload.params nvme (no
//                                            gradient part with the CUDA backend's AdamW on the device,
//                                            whose gradient shard stays on the device)
//   host_mirrors       0-3    sum of the buffers collectives touch (fp32)   CUDA backend, world > 1, MPI:
//                                            pinned host mirrors the MPI comm reads and writes
//                                            (comm/host_mirror_comm.h; host_mirrored() says which buffers)
//   host_params,       1-3    Ψ/N            CUDA backend with offload.optimizer cpu / nvme: pinned host
//   host_grads                               copies of my parameter and gradient shard, which the CPU
//                                            AdamW reads and writes (the moments and master weights are
//                                            then Tier::pinned, or Tier::nvme for "nvme")
//   param_upload       3      slots' shards  CUDA backend with offload.params "cpu" (param_shard is then
//                                            Tier::pinned, and grad_shard too with the CPU AdamW, which
//                                            updates them in place: no host_params / host_grads), world > 1:
//                                            the device buffers a unit's shard is copied into for its
//                                            all-gather, one per gathered-unit slot
//
// Communication slots hold no fixed range (their contents change within a step); the persistent
// buffers (parameters or parameter shard, moments, master weights) are the training state that a
// TrainState captures and restores (train/state.h). Everything lives in the backend's tier, except
// with offload.optimizer "nvme" (docs/design.md §3.6): the moments and master weights are Tier::nvme,
// one swap file each (no memory; get() gives nullptr, file() the file), and swap_buffers is the
// host pool the optimizer streams them through. With offload.params "nvme" (stage 3) the parameter
// shard and the gradient shard are swap files too, and param_io holds the blocks they are read
// into (a unit's shard before its all-gather; a bucket's gradient shard as it is accumulated).
#pragma once
#include <array>
#include <cstddef>
#include <memory>
#include <vector>

#include "comm/host_mirror_comm.h"
#include "model/layout.h"
#include "offload/swap_file.h"
#include "runtime/error.h"
#include "runtime/memory.h"
#include "zero/partition.h"

namespace zt {

enum class StateId : int {
  params = 0, grads, param_shard, grad_shard, adam_m, adam_v, master,
  embedding_staging, bucket_staging, rs_receive, gathered_units, swap_buffers, lookup_exchange, param_io,
  host_mirrors, host_params, host_grads, param_upload, count
};
constexpr size_t kNumStateIds = size_t(StateId::count);
const char* state_name(StateId id);  // for tables and messages: "AdamW first moment", ...

enum class DType : int { f32 = 0, bf16 };
size_t dtype_bytes(DType t);

// Elements [offset, offset + count) of layout tensor `tensor`, held at element `at` of a buffer.
struct TensorRange {
  int tensor;
  size_t offset, count;
  size_t at;
};

struct StateBuffer {
  StateId id;
  Category cat;
  DType dtype;
  Tier tier;
  size_t numel;
  bool persistent;                  // training state (captured and restored), not a working buffer
  std::vector<TensorRange> holds;   // in buffer order; empty for communication slots
  size_t bytes() const { return numel * dtype_bytes(dtype); }
  const char* name() const { return state_name(id); }
};

// Element types and tier of a backend: parameters / gradients / communication in `param`,
// optimizer moments and master weights in `state` (master exists iff they differ).
struct StateTypes {
  DType param = DType::f32;
  DType state = DType::f32;
  Tier tier = Tier::host;
  // The CUDA backend's optimizer runs on the host (offload.optimizer "cpu" or "nvme"): moments and
  // master weights in pinned memory (or swap files), plus host_params / host_grads.
  bool host_optimizer = false;
  // offload.params "cpu" on the CUDA backend (stage 3): my parameter shard lives in pinned host
  // memory (zero/param_gatherer.h), and with host_optimizer my gradient shard too (zero/grad_reducer.h).
  bool host_shards = false;
  // The CUDA backend's collectives are over MPI through host mirrors (comm/host_mirror_comm.h, host_mirrors below);
  // false: NCCL on the device buffers, no host copies (comm.backend "nccl").
  bool host_mirror_comm = true;
};

// The types of an op table (Ops::T, Ops::M, Ops::tier): 2-byte elements are bf16.
template <class Ops>
StateTypes state_types_of() {
  auto dtype = [](size_t bytes) { return bytes == 2 ? DType::bf16 : DType::f32; };
  return StateTypes{dtype(sizeof(typename Ops::T)), dtype(sizeof(typename Ops::M)), Ops::tier};
}

// The buffers a rank keeps for the partition's stage, in allocation order. Throws when a size does
// not fit in 64 bits. swap.optimizer (stages 1-3) moves the optimizer state to Tier::nvme,
// swap.params (stage 3) the parameter and gradient shards.
std::vector<StateBuffer> list_model_state(const ParamLayout& layout, const Partition& part, const StateTypes& types,
                                          const offload::SwapSpec& swap = {});

// The CUDA backend's moves to pinned host memory (offload.params / offload.optimizer "cpu") and
// the collectives' host mirrors, applied last by list_model_state (zero/store_tiers.cpp).
void move_to_host_tiers(std::vector<StateBuffer>& out, const Partition& part, const StateTypes& types);

// offload.params "nvme": elements (of elem_bytes) of one read buffer that holds any unit shard of
// `shard_numel` elements at any flat offset (whole blocks around it), and of all of param_io.
size_t param_read_numel(size_t shard_numel, size_t elem_bytes);
size_t param_io_numel(const Partition& part, bool grads_on_disk = true);
// Where param_io's parts start: the read buffer of gathered slot i (i < gather_slots()), and
// the gradient buffer (i == gather_slots()).
size_t param_io_offset(const Partition& part, size_t i);
// offload.params "cpu" (CUDA): where param_upload's part for gathered slot i starts (i ==
// gather_slots(): its size).
size_t param_upload_offset(const Partition& part, size_t i);
// The device buffers whose collectives go through host mirrors on the CUDA backend over MPI
// (comm/host_mirror_comm.h), in the order host_mirrors mirrors them (those of them in pinned memory
// need no mirror): stage 0 all-reduces gradients; stage 1 reduce-scatters
// them into the gradient shard and all-gathers parameters; stage 2 reduce-scatters staging slots
// into rs_receive and all-gathers parameters; stage 3 gathers the parameter shard (or its upload
// buffers) into slots.
std::vector<StateId> host_mirrored(int stage, bool replicas = false);
class StateStore;
// Those buffers of `store` (elements of type elem), each with its part of host_mirrors: what a
// HostMirrorComm is given. None for a world of one (no host_mirrors).
std::vector<MirroredRegion> host_mirror_regions(const StateStore& store, DType elem, int stage, bool replicas = false);

// Owns the buffers of one rank's list (zero-filled, tracked); Tier::nvme buffers are swap files in
// swap.dir (created here, removed with the store).
class StateStore {
 public:
  StateStore(std::vector<StateBuffer> list, MemoryTracker& mem, const offload::SwapSpec& swap = {});

  bool has(StateId id) const { return index_[size_t(id)] >= 0; }
  const StateBuffer& info(StateId id) const {
    ZT_ASSERT(has(id));
    return list_[size_t(index_[size_t(id)])];
  }
  // The buffer as X*, nullptr when this stage has none. X must match the listed element type.
  template <class X>
  X* get(StateId id) const {
    if (!has(id)) return nullptr;
    ZT_ASSERT(sizeof(X) == dtype_bytes(info(id).dtype));
    return alloc_[size_t(id)].as<X>();
  }
  void* raw(StateId id) const { return has(id) ? alloc_[size_t(id)].data() : nullptr; }
  const std::vector<StateBuffer>& list() const { return list_; }
  // The swap file of a Tier::nvme buffer, nullptr otherwise.
  offload::SwapFile* file(StateId id) const { return files_[size_t(id)].get(); }
  const offload::SwapSpec& swap_spec() const { return swap_; }

 private:
  std::vector<StateBuffer> list_;
  std::array<int, kNumStateIds> index_;
  std::array<Allocation, kNumStateIds> alloc_;
  offload::SwapSpec swap_;
  std::array<std::unique_ptr<offload::SwapFile>, kNumStateIds> files_;
};

}  // namespace zt
