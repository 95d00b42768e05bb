#include "train/outputs.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

#include "runtime/error.h"
#include "runtime/memory.h"

namespace zt {

namespace fs = std::filesystem;

namespace {

const char* kind_of(mode_t m) {
  if (S_ISCHR(m)) return "a character device";
  if (S_ISBLK(m)) return "a block device";
  if (S_ISFIFO(m)) return "a FIFO";
  if (S_ISSOCK(m)) return "a socket";
  return "not a plain file";
}

// Checks that `path` can be written as a regular file and returns the path to write: the target
// of an existing symlink, so that the rename at the end replaces the file, not the link. A rename
// onto a device (as root: /dev/null) would replace the device, so anything but a regular file or
// a new name is refused. Directories missing under the nearest existing one are created at start;
// that directory must accept a new file (probed: permissions alone do not say, e.g. for root or a
// read-only mount) and, with `bytes`, have room for it.
std::string check_output_path(const std::string& field, const std::string& path, uint64_t bytes) {
  std::string target = path;
  struct stat st;
  if (::stat(path.c_str(), &st) == 0) {
    ZT_REQUIRE(!S_ISDIR(st.st_mode), field << ": " << path << " is a directory; give the path of a file in it (e.g. "
                                           << (fs::path(path) / (field == "run.log" ? "metrics.jsonl" : "model.bin")).string()
                                           << ")");
    ZT_REQUIRE(S_ISREG(st.st_mode), field << ": " << path << " is not a regular file (" << kind_of(st.st_mode)
                                          << "); give a new path, or a regular file to replace");
    std::error_code ec;
    const fs::path resolved = fs::canonical(path, ec);
    if (!ec) target = resolved.string();
  } else {
    ZT_REQUIRE(errno == ENOENT, field << ": cannot use " << path << ": " << std::strerror(errno));
  }

  fs::path dir = fs::path(target).parent_path();
  for (;;) {
    if (dir.empty()) dir = ".";
    struct stat ds;
    if (::stat(dir.c_str(), &ds) == 0) {
      ZT_REQUIRE(S_ISDIR(ds.st_mode), field << ": " << dir.string() << " is not a directory (in " << path << ")");
      break;
    }
    ZT_REQUIRE(errno == ENOENT, field << ": cannot use " << dir.string() << " (for " << path << "): " << std::strerror(errno));
    dir = dir.parent_path();
  }

  std::string probe = (dir / ".zt_probe_XXXXXX").string();
  const int fd = ::mkstemp(probe.data());
  ZT_REQUIRE(fd >= 0, field << ": cannot create files in " << dir.string() << " (for " << path << "): "
                            << std::strerror(errno) << "; choose another path");
  ::close(fd);
  ::unlink(probe.c_str());

  struct statvfs vs;
  if (bytes > 0 && ::statvfs(dir.c_str(), &vs) == 0) {
    const uint64_t free_bytes = uint64_t(vs.f_bavail) * uint64_t(vs.f_frsize);
    ZT_REQUIRE(free_bytes >= bytes, field << ": " << path << " needs " << format_bytes(double(bytes)) << " but "
                                          << dir.string() << " has only " << format_bytes(double(free_bytes))
                                          << " free; free some space or choose another path");
  }
  return target;
}

void create_directories(const std::string& field, const fs::path& dir) {
  if (dir.empty()) return;
  std::error_code ec;
  fs::create_directories(dir, ec);
  ZT_REQUIRE(!ec, field << ": cannot create directory " << dir.string() << ": " << ec.message());
}

fs::path dir_of(const std::string& path) {
  const fs::path p(path);
  return p.has_parent_path() ? p.parent_path() : fs::path(".");
}

}  // namespace

RunOutputs check_run_outputs(const Plan& plan, uint64_t final_weights_bytes) {
  RunOutputs out;
  out.log = check_output_path("run.log", plan.run.log, 0);
  out.plan_json = (dir_of(out.log) / "plan.json").string();
  ZT_REQUIRE(fs::path(out.log).filename() != "plan.json",
             "run.log: " << plan.run.log << " is where the resolved plan is written; name the log otherwise "
                         << "(e.g. metrics.jsonl)");
  // checkpoint.dir must take new files now, not at the first save hours later.
  if (!plan.checkpoint.dir.empty()) {
    check_output_path("checkpoint.dir", (fs::path(plan.checkpoint.dir) / "latest").string(), 0);
    // A fresh run would save over another run's steps (same numbers) and move its `latest`: refuse
    // rather than mix two runs in one directory (docs/design.md §3.7).
    if (plan.checkpoint.resume == "none") {
      std::error_code ec;
      for (const fs::directory_entry& e : fs::directory_iterator(plan.checkpoint.dir, ec)) {
        const std::string name = e.path().filename().string();
        ZT_REQUIRE(name != "latest" && name.rfind("step_", 0) != 0,
                   "checkpoint.dir: " << plan.checkpoint.dir << " already holds checkpoints (" << name
                                      << "); set checkpoint.resume to \"auto\" to continue that run, or give a "
                                         "new or empty directory");
      }
    }
  }
  if (!plan.run.final_weights.empty())
    out.final_weights = check_output_path("run.final_weights", plan.run.final_weights, final_weights_bytes);
  return out;
}

std::string open_run_outputs(const Plan& plan, const RunOutputs& out) {
  create_directories("run.log", dir_of(out.log));
  if (!out.final_weights.empty()) create_directories("run.final_weights", dir_of(out.final_weights));

  // An earlier run's log and plan move aside together (same N), never overwritten: the new run
  // cannot know whether they matter.
  std::string moved;
  std::vector<fs::path> earlier;
  for (const fs::path p : {fs::path(out.log), fs::path(out.plan_json)}) {
    std::error_code ec;
    if (fs::exists(fs::symlink_status(p, ec))) earlier.push_back(p);
  }
  if (!earlier.empty()) {
    auto aside = [](const fs::path& p, int n) { return fs::path(p.string() + "." + std::to_string(n)); };
    int n = 1;
    for (;; ++n) {
      std::error_code e1, e2;
      if (!fs::exists(fs::symlink_status(aside(out.log, n), e1)) &&
          !fs::exists(fs::symlink_status(aside(out.plan_json, n), e2)))
        break;
    }
    std::ostringstream os;
    os << "run.log: an earlier run's files in " << dir_of(out.log).string() << " were moved aside:";
    for (size_t i = 0; i < earlier.size(); ++i) {
      const fs::path to = aside(earlier[i], n);
      std::error_code ec;
      fs::rename(earlier[i], to, ec);
      ZT_REQUIRE(!ec, "run.log: cannot move the earlier " << earlier[i].string() << " aside to " << to.string() << ": "
                                                          << ec.message());
      os << (i ? ", " : " ") << earlier[i].filename().string() << " -> " << to.filename().string();
    }
    moved = os.str();
  }

  std::ofstream f(out.plan_json);
  f << plan.resolved.dump(2) << "\n";
  f.flush();
  ZT_REQUIRE(f, "run.log: cannot write the resolved plan to " << out.plan_json << ": " << std::strerror(errno));
  return moved;
}

void write_by_rename(const std::string& field, const std::string& path,
                     const std::function<void(const std::string& tmp)>& write) {
  const std::string tmp = path + ".tmp";
  try {
    write(tmp);
    std::error_code ec;
    fs::rename(tmp, path, ec);
    ZT_REQUIRE(!ec, "cannot rename " << tmp << " to " << path << ": " << ec.message());
  } catch (const std::exception& e) {
    std::error_code ec;
    fs::remove(tmp, ec);
    throw Error(field + ": " + e.what());
  }
}

}  // namespace zt
