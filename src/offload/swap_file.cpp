#include "offload/swap_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstdint>
#include <cstring>
#include <memory>
#include <regex>

#include "runtime/error.h"

namespace zt::offload {

namespace {
constexpr size_t kBounce = 1 << 20;

struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};
std::unique_ptr<unsigned char, FreeDeleter> bounce_buffer() {
  void* p = std::aligned_alloc(kIoAlign, kBounce);
  ZT_CHECK_ERRNO(p != nullptr, "aligned_alloc of a " << kBounce << "-byte swap bounce buffer");
  return std::unique_ptr<unsigned char, FreeDeleter>(static_cast<unsigned char*>(p));
}
}  // namespace

std::string this_host() {
  char buf[256] = {};
  if (gethostname(buf, sizeof buf - 1) != 0) return "unknown";
  return buf;
}

std::string swap_file_path(const std::string& dir, int rank, const std::string& tag) {
  return dir + "/zerotrain.r" + std::to_string(rank) + ".p" + std::to_string(getpid()) + "@" + this_host() + "." + tag +
         ".swap";
}

std::optional<SwapFileOwner> swap_file_owner(const std::string& filename) {
  // Host names hold no '@' and tags no '.'; pids are below 2^22 (pid_max).
  static const std::regex re(R"(^zerotrain\.r[0-9]+\.p([0-9]{1,9})(@(.+))?\.[A-Za-z0-9_]+\.swap$)");
  std::smatch m;
  if (!std::regex_match(filename, m, re)) return std::nullopt;
  return SwapFileOwner{std::stol(m[1].str()), m[3].str()};
}

int open_unnamed(const std::string& dir, const std::string& path, bool direct) {
  const int flags = O_RDWR | O_CLOEXEC | (direct ? O_DIRECT : 0);
  if (!std::getenv("ZT_NVME_NO_TMPFILE")) {
    const int fd = open(dir.c_str(), flags | O_TMPFILE, 0600);
    // EOPNOTSUPP: this filesystem has no O_TMPFILE; EISDIR: the kernel predates it (O_TMPFILE
    // includes O_DIRECTORY). Any other error (EINVAL for O_DIRECT, EACCES, ...) is the answer.
    if (fd >= 0 || (errno != EOPNOTSUPP && errno != EISDIR)) return fd;
  }
  const int fd = open(path.c_str(), flags | O_CREAT | O_EXCL, 0600);
  const int saved = errno;
  // O_EXCL: whatever is at `path` now is ours, also after a failure past the creation (a filesystem
  // refuses O_DIRECT only once the file exists).
  if ((fd >= 0 || saved != EEXIST) && unlink(path.c_str()) != 0 && fd >= 0) {
    const int unlink_errno = errno;
    close(fd);
    errno = unlink_errno;
    return -1;
  }
  errno = saved;
  return fd;
}

SwapFile::SwapFile(std::string path, size_t bytes, bool direct) : path_(std::move(path)), bytes_(bytes) {
  const size_t slash = path_.rfind('/');
  const std::string dir = slash == std::string::npos ? "." : path_.substr(0, std::max<size_t>(slash, 1));
  fd_ = open_unnamed(dir, path_, direct);
  ZT_CHECK_ERRNO(fd_ >= 0, "open an unnamed swap file (\"" << path_ << "\")" << (direct ? " with O_DIRECT" : ""));
  // Reserve the blocks now: a disk that fills up later would fail a write in the middle of a step.
  // Filesystems without fallocate get a sparse file (the start-up check counted the space).
  const off_t n = off_t(file_bytes());
  int rc = n > 0 ? posix_fallocate(fd_, 0, n) : 0;
  if (rc == EOPNOTSUPP || rc == EINVAL) rc = ftruncate(fd_, n) == 0 ? 0 : errno;
  if (rc != 0) {
    close(fd_);
    errno = rc;
    ZT_CHECK_ERRNO(false, "posix_fallocate(\"" << path_ << "\", " << n << " bytes)");
  }
}

SwapFile::~SwapFile() {
  // Unchecked on purpose: a destructor cannot report. The last close frees the blocks.
  if (fd_ >= 0) close(fd_);
}

void SwapFile::read_all(void* dst) const {
  auto buf = bounce_buffer();
  for (size_t off = 0; off < bytes_; off += kBounce) {
    const size_t n = std::min(kBounce, bytes_ - off), len = io_round_up(n);
    size_t got = 0;
    while (got < len) {
      const ssize_t r = pread(fd_, buf.get() + got, len - got, off_t(off + got));
      ZT_CHECK_ERRNO(r > 0, "pread(\"" << path_ << "\", " << len - got << " bytes at " << off + got << ")");
      got += size_t(r);
    }
    std::memcpy(static_cast<unsigned char*>(dst) + off, buf.get(), n);
  }
}

void SwapFile::write_all(const void* src) {
  auto buf = bounce_buffer();
  for (size_t off = 0; off < bytes_; off += kBounce) {
    const size_t n = std::min(kBounce, bytes_ - off), len = io_round_up(n);
    std::memset(buf.get() + n, 0, len - n);  // the file's padding stays zero
    std::memcpy(buf.get(), static_cast<const unsigned char*>(src) + off, n);
    size_t put = 0;
    while (put < len) {
      const ssize_t r = pwrite(fd_, buf.get() + put, len - put, off_t(off + put));
      ZT_CHECK_ERRNO(r > 0, "pwrite(\"" << path_ << "\", " << len - put << " bytes at " << off + put << ")");
      put += size_t(r);
    }
  }
}

void SwapFile::read_blocks(void* buf, size_t len, uint64_t off) const {
  ZT_ASSERT(off % kIoAlign == 0 && len % kIoAlign == 0 && reinterpret_cast<uintptr_t>(buf) % kIoAlign == 0);
  ZT_ASSERT(off + len <= file_bytes());
  for (size_t got = 0; got < len;) {
    const ssize_t r = pread(fd_, static_cast<unsigned char*>(buf) + got, len - got, off_t(off + got));
    ZT_CHECK_ERRNO(r > 0, "pread(\"" << path_ << "\", " << len - got << " bytes at " << off + got << ")");
    got += size_t(r);
  }
}

void SwapFile::write_blocks(const void* buf, size_t len, uint64_t off) {
  ZT_ASSERT(off % kIoAlign == 0 && len % kIoAlign == 0 && reinterpret_cast<uintptr_t>(buf) % kIoAlign == 0);
  ZT_ASSERT(off + len <= file_bytes());
  for (size_t put = 0; put < len;) {
    const ssize_t r = pwrite(fd_, static_cast<const unsigned char*>(buf) + put, len - put, off_t(off + put));
    ZT_CHECK_ERRNO(r > 0, "pwrite(\"" << path_ << "\", " << len - put << " bytes at " << off + put << ")");
    put += size_t(r);
  }
}

void SwapFile::write_at(const void* src, size_t len, uint64_t off) {
  ZT_ASSERT(off + len <= bytes_);
  auto buf = bounce_buffer();
  const uint64_t end = off + len;
  for (uint64_t w = off / kIoAlign * kIoAlign; w < end; w += kBounce) {
    const size_t wlen = std::min<uint64_t>(kBounce, io_round_up(end) - w);
    const uint64_t lo = std::max(w, off), hi = std::min<uint64_t>(w + wlen, end);
    if (lo != w || hi != w + wlen) read_blocks(buf.get(), wlen, w);  // keep the neighbours' bytes
    std::memcpy(buf.get() + (lo - w), static_cast<const unsigned char*>(src) + (lo - off), hi - lo);
    write_blocks(buf.get(), wlen, w);
  }
}

void SwapFile::read_at(void* dst, size_t len, uint64_t off) const {
  ZT_ASSERT(off + len <= bytes_);
  auto buf = bounce_buffer();
  const uint64_t end = off + len;
  for (uint64_t r = off / kIoAlign * kIoAlign; r < end; r += kBounce) {
    const size_t rlen = std::min<uint64_t>(kBounce, io_round_up(end) - r);
    const uint64_t lo = std::max(r, off), hi = std::min<uint64_t>(r + rlen, end);
    read_blocks(buf.get(), rlen, r);
    std::memcpy(static_cast<unsigned char*>(dst) + (lo - off), buf.get() + (lo - r), hi - lo);
  }
}

}  // namespace zt::offload
