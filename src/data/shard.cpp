// Token shards: llm.c's format, memory-mapped read-only.
//
//   bytes [0, 1024)      256 x int32 little-endian header: magic 20240520, version 1, token count n
//   bytes [1024, +2n)    n x uint16 little-endian tokens
//
// Every way a file can be wrong (missing, not a shard, another version, cut short, padded) is
// reported with the file's name, what was found, and what was expected.
#include "data/shard.h"

#include <fcntl.h>
#include <glob.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "runtime/error.h"
#include "runtime/output_path.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "token shards are little-endian; this reader maps them directly and needs a little-endian host"
#endif

namespace zt {

namespace {

constexpr size_t kHeaderInts = 256;
constexpr size_t kHeaderBytes = kHeaderInts * sizeof(int32_t);

// Closes a file descriptor on every path out of the constructor.
struct Fd {
  int fd;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

}  // namespace

TokenShard::TokenShard(const std::string& path) : path_(path) {
  // Checked before the open: a FIFO blocks the open until some writer comes (forever, in a run).
  // O_NONBLOCK too, for one that appears between the two; the fstat below refuses it.
  check_input_file("data file", path);
  Fd f{::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK)};
  ZT_REQUIRE(f.fd >= 0, "data file " << path << ": cannot open: " << std::strerror(errno)
                                     << " (run scripts/prepare_data, or check data.train / data.val in the plan)");
  struct stat st;
  ZT_REQUIRE(::fstat(f.fd, &st) == 0, "data file " << path << ": cannot stat: " << std::strerror(errno));
  ZT_REQUIRE(S_ISREG(st.st_mode), "data file " << path << " is not a regular file");
  const size_t bytes = size_t(st.st_size);
  ZT_REQUIRE(bytes >= kHeaderBytes, "data file " << path << ": " << bytes << " bytes, too small for the "
                                                 << kHeaderBytes << "-byte header of an llm.c token shard");

  int32_t header[kHeaderInts];
  size_t got = 0;
  while (got < kHeaderBytes) {
    ssize_t r = ::pread(f.fd, reinterpret_cast<char*>(header) + got, kHeaderBytes - got, off_t(got));
    if (r < 0 && errno == EINTR) continue;
    ZT_REQUIRE(r > 0, "data file " << path << ": cannot read the header: "
                                   << (r < 0 ? std::strerror(errno) : "unexpected end of file"));
    got += size_t(r);
  }
  ZT_REQUIRE(header[0] == kShardMagic, "data file " << path << ": bad magic " << header[0]
                                                    << " (expected an llm.c token shard, magic " << kShardMagic << ")");
  ZT_REQUIRE(header[1] == kShardVersion, "data file " << path << ": unsupported version " << header[1]
                                                      << " (expected " << kShardVersion << ", uint16 tokens)");
  ZT_REQUIRE(header[2] >= 0, "data file " << path << ": negative token count " << header[2] << " in the header");
  const size_t n = size_t(header[2]);
  const size_t expected = kHeaderBytes + n * sizeof(uint16_t);
  ZT_REQUIRE(bytes == expected,
             "data file " << path << ": header says " << n << " tokens (" << expected << " bytes) but the file has "
                          << bytes << " bytes (" << (bytes < expected ? "truncated" : "trailing data")
                          << "; re-run scripts/prepare_data --force)");

  void* m = ::mmap(nullptr, bytes, PROT_READ, MAP_PRIVATE, f.fd, 0);
  ZT_REQUIRE(m != MAP_FAILED, "data file " << path << ": mmap of " << bytes << " bytes failed: " << std::strerror(errno));
  map_ = m;
  map_bytes_ = bytes;
  tokens_ = reinterpret_cast<const uint16_t*>(static_cast<const char*>(m) + kHeaderBytes);
  n_ = n;
}

TokenShard::~TokenShard() {
  if (map_) ::munmap(map_, map_bytes_);
}

TokenShard::TokenShard(TokenShard&& o) noexcept
    : path_(std::move(o.path_)), map_(o.map_), map_bytes_(o.map_bytes_), tokens_(o.tokens_), n_(o.n_) {
  o.map_ = nullptr;
  o.map_bytes_ = 0;
  o.tokens_ = nullptr;
  o.n_ = 0;
}

size_t TokenShard::first_token_at_least(uint32_t limit) const {
  if (limit > 0xFFFF) return n_;  // every uint16 is inside such a vocabulary
  // The maximum of a block vectorises; the position is looked for only in a block that has one.
  constexpr size_t kBlock = size_t(1) << 16;
  for (size_t b = 0; b < n_; b += kBlock) {
    const size_t e = std::min(n_, b + kBlock);
    uint16_t mx = 0;
    for (size_t i = b; i < e; ++i) mx = std::max(mx, tokens_[i]);
    if (mx < limit) continue;
    for (size_t i = b; i < e; ++i)
      if (tokens_[i] >= limit) return i;
  }
  return n_;
}

void write_token_shard(const std::string& path, const std::vector<uint16_t>& tokens) {
  ZT_REQUIRE(tokens.size() <= size_t(INT32_MAX),
             "token shard " << path << ": " << tokens.size() << " tokens do not fit the int32 count in the header");
  int32_t header[kHeaderInts] = {};
  header[0] = kShardMagic;
  header[1] = kShardVersion;
  header[2] = int32_t(tokens.size());
  FILE* f = std::fopen(path.c_str(), "wb");
  ZT_REQUIRE(f, "token shard " << path << ": cannot create: " << std::strerror(errno));
  bool ok = std::fwrite(header, sizeof(header), 1, f) == 1;
  if (ok && !tokens.empty()) ok = std::fwrite(tokens.data(), sizeof(uint16_t), tokens.size(), f) == tokens.size();
  const int saved = errno;
  const bool closed = std::fclose(f) == 0;
  ZT_REQUIRE(ok && closed, "token shard " << path << ": write failed: " << std::strerror(ok ? errno : saved));
}

std::vector<std::string> glob_files(const std::string& pattern) {
  glob_t g;
  std::memset(&g, 0, sizeof(g));
  const int rc = ::glob(pattern.c_str(), 0, nullptr, &g);
  std::vector<std::string> files;
  if (rc == 0)
    for (size_t i = 0; i < g.gl_pathc; ++i) files.emplace_back(g.gl_pathv[i]);
  ::globfree(&g);
  ZT_REQUIRE(rc != GLOB_NOSPACE, "data files " << pattern << ": out of memory while matching");
  ZT_REQUIRE(rc != GLOB_ABORTED, "data files " << pattern << ": cannot read a directory while matching");
  ZT_REQUIRE(!files.empty(), "data files " << pattern << ": no file matches (run scripts/prepare_data, "
                                           << "or check data.train / data.val in the plan)");
  // glob(3) sorts by the locale's collation; make the order byte-wise so every rank agrees.
  std::sort(files.begin(), files.end());
  return files;
}

std::vector<std::string> data_files(const std::string& pattern) {
  // A plain path is kept, so a missing file is reported by its open, in its own words.
  if (pattern.find_first_of("*?[") == std::string::npos) return {pattern};
  return glob_files(pattern);
}

}  // namespace zt
