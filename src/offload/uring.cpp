#include "offload/uring.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>
#include <utility>

#include "runtime/checked.h"
#include "runtime/error.h"

namespace zt::offload {

namespace {
// The user_data of the no-op that tells the completion thread to stop (slots are below depth).
constexpr uint64_t kStop = std::numeric_limits<uint64_t>::max();
}  // namespace

Uring::Uring(unsigned queue_depth) : depth_(queue_depth) {
  ZT_ASSERT(queue_depth >= 1);
  // One entry more than the pieces in flight: the stop no-op is queued while some may still be.
  const int rc = io_uring_queue_init(queue_depth + 1, &ring_, 0);
  // Refused by policy or absent: run synchronously (header). Anything else is a real failure.
  if (rc == -ENOSYS || rc == -EPERM || rc == -EACCES) return;
  ZT_CHECK_URING(rc, "io_uring_queue_init(" << queue_depth + 1 << " entries)");
  ok_ = true;
  pieces_.resize(depth_);
  for (size_t i = depth_; i-- > 0;) free_.push_back(i);
}

Uring::~Uring() {
  if (!ok_) return;
  abandon();  // an exception between queue and wait: the kernel must be done with the buffers first
  if (reaper_.joinable()) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      io_uring_sqe* sqe = ring_failed_ ? nullptr : io_uring_get_sqe(&ring_);
      if (sqe) {
        io_uring_prep_nop(sqe);
        io_uring_sqe_set_data64(sqe, kStop);
        if (io_uring_submit(&ring_) < 0) ring_failed_ = true;
      }
    }
    reaper_.join();  // a failed ring has stopped its thread already
  }
  io_uring_queue_exit(&ring_);
}

void Uring::abandon() noexcept {
  std::unique_lock<std::mutex> lock(mu_);
  for (const Piece& p : backlog_) --pending_[size_t(p.tag)];
  backlog_.clear();
  progressed_.wait(lock, [&] { return in_flight_ == 0 || ring_failed_; });
  failure_ = nullptr;  // the first error was reported (it is why we abandon); later ones add nothing
}

void Uring::read(int fd, void* buf, size_t len, uint64_t off, int tag, const char* what) {
  queue({fd, static_cast<unsigned char*>(buf), len, off, false, tag, what});
}

void Uring::write(int fd, const void* buf, size_t len, uint64_t off, int tag, const char* what) {
  queue({fd, static_cast<unsigned char*>(const_cast<void*>(buf)), len, off, true, tag, what});
}

void Uring::sync_io(const Piece& p) {
  size_t done = 0;
  while (done < p.len) {
    const ssize_t r = p.write ? pwrite(p.fd, p.buf + done, p.len - done, off_t(p.off + done))
                              : pread(p.fd, p.buf + done, p.len - done, off_t(p.off + done));
    ZT_CHECK_ERRNO(r > 0, (p.write ? "pwrite(" : "pread(") << p.what << ", " << p.len - done << " bytes at "
                                                           << p.off + done << ")");
    done += size_t(r);
  }
}

void Uring::queue(const Piece& whole) {
  if (!ok_) {
    for (size_t at = 0; at < whole.len; at += kMaxIo) {
      Piece p = whole;
      p.buf += at, p.off += at, p.len = std::min(kMaxIo, whole.len - at);
      sync_io(p);
    }
    return;
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (!reaper_.joinable()) reaper_ = std::thread([this] { reap_completions(); });
  if (size_t(whole.tag) >= pending_.size()) pending_.resize(size_t(whole.tag) + 1, 0);
  for (size_t at = 0; at < whole.len; at += kMaxIo) {
    Piece p = whole;
    p.buf += at, p.off += at, p.len = std::min(kMaxIo, whole.len - at);
    ++pending_[size_t(p.tag)];
    if (free_.empty()) {
      backlog_.push_back(p);
      continue;
    }
    const size_t slot = free_.back();
    free_.pop_back();
    pieces_[slot] = p;
    ++in_flight_;
    push(slot);
  }
}

void Uring::push(size_t slot) {
  const Piece& p = pieces_[slot];
  io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
  ZT_ASSERT(sqe != nullptr);  // at most depth_ pieces exist, and the submission queue has more entries
  if (p.write) io_uring_prep_write(sqe, p.fd, p.buf, unsigned(p.len), p.off);
  else io_uring_prep_read(sqe, p.fd, p.buf, unsigned(p.len), p.off);
  io_uring_sqe_set_data64(sqe, slot);
  ZT_CHECK_URING(io_uring_submit(&ring_), "io_uring_submit (" << (p.write ? "write " : "read ") << p.what << ")");
}

void Uring::complete(size_t slot, int res) {
  Piece& p = pieces_[slot];
  if (res == -EAGAIN || res == -EINTR) return push(slot);  // transient: the same piece again
  if (res > 0 && size_t(res) < p.len) {                   // short: the rest, in the same slot
    p.buf += res, p.off += uint64_t(res), p.len -= size_t(res);
    return push(slot);
  }
  // Done, or failed: either way the piece is no longer in flight (drain() must not wait for it),
  // and its slot takes the next piece of the backlog.
  const Piece finished = p;
  --pending_[size_t(p.tag)];
  if (backlog_.empty()) {
    --in_flight_;
    free_.push_back(slot);
  } else {
    p = backlog_.front();
    backlog_.pop_front();
    push(slot);
  }
  ZT_CHECK_URING(res == 0 ? -EIO : res,  // 0: end of file inside the swap file, which was sized for it
                 (finished.write ? "io_uring write of " : "io_uring read of ") << finished.what << " (" << finished.len
                                                                           << " bytes at " << finished.off << ")");
}

void Uring::reap_completions() {
  for (;;) {
    io_uring_cqe* cqe = nullptr;
    int rc;
    do rc = io_uring_wait_cqe(&ring_, &cqe);
    while (rc == -EINTR);
    std::lock_guard<std::mutex> lock(mu_);
    if (rc < 0) {  // the ring itself: nothing in flight will be reported any more
      try {
        ZT_CHECK_URING(rc, "io_uring_wait_cqe");
      } catch (...) {
        if (!failure_) failure_ = std::current_exception();
      }
      ring_failed_ = true;
      progressed_.notify_all();
      return;
    }
    const uint64_t data = io_uring_cqe_get_data64(cqe);
    const int res = cqe->res;
    io_uring_cqe_seen(&ring_, cqe);
    if (data == kStop) return;
    try {
      complete(size_t(data), res);
    } catch (...) {  // the first error is the one reported; later ones of the same step add nothing
      if (!failure_) failure_ = std::current_exception();
    }
    progressed_.notify_all();
  }
}

void Uring::report_failure() {
  if (!failure_ && !ring_failed_) return;
  std::exception_ptr e = std::exchange(failure_, nullptr);
  if (e) std::rethrow_exception(e);
  ZT_CHECK_URING(-EIO, "io_uring completion thread (stopped after an error)");
}

void Uring::wait(int tag) {
  if (!ok_) return;
  std::unique_lock<std::mutex> lock(mu_);
  if (size_t(tag) < pending_.size())
    progressed_.wait(lock, [&] { return pending_[size_t(tag)] == 0 || failure_ || ring_failed_; });
  report_failure();
}

bool Uring::done(int tag) {
  if (!ok_) return true;
  std::lock_guard<std::mutex> lock(mu_);
  report_failure();
  return size_t(tag) >= pending_.size() || pending_[size_t(tag)] == 0;
}

void Uring::drain() {
  if (!ok_) return;
  std::unique_lock<std::mutex> lock(mu_);
  progressed_.wait(lock, [&] { return in_flight_ == 0 || failure_ || ring_failed_; });
  report_failure();
  ZT_ASSERT(backlog_.empty());
}

}  // namespace zt::offload
