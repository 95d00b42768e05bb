// Asynchronous file reads and writes through io_uring (liburing), grouped by tag: queue any number
// of transfers under a tag, later wait for all of that tag's to be complete. Requests are cut into
// pieces of at most kMaxIo bytes so a deep queue keeps an NVMe drive's parallel channels busy; at
// most queue_depth pieces are in flight, the rest wait in a backlog, so queueing never blocks the
// caller (whose CPU work the transfers are meant to overlap). A piece that completes short is
// submitted again for the rest.
//
// A completion thread (one per ring, started with its first transfer) reaps every completion and
// refills the freed slot from the backlog at once, so a transfer longer than the queue keeps the
// disk busy while its caller computes. Reaping only inside wait() would leave the disk idle after
// the first queue_depth pieces until the caller came to wait: a 315 MB unit read at depth 32 moved
// 32 MiB during the unit before it (docs/offload.md "The queue that emptied only when waited on").
//
//   caller   | queue(u+1) | compute u ............... | wait(u+1) | compute u+1
//   reaper   |   reap, refill, reap, refill, ...      |
//   disk     |   u+1's pieces, queue_depth at a time, all the way through
//
// The caller's thread and the completion thread share the bookkeeping under one mutex; only the
// completion thread takes completions off the ring, and submissions happen under the mutex.
//
// Where the kernel refuses io_uring (a container's seccomp profile, an old kernel), the same calls
// run synchronously with pread / pwrite at queue time: correct, without the overlap. available()
// says which; the trainer prints it.
#pragma once
#include <liburing.h>

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

namespace zt::offload {

class Uring {
 public:
  static constexpr size_t kMaxIo = size_t(1) << 20;

  explicit Uring(unsigned queue_depth);
  ~Uring();
  Uring(const Uring&) = delete;
  Uring& operator=(const Uring&) = delete;

  bool available() const { return ok_; }
  // Queues (and submits) a transfer of len bytes at file offset off; buf stays untouched by the
  // caller until wait(tag) returns. `what` names the file in error messages.
  void read(int fd, void* buf, size_t len, uint64_t off, int tag, const char* what);
  void write(int fd, const void* buf, size_t len, uint64_t off, int tag, const char* what);
  // Until every transfer queued under `tag` is complete. An I/O error is thrown once, by the first
  // wait(), done() or drain() after it (whichever tag failed).
  void wait(int tag);
  // Whether every transfer queued under `tag` is complete, without blocking.
  bool done(int tag);
  // Until nothing is in flight or waiting.
  void drain();
  // After an error: forget what waits in the backlog, let what is in flight finish, report nothing
  // (the buffers may be reused or freed afterwards).
  void abandon() noexcept;

 private:
  struct Piece {
    int fd;
    unsigned char* buf;
    size_t len;
    uint64_t off;
    bool write;
    int tag;
    const char* what;
  };
  void queue(const Piece& p);
  void push(size_t slot);                // mu_ held
  void complete(size_t slot, int res);   // mu_ held; the completion thread only
  void reap_completions();               // the completion thread's loop
  void report_failure();                 // mu_ held: throws the error not yet reported, if any
  void sync_io(const Piece& p);

  io_uring ring_{};
  bool ok_ = false;
  unsigned depth_;
  std::mutex mu_;                        // everything below
  std::condition_variable progressed_;   // a piece finished (or the ring failed)
  std::vector<Piece> pieces_;    // indexed by slot (the SQE's user_data)
  std::vector<size_t> free_;     // free slots
  std::deque<Piece> backlog_;    // queued, not yet submitted (every slot busy)
  std::vector<int> pending_;     // pieces queued and not finished, per tag
  unsigned in_flight_ = 0;
  std::exception_ptr failure_;   // the first error not yet thrown to the caller
  bool ring_failed_ = false;     // the completion thread could not wait on the ring: nothing more finishes
  std::thread reaper_;
};

}  // namespace zt::offload
