#include "offload/nvme_dir.h"

#include <fcntl.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "runtime/error.h"
#include "runtime/memory.h"

namespace zt::offload {

namespace fs = std::filesystem;

namespace {
const char* const kField = "offload.nvme_dir: ";

// The directory itself when it exists, else its nearest existing ancestor (which must be a
// directory for the missing part to be creatable).
fs::path existing_base(const fs::path& dir) {
  fs::path p = fs::absolute(dir);
  std::error_code ec;
  while (!fs::exists(p, ec) && p.has_relative_path()) p = p.parent_path();
  return p;
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
}  // namespace

NvmeDir check_nvme_dir(const std::string& dir, uint64_t need_bytes, const std::string& need_detail) {
  NvmeDir out;
  const fs::path base = existing_base(dir);
  const bool exists = base == fs::absolute(dir);
  std::error_code ec;
  ZT_REQUIRE(fs::is_directory(base, ec),
             kField << "\"" << dir << "\" " << (exists ? "is not a directory" : "cannot be created: \"" + base.string() +
                                                                                  "\" is not a directory")
                    << "; set offload.nvme_dir to a directory on a local disk");
  // A probe file where the swap files will be (or in the ancestor they will be created under).
  const std::string probe = (base / (".zerotrain-probe." + std::to_string(getpid()))).string();
  // ZT_NVME_NO_DIRECT acts out a filesystem without O_DIRECT (tests run the buffered path with it).
  const bool refuse_direct = std::getenv("ZT_NVME_NO_DIRECT") != nullptr;
  int fd = refuse_direct ? -1 : open(probe.c_str(), O_RDWR | O_CREAT | O_EXCL | O_DIRECT, 0600);
  if (refuse_direct) errno = EINVAL;
  if (fd < 0 && errno == EINVAL) {
    out.direct = false;
    fd = open(probe.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
  }
  ZT_REQUIRE(fd >= 0, kField << "\"" << dir << "\" is not writable" << (exists ? "" : " (nor creatable)") << ": cannot create "
                             << "a file in \"" << base.string() << "\" (" << std::strerror(errno)
                             << "); choose a writable directory on a local disk");
  ZT_CHECK_ERRNO(close(fd) == 0, "close(\"" << probe << "\")");
  ZT_CHECK_ERRNO(unlink(probe.c_str()) == 0, "unlink(\"" << probe << "\")");

  if (std::getenv("ZT_NVME_FREE_BYTES")) {
    out.free_bytes = fake_free();
    out.free_source = "ZT_NVME_FREE_BYTES";
  } else {
    struct statvfs st {};
    ZT_CHECK_ERRNO(statvfs(base.c_str(), &st) == 0, "statvfs(\"" << base.string() << "\")");
    out.free_bytes = uint64_t(st.f_bavail) * uint64_t(st.f_frsize);
    out.free_source = "statvfs";
  }
  ZT_REQUIRE(need_bytes <= out.free_bytes,
             kField << "the swap files need " << format_bytes(double(need_bytes)) << " (" << need_detail << ") but \""
                    << base.string() << "\" has " << format_bytes(double(out.free_bytes)) << " free (" << out.free_source
                    << "); free space there, point offload.nvme_dir at a larger disk, or use more ranks");
  return out;
}

}  // namespace zt::offload
