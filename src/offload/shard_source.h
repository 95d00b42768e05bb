// Where a rank's shard of a flat state buffer lives, and every transfer that brings a unit's part
// of it to the ZeRO engine (docs/design.md §3.6): the one place that says *when* an offload
// transfer happens on the step's path.
//
//   memory  the backend's memory (host or device): unit u's shard is at its flat offset; nothing
//           moves, and a request is delivered at once.
//   nvme    a swap file (offload.params "nvme", stage 3): reads of whole blocks around the shard
//           into a read buffer (O_DIRECT), queued on io_uring.
//   copied  pinned host memory on the CUDA backend (offload.params "cpu", stage 3): the caller's
//           Copier queues a host-to-device copy on its copy stream, and orders the consumer after
//           it at delivery (this layer knows no CUDA); delivered at the same hooks as reads.
//
// Reads for the parameter gatherer (ZeroEngine hooks use / release, ParamGatherer): request()
// queues the read of unit u's shard into read buffer i; deliver(), called once per hook, hands
// over in queue order every read queued at an earlier hook (and through buffer `through` when that
// one is needed now). The consumer starts a collective on each delivered shard, and collectives
// must start in the same order on every rank: so when a shard is delivered depends only on the
// hook sequence, never on when a read happens to finish. A read thus overlaps one unit's compute.
// The optimizer step's transfers (moments, master weights, and these shards, in sub-groups) are
// offload::SwapPipeline's.
//
// Gradients (GradReducer): accumulate() reads the blocks that hold a flat range into one of its
// buffers (one with no write in flight, else the one whose write is oldest, among those the blocks
// fit in), lets the caller add into them, and queues their write-back; `fresh`
// (the step's first contribution) needs only the two edge blocks the range shares with its
// neighbours and zeroes the range. The write overlaps whatever the caller does until that buffer
// comes round again: a buffer is read into only once its last write is complete, a range first
// waits for the writes in flight that share a block with it (neighbouring ranges share their edge
// blocks, and a later micro-step reads the same range), and flush() waits for every write (before
// anything else reads the file).
//
// Edge blocks are kept in memory (one 4 KiB copy per edge block, the last content queued for it),
// so a fresh range reads nothing from disk after the first step. A synchronous read of two blocks
// queued behind the queue_depth MiB already in flight waited 85-90 ms per 315 MB bucket of the 3B
// plan's shape at queue depth 1024 (docs/offload.md). For the same reason each write queues its
// edge blocks first, under a tag of their own (2b + 1; the rest 2b): a neighbour waits only for
// those, not for the whole range.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <functional>
#include <memory>
#include <unordered_map>
#include <vector>

#include "offload/swap_file.h"
#include "offload/uring.h"
#include "runtime/error.h"

namespace zt::offload {

template <class T>
class ShardSource {
 public:
  struct Range {  // a unit's shard in the flat buffer, in elements
    size_t flat = 0, numel = 0;
  };
  using Deliver = std::function<void(int buf, const T* shard)>;
  struct Copier {
    std::function<const T*(int u, int buf)> queue;  // starts unit u's copy into buffer buf; where it lands
    std::function<void(int buf)> wait;               // what follows is ordered after buffer buf's copy
  };

  ShardSource() = default;
  // In memory: unit u's shard is memory + units[u].flat.
  ShardSource(T* memory, std::vector<Range> units) : memory_(memory), units_(std::move(units)) {}
  // In a swap file of 4-byte elements: reads go to bufs[i] (kIoAlign-aligned, each large enough
  // for the blocks around any shard read into it); accumulate() uses bufs[i] for blocks of at most
  // buf_bytes[i] bytes (empty: any; the first must take the blocks around any range).
  ShardSource(SwapFile* file, std::vector<Range> units, std::vector<T*> bufs, unsigned queue_depth,
              std::vector<size_t> buf_bytes = {})
      : file_(file), units_(std::move(units)), bufs_(std::move(bufs)), ring_(std::make_unique<Uring>(queue_depth)),
        queued_at_(bufs_.size(), -1), send_(bufs_.size()), buf_bytes_(std::move(buf_bytes)), writing_(bufs_.size()) {}

  // Copied into `buffers` buffers by `copier`.
  ShardSource(Copier copier, size_t buffers)
      : queued_at_(buffers, -1), send_(buffers), copier_(std::move(copier)) {}

  bool on_disk() const { return file_ != nullptr; }

  // Unit u's shard into read buffer i: delivered now from memory, at a later deliver() from disk.
  void request(int u, int i, const Deliver& arrived) {
    if (!queued()) return arrived(i, memory_ + units_[size_t(u)].flat);
    send_[size_t(i)] = queue_read(u, i);
    queued_at_[size_t(i)] = hooks_;
    queue_.push_back(i);
  }
  // Once per hook: delivers the reads queued at earlier hooks, and through buffer `through` (-1:
  // none) if its read is still queued.
  void deliver(int through, const Deliver& arrived) {
    if (!queued()) return;
    bool all = through >= 0 && queued_at_[size_t(through)] >= 0;
    while (!queue_.empty()) {
      const int i = queue_.front();
      if (!all && queued_at_[size_t(i)] >= hooks_) break;
      wait(i);
      queued_at_[size_t(i)] = -1;
      queue_.pop_front();
      arrived(i, send_[size_t(i)]);
      if (i == through) all = false;
    }
    ++hooks_;
  }
  // Unit u's shard now, through read buffer i (between passes: nothing queued).
  const T* now(int u, int i) {
    if (!queued()) return memory_ + units_[size_t(u)].flat;
    ZT_ASSERT(queue_.empty());
    const T* shard = queue_read(u, i);
    wait(i);
    return shard;
  }

  // add(data) on elements [flat, flat + n) of the shard, in memory or read from disk and written
  // back (the write queued); fresh: the range's old values are not read (zeros instead).
  template <class Add>
  void accumulate(size_t flat, size_t n, bool fresh, const Add& add) {
    if (!file_) return add(memory_ + flat);
    const size_t off = flat * sizeof(T), a0 = off / kIoAlign * kIoAlign, a1 = io_round_up(off + n * sizeof(T));
    size_t b = 0;
    for (size_t j = 1; j < bufs_.size(); ++j)
      if ((buf_bytes_.empty() || buf_bytes_[j] >= a1 - a0) && writing_[j].queued < writing_[b].queued) b = j;
    ZT_ASSERT(buf_bytes_.empty() || buf_bytes_[b] >= a1 - a0);
    finish_write(b);
    for (size_t j = 0; j < writing_.size(); ++j) {
      if (writing_[j].end <= a0 || a1 <= writing_[j].begin) continue;  // shares no block (or none in flight: end 0)
      if (writing_[j].begin == a0 && writing_[j].end == a1) finish_write(j);  // the same range: all of it
      else ring_->wait(edge_tag(j));  // a neighbour: only the edge block we share
    }
    T* blocks = bufs_[b];
    unsigned char* bytes = reinterpret_cast<unsigned char*>(blocks);
    const uint64_t last = a1 - kIoAlign;  // the last block (== a0 for a range inside one block)
    // data sits at the same address modulo the block as in a shard in memory, so the caller's
    // vector code reads it in the same lanes (sums are bit for bit those of the in-memory run).
    T* data = blocks + (off - a0) / sizeof(T);
    if (fresh) {
      edge_block(a0, bytes);
      if (last > a0) edge_block(last, bytes + (last - a0));
      std::memset(data, 0, n * sizeof(T));
    } else {
      file_->read_blocks(blocks, a1 - a0, a0);
    }
    add(data);
    remember_edge(a0, bytes);
    if (last > a0) remember_edge(last, bytes + (last - a0));
    const char* what = file_->path().c_str();
    ring_->write(file_->fd(), bytes, kIoAlign, a0, edge_tag(b), what);
    if (last > a0) ring_->write(file_->fd(), bytes + (last - a0), kIoAlign, last, edge_tag(b), what);
    if (last > a0 + kIoAlign) ring_->write(file_->fd(), bytes + kIoAlign, last - a0 - kIoAlign, a0 + kIoAlign, int(2 * b), what);
    writing_[b] = {a0, a1, ++writes_};
  }
  // Until every write accumulate() queued is complete.
  void flush() {
    for (size_t j = 0; j < writing_.size(); ++j) finish_write(j);
  }
  // How many writes accumulate() has queued so far; whether the first `n` of them are complete,
  // without waiting (in memory: always).
  uint64_t writes_queued() const { return writes_; }
  bool written(uint64_t n) {
    for (size_t j = 0; j < writing_.size(); ++j) {
      if (writing_[j].queued == 0 || writing_[j].queued > n) continue;
      if (!ring_->done(int(2 * j)) || !ring_->done(edge_tag(j))) return false;
      writing_[j] = {};
    }
    return true;
  }
  // From now on accumulate() uses only its first buffer (the others are lent elsewhere).
  void keep_to_first_buffer() {
    flush();
    bufs_.resize(std::min<size_t>(bufs_.size(), 1)), writing_.resize(bufs_.size());
    if (!buf_bytes_.empty()) buf_bytes_.resize(bufs_.size());
  }

 private:
  // Queues the read of the whole blocks around unit u's shard into buffer i; returns where in the
  // buffer the shard will be. (The file is written only by the optimizer step, never during a pass.)
  const T* queue_read(int u, int i) {
    if (copier_.queue) return copier_.queue(u, i);
    const Range& r = units_[size_t(u)];
    const size_t off = r.flat * sizeof(T), a0 = off / kIoAlign * kIoAlign, a1 = io_round_up(off + r.numel * sizeof(T));
    ring_->read(file_->fd(), bufs_[size_t(i)], a1 - a0, a0, i, file_->path().c_str());
    return bufs_[size_t(i)] + (off - a0) / sizeof(T);
  }

  void finish_write(size_t b) {
    if (writing_[b].end == 0) return;
    ring_->wait(edge_tag(b));
    ring_->wait(int(2 * b));
    writing_[b] = {};
  }
  static int edge_tag(size_t b) { return int(2 * b + 1); }
  // The block at byte `at` into `to`: its last content queued, else (the first time) the file's.
  void edge_block(uint64_t at, unsigned char* to) {
    const auto it = edges_.find(at);
    if (it == edges_.end()) file_->read_blocks(to, kIoAlign, at);
    else std::memcpy(to, it->second.data(), kIoAlign);
  }
  void remember_edge(uint64_t at, const unsigned char* from) {
    std::vector<unsigned char>& copy = edges_[at];
    copy.assign(from, from + kIoAlign);
  }

  bool queued() const { return file_ || copier_.queue; }
  void wait(int i) {
    if (copier_.wait) copier_.wait(i);
    else ring_->wait(i);
  }

  T* memory_ = nullptr;
  SwapFile* file_ = nullptr;
  std::vector<Range> units_;
  std::vector<T*> bufs_;
  std::unique_ptr<Uring> ring_;
  std::deque<int> queue_;         // buffers whose read is queued, not yet delivered (in order)
  std::vector<int> queued_at_;    // per buffer: the hook that queued its read; -1 = none queued
  std::vector<const T*> send_;    // per buffer: where its shard is
  int hooks_ = 0;                 // deliver() calls
  Copier copier_;
  std::vector<size_t> buf_bytes_;  // per buffer: the most accumulate() reads into it
  struct Blocks {
    uint64_t begin = 0, end = 0;  // bytes; end 0 = none
    uint64_t queued = 0;          // its number among the writes (0 = none in flight)
  };
  std::vector<Blocks> writing_;   // per buffer: the blocks of its write in flight (accumulate)
  std::unordered_map<uint64_t, std::vector<unsigned char>> edges_;  // edge block's byte offset -> its last content
  uint64_t writes_ = 0;           // writes queued by accumulate()
};

}  // namespace zt::offload
