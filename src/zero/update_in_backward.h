// The optimizer step inside backward (offload.overlap_update, docs/offload.md, docs/design.md
// §3.6): at stage 3 on the CPU backend with the state in swap files and optim.grad_clip 0 (no norm
// to wait for), the swapped update runs on a worker thread while backward still runs.
//
//   training | fwd | bwd: lnf | block L | ... | block 1 | embedding | finish | (step: waits)
//   worker   |           (waits) | update lnf, L | ... | update 1  | ... update embedding |
//
// Backward makes the gradient shard final from its end (flat order is embedding, blocks, final
// norm), bucket by bucket; the worker walks the sub-groups from the end too, each read once
// everything from its first element up is final. It writes parameters, m and v only in sub-groups
// that backward no longer reads (their units' backward is done; sub-groups start on whole blocks,
// so no block is shared with a unit still to come), and reads gradients whose write is complete.
// A strategy beside ShardedOptimizer: the optimizer starts one per step and joins it in step().
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "offload/swap_pipeline.h"
#include "runtime/trace.h"

namespace zt {

class UpdateInBackward {
 public:
  // Starts the walk over `swap`'s sub-groups, last first: update(begin, n, bufs) on each once the
  // gradient shard is final from `begin` up (grads_final_from). shard_total: the flat shard's end.
  UpdateInBackward(offload::SwapPipeline& swap, size_t shard_total, offload::SwapPipeline::Update update);
  // An error unwinds the run mid-step: the walk may be waiting for gradients that will never come,
  // and it may not outlive the buffers and files it streams, so it is abandoned and joined.
  ~UpdateInBackward();
  // The gradient shard is final, and on disk where it lives there, for flat elements [from, end).
  void grads_final_from(size_t from);
  // Everything is final: waits for the walk, puts its span on run.trace's host-optimizer track
  // (tr may be nullptr) and rethrows its error.
  void join(Tracer* tr);

 private:
  struct Worker;  // the thread, the gradient's final edge, its error
  std::unique_ptr<Worker> w_;
};

// How far the gradient shard is final, seen from the engine's hooks: the reducer completes buckets
// from the shard's end, but a bucket's range counts only once the one above it does and its
// gradient writes (a shard on disk) are done; the worker is told one edge, below which nothing is.
class FinalEdge {
 public:
  // The start of a step: nothing is final; end: the end of the last unit's shard (the padding
  // beyond is nobody's).
  void reset(size_t end) {
    ranges_.clear();
    edge_ = end;
  }
  // A bucket's shard range [lo, hi) is complete, once the first `writes` gradient writes are done.
  void add(size_t lo, size_t hi, uint64_t writes) { ranges_.push_back({lo, hi, writes}); }
  bool pending() const { return !ranges_.empty(); }
  // Moves the edge down over every range that joins it and is written (written(writes)); true
  // when it moved.
  template <class Written>
  bool advance(const Written& written) {
    bool moved = false;
    for (bool found = true; found;) {
      found = false;
      for (size_t i = 0; i < ranges_.size(); ++i) {
        const Range& r = ranges_[i];
        if (r.lo < edge_ && r.hi >= edge_ && written(r.writes)) {
          edge_ = r.lo, moved = found = true;
          ranges_.erase(ranges_.begin() + std::ptrdiff_t(i));
          break;
        }
      }
    }
    return moved;
  }
  size_t edge() const { return edge_; }

 private:
  struct Range {
    size_t lo, hi;
    uint64_t writes;
  };
  std::vector<Range> ranges_;
  size_t edge_ = 0;
};

}  // namespace zt
