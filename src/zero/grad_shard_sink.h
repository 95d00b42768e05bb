// Where a bucket's reduce-scatter result is added into my gradient shard (stages 2-3,
// docs/design.md §3.4, §3.6): a strategy beside GradReducer, wherever the shard lives.
//
//   memory  the backend's memory: += on the compute stream (begin_step() zeroes it).
//   nvme    offload.params "nvme": a swap file. add() reads the blocks around the bucket's part,
//           adds, and queues their write-back (offload/shard_source.h accumulate; flush() waits for
//           the writes); the first micro-step adds to zeros. On the last micro-step each unit's
//           squares are summed while the values are in memory, for the gradient norm. On the CUDA
//           backend the sum is made on the device, in the bucket's staging slot, and copied into the
//           read buffer before it is written.
//   pinned  offload.params "cpu" (CUDA backend): pinned host memory; the bucket's part is summed on
//           the device in its staging slot, free once its reduce-scatter is done (the part so far
//           copied in after the first micro-step), its squares summed there on the last, and copied
//           out as the bucket completes.
#pragma once
#include <cstdint>
#include <vector>

#include "model/layout.h"
#include "offload/shard_source.h"
#include "zero/grad_squares.h"
#include "zero/partition.h"
#include "zero/store.h"

namespace zt {

template <class Ops>
class GradShardSink {
 public:
  using T = typename Ops::T;

  GradShardSink(const ParamLayout& layout, const Partition& part, StateStore& store);

  void begin_step();  // a shard in the backend's memory is zeroed (the others are overwritten)
  // Whether the host reads each result (nvme, pinned): the reducer waits for it on the host.
  bool host_reads() const { return shard_.on_disk() || pinned_; }
  // My shard += bucket b's reduce-scatter result `recv` of micro-step `micro`; `slot`: the bucket's
  // staging slot, whose reduce-scatter is done (where the CUDA backend sums for the host).
  void add(int b, T* slot, const T* recv, int micro);
  void flush();  // every write on disk: the optimizer reads the shard next
  // Per-unit sums of squares of the completed shard when it is off the device, else nullptr.
  const std::vector<GradSquares>* unit_sum_squares() const { return unit_ss_.empty() ? nullptr : &unit_ss_; }
  // A shard on disk: the writes queued so far, and whether the first n are done (in memory: always).
  uint64_t writes_queued() const { return shard_.writes_queued(); }
  bool written(uint64_t n) { return shard_.written(n); }
  // The optimizer pipeline's pool is no longer idle during backward (the step inside it).
  void keep_to_first_buffer() { shard_.keep_to_first_buffer(); }

 private:
  // The CUDA backend's sum in `slot` into `host` (pinned shard, or a read buffer; sync: the host
  // reads it next).
  void sum_on_device(int b, T* slot, const T* recv, int micro, T* host, bool sync);
  // Unit v's completed shard slice at x, for the norm.
  GradSquares unit_squares(int v, const T* x) const;

  const ParamLayout& layout_;
  const Partition& part_;
  StateStore& store_;
  offload::ShardSource<T> shard_;  // memory, or a swap file
  bool pinned_ = false;
  std::vector<GradSquares> unit_ss_;  // (units) sums of squares of each unit's shard, off the device
};

}  // namespace zt
