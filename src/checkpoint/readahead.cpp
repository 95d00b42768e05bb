#include "checkpoint/readahead.h"

#include <fcntl.h>

#include <algorithm>

namespace zt::ckpt {

namespace {
// One request to the kernel: large enough to be one sequential stream, small enough that the
// first bytes arrive soon.
constexpr uint64_t kStep = uint64_t(8) << 20;
}  // namespace

Readahead::Readahead(int fd, uint64_t size, uint64_t window)
    : thread_([this, fd, size, window] { run(fd, size, window); }) {}

Readahead::~Readahead() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_one();
  thread_.join();
}

void Readahead::reached(uint64_t offset) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (offset <= reached_) return;
    reached_ = offset;
  }
  cv_.notify_one();
}

void Readahead::run(int fd, uint64_t size, uint64_t window) {
  for (uint64_t at = 0; at < size; at += kStep) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || at < reached_ + window; });
      if (stop_) return;
    }
    // Advice only: where the kernel declines, the reads still work, from the disk.
    (void)::posix_fadvise(fd, off_t(at), off_t(std::min(kStep, size - at)), POSIX_FADV_WILLNEED);
  }
}

}  // namespace zt::ckpt
