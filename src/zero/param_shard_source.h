// Where stage 3's parameter gatherer gets unit u's parameter shard (docs/design.md §3.4, §3.6): a
// strategy beside ParamGatherer, which asks for a shard where it would start the all-gather and
// starts it when the shard is delivered, wherever the shard lives:
//
//   memory  the backend's memory: delivered at once (no offload).
//   nvme    offload.params "nvme": a swap file, read into the slot's read buffer
//           (offload/shard_source.h) and delivered at a later hook; on the CUDA backend the read
//           goes on to the device at delivery (to_device), on a copy stream of its own.
//   pinned  offload.params "cpu" on the CUDA backend: pinned host memory, copied on the copy stream
//           into the slot's device upload buffer (StateId::param_upload; not the slot itself,
//           which the kernels of the unit before may still read); the all-gather starts from there
//           at delivery, the compute stream ordered after the copy. A world of one has no
//           all-gather to feed: the shard is copied into its slot itself.
//
// A copy or a read overlaps one unit's compute, as the all-gather does with prefetch.
#pragma once
#include <functional>
#include <memory>
#include <vector>

#include "model/layout.h"
#include "offload/shard_source.h"
#include "zero/partition.h"
#include "zero/store.h"

namespace zt {

template <class Ops>
class ParamShardSource {
 public:
  using T = typename Ops::T;
  // The gatherer's all-gather of the shard delivered for gather slot `slot` (device memory).
  using Launch = std::function<void(int slot, const T* shard)>;

  // slots: the gather slots' buffers (a world of one copies into them).
  ParamShardSource(const ParamLayout& layout, const Partition& part, StateStore& store, std::vector<T*> slots,
                   Launch launch);
  ~ParamShardSource();

  // Unit u's shard for gather slot `slot` (start of a gather): launched now from memory, at a later
  // deliver() otherwise.
  void request(int u, int slot);
  // Once per hook: launches what arrived (offload::ShardSource::deliver; through: -1 or the slot
  // needed now).
  void deliver(int through);
  // Unit u's shard now, on the device, through slot `slot` (between passes).
  const T* now(int u, int slot);

 private:
  void use_copy_stream();  // pinned: the shard source copies from pinned memory
  const T* to_device(int slot, int u, const T* shard);  // nvme on the CUDA backend

  const Partition& part_;
  StateStore& store_;
  std::vector<T*> slots_;
  std::vector<int> unit_of_;  // per slot: the unit requested into it
  offload::ShardSource<T> shards_;
  typename offload::ShardSource<T>::Deliver arrived_;  // launch, through to_device where needed
  struct CopyStream;  // pinned / nvme (CUDA): the host-to-device copies of the shards
  std::unique_ptr<CopyStream> copies_;
  bool read_to_device_ = false;  // nvme on the CUDA backend: each read goes on to the device
};

}  // namespace zt
