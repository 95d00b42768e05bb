#include "offload/nvme_dir.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <sstream>
#include <vector>

#include "offload/swap_file.h"
#include "runtime/error.h"
#include "runtime/memory.h"

namespace zt::offload {

namespace fs = std::filesystem;

namespace {
const char* const kField = "offload.nvme_dir: ";

// The directory itself when it exists, else its nearest existing ancestor (which must be a
// directory for the missing part to be creatable). A path that cannot be looked up at all (a
// symlink loop, a component without search permission) is refused here, not later by mkdir.
fs::path existing_base(const std::string& dir) {
  fs::path p = fs::absolute(dir);
  for (;;) {
    std::error_code ec;
    if (fs::exists(p, ec) || !p.has_relative_path()) return p;
    ZT_REQUIRE(!ec, kField << "\"" << dir << "\" cannot be used: " << ec.message()
                           << "; set offload.nvme_dir to a directory on a local disk");
    p = p.parent_path();
  }
}

uint64_t fake_free() {
  const char* s = std::getenv("ZT_NVME_FREE_BYTES");
  char* end = nullptr;
  errno = 0;
  const unsigned long long v = std::strtoull(s, &end, 10);
  ZT_REQUIRE(*s != '\0' && *end == '\0' && errno == 0 && s[0] != '-',
             "ZT_NVME_FREE_BYTES: \"" << s << "\" is not a number of bytes (unset it to use statvfs)");
  return v;
}

struct Found {
  std::vector<std::string> names;
  uint64_t bytes = 0;  // blocks on disk
};

std::string first_names(const std::vector<std::string>& names) {
  std::ostringstream os;
  for (size_t i = 0; i < names.size() && i < 4; ++i) os << (i ? ", " : "") << names[i];
  if (names.size() > 4) os << " and " << names.size() - 4 << " more";
  return os.str();
}

// Named swap files in `dir` (see nvme_dir.h): removes those of processes that no longer run on this
// host, returns them in `removed` and the others in `kept`. A process is alive when kill(pid, 0)
// finds it (EPERM: it is someone else's); a pid reused since is taken as alive, which keeps a file
// that could have gone, never the reverse.
void sweep_stale(const std::string& dir, Found& removed, Found& kept) {
  // Turns between the ranks of this host (released by close); a filesystem without locks on
  // directories only loses the single report.
  const int lock = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (lock >= 0) flock(lock, LOCK_EX);
  const std::string host = this_host();
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    const std::optional<SwapFileOwner> owner = swap_file_owner(name);
    struct stat st {};
    if (!owner || lstat(e.path().c_str(), &st) != 0 || !S_ISREG(st.st_mode)) continue;
    const bool here = owner->host.empty() || owner->host == host;
    const bool dead = here && kill(pid_t(owner->pid), 0) != 0 && errno == ESRCH;
    Found& f = dead && unlink(e.path().c_str()) == 0 ? removed : kept;
    f.names.push_back(name);
    f.bytes += uint64_t(st.st_blocks) * 512;
  }
  if (lock >= 0) close(lock);
}
}  // namespace

void check_nvme_free_override() {
  if (std::getenv("ZT_NVME_FREE_BYTES")) (void)fake_free();
}

NvmeDir check_nvme_dir(const std::string& dir, uint64_t need_bytes, const std::string& need_detail) {
  NvmeDir out;
  const fs::path base = existing_base(dir);
  const bool exists = base == fs::absolute(dir);
  std::error_code ec;
  ZT_REQUIRE(fs::is_directory(base, ec),
             kField << "\"" << dir << "\" " << (exists ? "is not a directory" : "cannot be created: \"" + base.string() +
                                                                                  "\" is not a directory")
                    << "; set offload.nvme_dir to a directory on a local disk");
  // A probe opened as the swap files will be, where they will be (or in the ancestor they will be
  // created under). ZT_NVME_NO_DIRECT acts out a filesystem without O_DIRECT.
  const std::string probe = (base / (".zerotrain-probe." + std::to_string(getpid()))).string();
  const bool refuse_direct = std::getenv("ZT_NVME_NO_DIRECT") != nullptr;
  int fd = refuse_direct ? -1 : open_unnamed(base.string(), probe, true);
  if (refuse_direct) errno = EINVAL;
  if (fd < 0 && errno == EINVAL) {
    out.direct = false;
    fd = open_unnamed(base.string(), probe, false);
  }
  ZT_REQUIRE(fd >= 0, kField << "\"" << dir << "\" is not writable" << (exists ? "" : " (nor creatable)") << ": cannot create "
                             << "a file in \"" << base.string() << "\" (" << std::strerror(errno)
                             << "); choose a writable directory on a local disk");
  ZT_CHECK_ERRNO(close(fd) == 0, "close(\"" << probe << "\")");

  Found removed, kept;
  if (exists) sweep_stale(base.string(), removed, kept);
  if (!removed.names.empty()) {
    std::ostringstream os;
    os << kField << "removed " << removed.names.size() << " stale swap file(s) (" << format_bytes(double(removed.bytes))
       << ") left in \"" << dir << "\" by processes no longer running on this host: " << first_names(removed.names);
    out.removed = os.str();
  }

  if (std::getenv("ZT_NVME_FREE_BYTES")) {
    out.free_bytes = fake_free() + removed.bytes;
    out.free_source = "ZT_NVME_FREE_BYTES";
  } else {
    struct statvfs st {};
    ZT_CHECK_ERRNO(statvfs(base.c_str(), &st) == 0, "statvfs(\"" << base.string() << "\")");
    out.free_bytes = uint64_t(st.f_bavail) * uint64_t(st.f_frsize);
    out.free_source = "statvfs";
  }
  std::ostringstream others;
  if (!kept.names.empty())
    others << "; it also holds " << kept.names.size() << " swap file(s) (" << format_bytes(double(kept.bytes))
           << ") of running processes or other hosts, not removed: " << first_names(kept.names);
  ZT_REQUIRE(need_bytes <= out.free_bytes,
             kField << "the swap files need " << format_bytes(double(need_bytes)) << " (" << need_detail << ") but \""
                    << base.string() << "\" has " << format_bytes(double(out.free_bytes)) << " free (" << out.free_source
                    << (removed.names.empty() ? "" : "; " + out.removed.substr(std::strlen(kField))) << ")" << others.str()
                    << "; free space there, point offload.nvme_dir at a larger disk, or use more ranks");
  return out;
}

}  // namespace zt::offload
