// Keeps the kernel reading a rank file ahead of the checkpoint reader (docs/design.md §3.7). A
// load reads the file nearly in order, but in two kinds of request: HDF5's small metadata reads
// (each dataset's header, its group's index: about 4,500 of 80-3,000 bytes for a GPT-2 124M
// checkpoint) and the datasets' bytes. From a cold cache each small read waited for the disk (the
// kernel does not read ahead of scattered small reads), and the disk idled between them. A helper
// thread asks the kernel (posix_fadvise WILLNEED) for the file in order, at most `window` bytes
// ahead of the furthest offset read, so both kinds find their bytes in the page cache or on their
// way there: the disk streams as it does for `dd`. The window bounds the page cache a load fills
// ahead of use, whatever the file's size.
#pragma once
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>

namespace zt::ckpt {

class Readahead {
 public:
  Readahead(int fd, uint64_t size, uint64_t window);
  ~Readahead();
  Readahead(const Readahead&) = delete;
  Readahead& operator=(const Readahead&) = delete;
  // The reader has read up to `offset`: the helper may go on to offset + window.
  void reached(uint64_t offset);

 private:
  void run(int fd, uint64_t size, uint64_t window);
  std::mutex mu_;
  std::condition_variable cv_;
  uint64_t reached_ = 0;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace zt::ckpt
