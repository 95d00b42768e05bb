#include "offload/swap_pipeline.h"

#include <algorithm>

#include "runtime/error.h"

namespace zt::offload {

namespace {
// A sub-group never needs to be larger than the shard (rounded to whole I/O blocks).
size_t subgroup_of(const SwapSpec& spec, size_t numel) {
  return std::min(spec.subgroup_numel, io_round_up(numel * 4) / 4);
}

// Sets beyond the number of sub-groups would never be used.
size_t sets_of(const SwapSpec& spec, size_t numel) {
  const size_t sub = subgroup_of(spec, numel);
  return std::max<size_t>(1, std::min(size_t(spec.buffer_count), (numel + sub - 1) / sub));
}
}  // namespace

size_t pool_numel(const SwapSpec& spec, size_t numel, int states) {
  return sets_of(spec, numel) * size_t(states) * subgroup_of(spec, numel);
}

SwapPipeline::SwapPipeline(std::vector<SwapFile*> files, size_t numel, float* pool, const SwapSpec& spec,
                           std::vector<bool> read_only, std::vector<size_t> elem_bytes)
    : files_(std::move(files)), read_only_(std::move(read_only)), elem_bytes_(std::move(elem_bytes)), numel_(numel),
      sub_(subgroup_of(spec, numel)), pool_(pool),
      sets_(int(sets_of(spec, numel))), ahead_(size_t(spec.buffer_count) - 2), uring_(spec.queue_depth) {
  ZT_ASSERT(!files_.empty() && spec.buffer_count >= 2 && sub_ > 0 && (sub_ * 4) % kIoAlign == 0);
  ZT_ASSERT(reinterpret_cast<uintptr_t>(pool_) % kIoAlign == 0);
  read_only_.resize(files_.size(), false);
  elem_bytes_.resize(files_.size(), 4);
  for (size_t s = 0; s < files_.size(); ++s)
    ZT_ASSERT((elem_bytes_[s] == 4 || elem_bytes_[s] == 2) && files_[s]->bytes() == numel_ * elem_bytes_[s] &&
              (subgroups() == 1 || (sub_ * elem_bytes_[s]) % kIoAlign == 0));  // sub-groups start on blocks
}

// Read tags are even, write tags odd: 2k and 2k + 1 for sub-group k.
void SwapPipeline::transfer(size_t k, bool write) {
  const size_t begin = k * sub_, n = std::min(sub_, numel_ - begin);
  // Whole blocks: the last sub-group reaches into the file's zero padding (swap_file.h).
  for (size_t s = 0; s < files_.size(); ++s) {
    SwapFile& f = *files_[s];
    const size_t eb = elem_bytes_[s], len = io_round_up(n * eb);
    if (write && read_only_[s]) continue;
    if (write) uring_.write(f.fd(), buffer(k, s), len, begin * eb, int(2 * k + 1), f.path().c_str());
    else uring_.read(f.fd(), buffer(k, s), len, begin * eb, int(2 * k), f.path().c_str());
  }
}

void SwapPipeline::for_each_subgroup(const Update& update) {
  walk(update, [](size_t j) { return j; }, {});
}

void SwapPipeline::for_each_subgroup_descending(const Update& update, const Gate& may_read) {
  const size_t G = subgroups();
  walk(update, [G](size_t j) { return G - 1 - j; }, may_read);
}

// Sub-groups visited consecutively sit in consecutive sets (k % B), either way round, so the set
// of the j-th visit was last the (j - B)-th's.
void SwapPipeline::walk(const Update& update, const std::function<size_t(size_t)>& order, const Gate& gate) {
  const size_t G = subgroups(), B = size_t(sets_);
  std::vector<float*> bufs(files_.size());
  size_t next_read = 0;
  try {
    for (size_t j = 0; j < G; ++j) {
      // Read ahead as far as the sets allow: j + B - 2 (one set is being updated, one written from).
      // A set is free once the write of its previous tenant, visit i - B, is on disk.
      for (; next_read < G && next_read <= j + ahead_; ++next_read) {
        if (gate && !gate(order(next_read) * sub_, next_read == j)) break;
        if (next_read >= B) uring_.wait(int(2 * order(next_read - B) + 1));
        transfer(order(next_read), false);
      }
      const size_t k = order(j);
      uring_.wait(int(2 * k));
      for (size_t s = 0; s < files_.size(); ++s) bufs[s] = buffer(k, s);
      update(k * sub_, std::min(sub_, numel_ - k * sub_), bufs.data());
      transfer(k, true);
    }
    uring_.drain();
  } catch (...) {
    // No transfer may outlive the step: the pool is reused and the files may go. The first error
    // is the one reported.
    uring_.abandon();
    throw;
  }
}

}  // namespace zt::offload
