// One swap file (docs/design.md §3.6): a state buffer of one rank (AdamW m, v, or master weights)
// that lives on disk instead of in memory. Opened with O_DIRECT where the filesystem has it, so
// the state neither sits in the page cache nor costs a copy through it; every transfer is then a
// multiple of kIoAlign bytes, at a multiple of kIoAlign, from a kIoAlign-aligned buffer, which is
// why the file is padded to a multiple of kIoAlign. The file is created when the store is built
// and removed when it is destroyed, and on SIGTERM / SIGINT (offload/unlink_list.h).
#pragma once
#include <cstddef>
#include <string>

namespace zt::offload {

constexpr size_t kIoAlign = 4096;  // logical block size O_DIRECT asks for on every disk we meet

inline size_t io_round_up(size_t bytes) { return (bytes + kIoAlign - 1) / kIoAlign * kIoAlign; }

// Where a rank's swap files go and how the optimizer streams them (plan section `offload`).
struct SwapSpec {
  std::string dir;              // empty = no offload
  int rank = 0;
  bool direct = true;           // O_DIRECT (false: buffered I/O, for filesystems without it)
  unsigned queue_depth = 32;    // io_uring submission queue entries
  int buffer_count = 3;         // sub-group buffer sets: read k+1 / update k / write k-1
  size_t subgroup_numel = 0;    // elements per state per sub-group, a multiple of kIoAlign / 4
  bool enabled() const { return !dir.empty(); }
};

class SwapFile {
 public:
  // Creates `path` (it must not exist), reserves io_round_up(bytes) on disk (zeros) and registers
  // it for unlinking on signals.
  SwapFile(std::string path, size_t bytes, bool direct);
  ~SwapFile();
  SwapFile(const SwapFile&) = delete;
  SwapFile& operator=(const SwapFile&) = delete;

  int fd() const { return fd_; }
  size_t bytes() const { return bytes_; }          // the buffer's bytes
  size_t file_bytes() const { return io_round_up(bytes_); }
  const std::string& path() const { return path_; }

  // Whole-buffer copies for capturing and restoring a TrainState (not on the step's path):
  // synchronous, through an aligned bounce buffer of their own.
  void read_all(void* dst) const;
  void write_all(const void* src);

 private:
  std::string path_;
  size_t bytes_;
  int fd_ = -1;
  int slot_ = -1;
};

// "<dir>/zerotrain.r<rank>.p<pid>.<tag>.swap": rank and pid, so ranks and concurrent runs
// sharing a directory never collide and a file left by SIGKILL says whose it was.
std::string swap_file_path(const std::string& dir, int rank, const std::string& tag);

}  // namespace zt::offload
