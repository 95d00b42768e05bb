// The optimizer step over swapped state (docs/design.md §3.6): a rank's shard of S state buffers
// (AdamW m and v; master weights where the backend keeps them), each in its own SwapFile, is
// walked in sub-groups of subgroup_numel elements. Sub-group k lives in buffer set k % B of a
// fixed pool (B = buffer_count sets of S buffers), and the three stages overlap:
//
//   read k+1 (io_uring)   while   update k (the caller, CPU threads)   while   write k-1 (io_uring)
//
// Reads run ahead up to sub-group k+B-2 while k is updated; before sub-group j is read into its
// set, the write of j-B (the set's previous tenant) must be complete. With B = 3 that write has had
// the whole update of the sub-group before to finish in; with B = 2 only writes overlap updates.
#pragma once
#include <cstddef>
#include <functional>
#include <vector>

#include "offload/swap_file.h"
#include "offload/uring.h"

namespace zt::offload {

// Elements of the pool for `states` buffers of `numel` elements (4-byte): buffer_count sets (no
// more than there are sub-groups) of `states` sub-group buffers, each no larger than the shard.
size_t pool_numel(const SwapSpec& spec, size_t numel, int states);

class SwapPipeline {
 public:
  // files: the S state files, each of numel 4-byte elements; pool: pool_numel(spec, numel, S)
  // elements, kIoAlign-aligned. read_only: the files the update only reads (the gradient shard),
  // which are never written back; empty = none.
  // elem_bytes: per file, 4 (fp32) or 2 (the CUDA backend's bf16 parameter and gradient shards,
  // whose buffers then hold 2-byte elements in the first half); empty = all 4.
  SwapPipeline(std::vector<SwapFile*> files, size_t numel, float* pool, const SwapSpec& spec,
               std::vector<bool> read_only = {}, std::vector<size_t> elem_bytes = {});

  // Calls update(begin, n, bufs) for every sub-group [begin, begin + n) in order, bufs[s] holding
  // state s's elements of it; what update leaves in bufs is written back.
  using Update = std::function<void(size_t begin, size_t n, float* const* bufs)>;
  void for_each_subgroup(const Update& update);
  // The same, last sub-group first, and each sub-group's read queued only once may_read(begin,
  // wait) allows it: without waiting for the reads ahead (false: not yet, read it later), waiting
  // (it may throw to abandon the walk) for the sub-group to be updated next. The optimizer step
  // inside backward, which finishes the gradient shard from its end (ShardedOptimizer,
  // docs/offload.md).
  using Gate = std::function<bool(size_t begin, bool wait)>;
  void for_each_subgroup_descending(const Update& update, const Gate& may_read);

  size_t subgroups() const { return (numel_ + sub_ - 1) / sub_; }
  bool async() const { return uring_.available(); }

 private:
  float* buffer(size_t k, size_t s) const { return pool_ + ((k % size_t(sets_)) * files_.size() + s) * sub_; }
  void transfer(size_t k, bool write);
  // The walk: the j-th sub-group visited is order(j); gate (if any) before each read.
  void walk(const Update& update, const std::function<size_t(size_t)>& order, const Gate& gate);

  std::vector<SwapFile*> files_;
  std::vector<bool> read_only_;
  std::vector<size_t> elem_bytes_;
  size_t numel_, sub_;
  float* pool_;
  int sets_;      // buffer sets in use: buffer_count, or fewer when the shard has fewer sub-groups
  size_t ahead_;  // reads run up to sub-group k + ahead_ while k is updated
  Uring uring_;
};

}  // namespace zt::offload
