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
  bool optimizer = false;       // offload.optimizer "nvme": AdamW moments (and master weights) in files
  bool params = false;          // offload.params "nvme" (stage 3): parameter and gradient shards in files
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
  // Synchronous whole-block transfers: off and len multiples of kIoAlign, buf kIoAlign-aligned.
  void read_blocks(void* buf, size_t len, uint64_t off) const;
  void write_blocks(const void* buf, size_t len, uint64_t off);
  // Any byte range, through a bounce buffer (blocks only partly covered are read first): for
  // writing initial parameters range by range, not on the step's path.
  void write_at(const void* src, size_t len, uint64_t off);

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
