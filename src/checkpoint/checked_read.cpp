#include "checkpoint/checked_read.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "checkpoint/crc32c.h"

namespace zt::ckpt {

namespace {

// Large enough that a segment's read is one sequential stream for the kernel's readahead, small
// enough that the first segment (read before any checksum can start) is a small part of a piece.
constexpr size_t kSegment = size_t(4) << 20;

// Reads [at, at + bytes) into dst; returns the bytes read (short at end of file or on an error,
// then *error is errno, or stays 0 at end of file).
size_t read_all(int fd, uint64_t at, size_t bytes, unsigned char* dst, int* error) {
  size_t done = 0;
  while (done < bytes) {
    const ssize_t r = ::pread(fd, dst + done, bytes - done, off_t(at + done));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) *error = errno;
    if (r <= 0) break;
    done += size_t(r);
  }
  return done;
}

}  // namespace

CheckedRead read_checked(int fd, uint64_t at, size_t bytes, void* dst) {
  auto* out = static_cast<unsigned char*>(dst);
  CheckedRead r;
  if (bytes <= kSegment) {  // one segment: nothing to overlap
    r.bytes = read_all(fd, at, bytes, out, &r.error);
    r.crc = crc32c(out, r.bytes);
    return r;
  }
  // The reader publishes how far it has read (`ready`) and whether it has stopped (`end`: done,
  // or short); the caller checksums up to `ready` as it grows.
  std::mutex mu;
  std::condition_variable cv;
  size_t ready = 0;
  bool end = false;
  std::thread reader([&] {
    size_t done = 0;
    while (done < bytes) {
      const size_t n = std::min(kSegment, bytes - done), got = read_all(fd, at + done, n, out + done, &r.error);
      done += got;
      std::lock_guard<std::mutex> lock(mu);
      ready = done;
      if (got < n) break;
      cv.notify_one();
    }
    std::lock_guard<std::mutex> lock(mu);
    end = true;
    cv.notify_one();
  });
  while (true) {
    size_t upto;
    bool stopped;
    {
      std::unique_lock<std::mutex> lock(mu);
      cv.wait(lock, [&] { return ready > r.bytes || end; });
      upto = ready, stopped = end;
    }
    r.crc = crc32c(out + r.bytes, upto - r.bytes, r.crc);
    r.bytes = upto;
    if (stopped) break;
  }
  reader.join();
  return r;
}

}  // namespace zt::ckpt
