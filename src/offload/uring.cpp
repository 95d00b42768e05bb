#include "offload/uring.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "runtime/checked.h"
#include "runtime/error.h"

namespace zt::offload {

Uring::Uring(unsigned queue_depth) : depth_(queue_depth) {
  ZT_ASSERT(queue_depth >= 1);
  const int rc = io_uring_queue_init(queue_depth, &ring_, 0);
  // Refused by policy or absent: run synchronously (header). Anything else is a real failure.
  if (rc == -ENOSYS || rc == -EPERM || rc == -EACCES) return;
  // (Kernels before 5.12 charge the rings to RLIMIT_MEMLOCK: ENOMEM there means a smaller queue.)
  ZT_CHECK_URING(rc, "io_uring_queue_init(" << queue_depth << " entries, the plan's offload.queue_depth)");
  ok_ = true;
  pieces_.resize(depth_);
  for (size_t i = depth_; i-- > 0;) free_.push_back(i);
}

Uring::~Uring() {
  if (!ok_) return;
  abandon();  // an exception between queue and wait: the kernel must be done with the buffers first
  io_uring_queue_exit(&ring_);
}

void Uring::abandon() noexcept {
  for (const Piece& p : backlog_) --pending_[size_t(p.tag)];
  backlog_.clear();
  while (in_flight_ > 0) {
    try {
      reap_one();
    } catch (...) {  // the first error was reported; later ones of the same step add nothing
    }
  }
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
  if (size_t(whole.tag) >= pending_.size()) pending_.resize(size_t(whole.tag) + 1, 0);
  for (size_t at = 0; at < whole.len; at += kMaxIo) {
    Piece p = whole;
    p.buf += at, p.off += at, p.len = std::min(kMaxIo, whole.len - at);
    if (!ok_) {
      sync_io(p);
      continue;
    }
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
  ZT_ASSERT(sqe != nullptr);  // at most depth_ pieces exist, and the submission queue has depth_ entries
  if (p.write) io_uring_prep_write(sqe, p.fd, p.buf, unsigned(p.len), p.off);
  else io_uring_prep_read(sqe, p.fd, p.buf, unsigned(p.len), p.off);
  io_uring_sqe_set_data64(sqe, slot);
  ZT_CHECK_URING(io_uring_submit(&ring_), "io_uring_submit (" << (p.write ? "write " : "read ") << p.what << ")");
}

bool Uring::reap_one(bool block) {
  ZT_ASSERT(in_flight_ > 0);
  io_uring_cqe* cqe = nullptr;
  int rc;
  if (!block) {
    rc = io_uring_peek_cqe(&ring_, &cqe);
    if (rc == -EAGAIN) return false;
  } else {
    do rc = io_uring_wait_cqe(&ring_, &cqe);
    while (rc == -EINTR);
  }
  ZT_CHECK_URING(rc, (block ? "io_uring_wait_cqe" : "io_uring_peek_cqe"));
  const size_t slot = size_t(io_uring_cqe_get_data64(cqe));
  const int res = cqe->res;
  io_uring_cqe_seen(&ring_, cqe);
  Piece& p = pieces_[slot];
  if (res == -EAGAIN || res == -EINTR) {  // transient: the same piece again
    push(slot);
    return true;
  }
  if (res > 0 && size_t(res) < p.len) {  // short: the rest, in the same slot
    p.buf += res, p.off += uint64_t(res), p.len -= size_t(res);
    push(slot);
    return true;
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
  return true;
}

void Uring::wait(int tag) {
  if (size_t(tag) >= pending_.size()) return;
  while (pending_[size_t(tag)] > 0) reap_one();
}

bool Uring::done(int tag) {
  if (size_t(tag) >= pending_.size()) return true;
  while (pending_[size_t(tag)] > 0 && in_flight_ > 0 && reap_one(false)) {
  }
  return pending_[size_t(tag)] == 0;
}

void Uring::drain() {
  while (in_flight_ > 0) reap_one();  // the backlog empties into freed slots on the way
  ZT_ASSERT(backlog_.empty());
}

}  // namespace zt::offload
