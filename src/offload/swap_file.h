// One swap file (docs/design.md §3.6; docs/offload.md): a state buffer of one rank that lives on
// disk instead of in memory: AdamW m or v or the master weights (offload.optimizer "nvme"), the
// parameter shard or the gradient shard (offload.params "nvme"). Opened with O_DIRECT where the
// filesystem has it, so the state neither sits in the page cache nor costs a copy through it; every
// transfer is then a multiple of kIoAlign bytes, at a multiple of kIoAlign, from a kIoAlign-aligned
// buffer, which is why the file is padded to a multiple of kIoAlign. The file has no name on disk:
// it is created unnamed (O_TMPFILE) or unlinked right after it is opened, so its blocks go back to
// the filesystem when the process ends, however it ends (a signal, an abort, SIGKILL), and no
// handler is needed.
#pragma once
#include <cstddef>
#include <cstdint>
#include <optional>
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
  unsigned queue_depth = 1024;  // io_uring requests in flight (uring.h: why so many)
  int buffer_count = 3;         // sub-group buffer sets: read k+1 / update k / write k-1
  size_t subgroup_numel = 0;    // elements per state per sub-group, a multiple of kIoAlign / 4
  bool overlap_update = false;  // offload.overlap_update (zero/optimizer.h: the step inside backward)
  bool enabled() const { return !dir.empty(); }
};

class SwapFile {
 public:
  // Creates an unnamed file in the directory of `path` (open_unnamed) and reserves
  // io_round_up(bytes) on disk (zeros).
  SwapFile(std::string path, size_t bytes, bool direct);
  ~SwapFile();
  SwapFile(const SwapFile&) = delete;
  SwapFile& operator=(const SwapFile&) = delete;

  int fd() const { return fd_; }
  size_t bytes() const { return bytes_; }          // the buffer's bytes
  size_t file_bytes() const { return io_round_up(bytes_); }
  // The name the file would have (it has none on disk): for messages.
  const std::string& path() const { return path_; }

  // Whole-buffer copies for capturing and restoring a TrainState (not on the step's path):
  // synchronous, through an aligned bounce buffer of their own.
  void read_all(void* dst) const;
  void write_all(const void* src);
  // Synchronous whole-block transfers: off and len multiples of kIoAlign, buf kIoAlign-aligned.
  void read_blocks(void* buf, size_t len, uint64_t off) const;
  void write_blocks(const void* buf, size_t len, uint64_t off);
  // Any byte range, through a bounce buffer (blocks only partly covered are read first): for
  // writing initial parameters range by range, and checkpoints, not on the step's path.
  void write_at(const void* src, size_t len, uint64_t off);
  void read_at(void* dst, size_t len, uint64_t off) const;

 private:
  std::string path_;
  size_t bytes_;
  int fd_ = -1;
};

// "<dir>/zerotrain.r<rank>.p<pid>@<host>.<tag>.swap": the name a swap file has where the filesystem
// lacks O_TMPFILE, from its creation to its unlink a moment later. Rank, pid and host, so ranks and
// concurrent runs sharing a directory never collide, and a file left by a process killed in that
// moment says whose it was (check_nvme_dir removes it at the next start).
std::string swap_file_path(const std::string& dir, int rank, const std::string& tag);

// Who left a file named by swap_file_path; host is empty for the names of earlier versions
// ("zerotrain.r<rank>.p<pid>.<tag>.swap", always made on the host that reads them). Nothing for
// any other name.
struct SwapFileOwner {
  long pid = 0;
  std::string host;
};
std::optional<SwapFileOwner> swap_file_owner(const std::string& filename);
std::string this_host();  // gethostname(2)

// A new file in `dir` that no directory entry names: O_TMPFILE, or, where the filesystem refuses it,
// `path` created (O_EXCL) and unlinked at once. O_RDWR | O_CLOEXEC, plus O_DIRECT when `direct`.
// Returns the descriptor, or -1 with errno set by the open that failed (EINVAL: no O_DIRECT here).
// ZT_NVME_NO_TMPFILE acts out a filesystem without O_TMPFILE (tests of the second way).
int open_unnamed(const std::string& dir, const std::string& path, bool direct);

}  // namespace zt::offload
