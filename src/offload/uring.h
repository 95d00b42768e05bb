// Asynchronous file reads and writes through io_uring (liburing), grouped by tag: queue any number
// of transfers under a tag, later wait for all of that tag's to be complete. Requests are cut into
// pieces of at most kMaxIo bytes so a deep queue keeps an NVMe drive's parallel channels busy; at
// most queue_depth pieces are in flight, the rest wait in a backlog that completions refill from,
// so queueing never blocks the caller (whose CPU work the transfers are meant to overlap). A piece
// that completes short is submitted again for the rest.
//
// Only the caller's own wait() / done() refill the queue from the backlog: while it computes, the
// disk finishes what is in flight and then idles. So the queue must hold a whole transfer for the
// transfer to overlap compute: plan `offload.queue_depth` defaults to 1024 (1 GiB in flight, more
// than the 3B plan's largest transfer, its 515 MB embedding). At 32 a 315 MB block read moved
// 32 MiB during the unit before it and the rest while the forward waited (docs/offload.md, "The
// queue that emptied only when waited on"). A completion thread that refills the backlog was
// tried: as fast on the disk, but its wake-up per piece slowed the compute beside it by 14-17%.
//
// Where the kernel refuses io_uring (a container's seccomp profile, an old kernel), the same calls
// run synchronously with pread / pwrite at queue time: correct, without the overlap. available()
// says which; the trainer prints it.
#pragma once
#include <liburing.h>

#include <cstddef>
#include <cstdint>
#include <deque>
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
  // Until every transfer queued under `tag` is complete; throws on an I/O error.
  void wait(int tag);
  // Whether every transfer queued under `tag` is complete, without blocking (reaps what the kernel
  // has finished; throws on an I/O error).
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
  void push(size_t slot);
  bool reap_one(bool block = true);  // false: nothing was complete (block false only)
  void sync_io(const Piece& p);

  io_uring ring_{};
  bool ok_ = false;
  unsigned depth_;
  std::vector<Piece> pieces_;    // indexed by slot (the SQE's user_data)
  std::vector<size_t> free_;     // free slots
  std::deque<Piece> backlog_;    // queued, not yet submitted (every slot busy)
  std::vector<int> pending_;     // pieces in flight per tag
  unsigned in_flight_ = 0;
};

}  // namespace zt::offload
