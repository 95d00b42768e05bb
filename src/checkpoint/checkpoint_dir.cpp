#include "checkpoint/checkpoint_dir.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <utility>

#include "checkpoint/checkpoint.h"
#include "checkpoint/reader.h"
#include "runtime/memory.h"

namespace fs = std::filesystem;

namespace zt::ckpt {

namespace {

constexpr const char* kLockFile = ".lock";

std::string hex64(uint64_t x) {
  char s[24];
  std::snprintf(s, sizeof s, "%016llx", (unsigned long long)x);
  return s;
}

uint64_t new_run_id() {
  uint64_t id = 0;
  while (id == 0)  // 0 is "not recorded" (older checkpoints)
    ZT_REQUIRE(::getrandom(&id, sizeof id, 0) == ssize_t(sizeof id),
               "checkpoint: cannot draw a run id: " << std::strerror(errno));
  return id;
}

// The step directories under `dir`, newest first.
std::vector<std::pair<int64_t, std::string>> step_dirs(const std::string& dir) {
  std::vector<std::pair<int64_t, std::string>> out;
  std::error_code ec;
  for (const fs::directory_entry& e : fs::directory_iterator(dir, ec)) {
    int64_t step;
    if (is_step_dir_name(e.path().filename().string(), step) && e.is_directory(ec))
      out.push_back({step, (fs::path(dir) / e.path().filename()).string()});
  }
  ZT_REQUIRE(!ec, "checkpoint.dir: cannot list " << dir << ": " << ec.message());
  std::sort(out.rbegin(), out.rend());
  return out;
}

// Resume "auto": the step `latest` names, else the newest that verifies (with `note` saying so),
// else "" when there is no step directory at all.
std::string auto_resume(const std::string& dir, std::string& note) {
  const fs::path pointer = fs::path(dir) / kLatestFile;
  std::error_code ec;
  std::string problem;
  if (!fs::exists(fs::symlink_status(pointer, ec))) {
    problem = "is missing";
  } else {
    ZT_REQUIRE(!fs::is_directory(pointer, ec), "checkpoint.dir: " << pointer.string()
                                                                  << " is a directory; it must be the file naming the "
                                                                     "newest complete step (as step_00000010): move it "
                                                                     "out of "
                                                                  << dir);
    try {
      return latest(dir);
    } catch (const Error&) {
      problem = "names no step directory";
    }
  }
  const auto steps = step_dirs(dir);
  if (steps.empty()) return "";
  std::string skipped;
  for (const auto& [step, path] : steps) {
    try {
      CheckpointReader rd(path);
      rd.verify(ParamLayout(rd.meta().model, 1));
      note = "checkpoint: " + pointer.string() + " " + problem + "; resuming from " +
             fs::path(path).filename().string() + ", the newest complete checkpoint in " + dir +
             (skipped.empty() ? "" : " (" + skipped + ")");
      return path;
    } catch (const Error& e) {
      if (skipped.empty()) skipped = fs::path(path).filename().string() + " skipped: " + e.what();
    }
  }
  throw Error("checkpoint.resume: " + pointer.string() + " " + problem + " and none of the " +
              std::to_string(steps.size()) + " step directories in " + dir + " is complete (" + skipped +
              "); resume from one of them by path, or give a new checkpoint.dir");
}

// What a run killed in a save (or after it took the lock) left in `dir`, which this run now
// holds: nothing live writes there, and the directory is this run's (open_checkpoint_dir's checks).
// Removed, and said in one line, prepended to s.note.
void remove_leftovers(const std::string& dir, CheckpointStart& s) {
  std::vector<std::string> gone;
  std::error_code ec;
  for (const fs::directory_entry& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    int64_t step;
    const bool tmp_step = name.rfind(".tmp_", 0) == 0 && is_step_dir_name(name.substr(5), step);
    if (!tmp_step && name != ".latest.tmp") continue;
    uint64_t bytes = 0;
    for (const fs::directory_entry& f : fs::recursive_directory_iterator(e.path(), ec))
      if (f.is_regular_file(ec)) bytes += f.file_size(ec);
    if (e.is_regular_file(ec)) bytes = e.file_size(ec);
    fs::remove_all(e.path(), ec);
    ZT_REQUIRE(!ec, "checkpoint.dir: cannot remove " << e.path().string() << ", left by an interrupted run: "
                                                     << ec.message());
    gone.push_back(name + " (" + format_bytes(double(bytes)) + ")");
  }
  ZT_REQUIRE(!ec, "checkpoint.dir: cannot list " << dir << ": " << ec.message());
  if (gone.empty() && s.lock.left_by().empty()) return;
  std::sort(gone.begin(), gone.end());
  std::string line = "checkpoint: removed what an interrupted run left in " + dir + ": ";
  for (size_t i = 0; i < gone.size(); ++i) line += (i ? ", " : "") + gone[i];
  if (!s.lock.left_by().empty())
    line += std::string(gone.empty() ? "" : "; ") + "its lock (" + s.lock.left_by() + ", which no longer holds it)";
  s.note = s.note.empty() ? line : line + "\n" + s.note;
}

}  // namespace

DirLock::DirLock(const std::string& dir) {
  try {
    lock(dir);
  } catch (...) {
    release();
    throw;
  }
}

void DirLock::lock(const std::string& dir) {
  struct stat st;
  std::error_code ec;
  if (::stat(dir.c_str(), &st) == 0) {
    ZT_REQUIRE(S_ISDIR(st.st_mode), "checkpoint.dir: " << dir << " is a file, not a directory; give a directory for "
                                                          "the step_NNNNNNNN checkpoints (a new one, or this run's)");
  } else {
    // Created here, and removed again on release when the run (refused, say) put nothing in them.
    fs::path p = fs::path(dir).lexically_normal();
    if (!p.has_filename()) p = p.parent_path();  // "a/b/"
    for (; !p.empty() && !fs::exists(fs::symlink_status(p, ec)); p = p.parent_path()) {
      created_.push_back(p.string());
      if (p == p.parent_path()) break;
    }
    fs::create_directories(dir, ec);
    ZT_REQUIRE(!ec, "checkpoint.dir: cannot create " << dir << ": " << ec.message() << "; choose another directory");
  }
  path_ = (fs::path(dir) / kLockFile).string();
  // The lock file is removed on release, so a lock taken on a file that was unlinked meanwhile
  // (by the holder that just finished) is taken again on the new one.
  for (;;) {
    fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    ZT_REQUIRE(fd_ >= 0, "checkpoint.dir: cannot create files in " << dir << ": " << std::strerror(errno)
                                                                  << "; choose another directory");
    if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
      const int err = errno;
      std::string pid = "?", host = "?";
      std::ifstream f(path_);
      f >> pid >> host;
      ::close(fd_);
      fd_ = -1;
      ZT_REQUIRE(err != EWOULDBLOCK, "checkpoint.dir: " << dir << " is in use by pid " << pid << " on host " << host
                                                        << " (another run saves there); wait for it to end, or give "
                                                           "this run its own checkpoint.dir");
      throw Error("checkpoint.dir: cannot lock " + path_ + ": " + std::strerror(err));
    }
    struct stat held, now;
    if (::fstat(fd_, &held) == 0 && ::stat(path_.c_str(), &now) == 0 && held.st_ino == now.st_ino &&
        held.st_dev == now.st_dev) {
      // A released lock takes its file along; one with a holder written in it outlived its run.
      std::string pid, host;
      std::ifstream f(path_);
      if (f >> pid >> host) left_by_ = "pid " + pid + " on host " + host;
      break;
    }
    ::close(fd_);
    fd_ = -1;
  }
  char host[256] = "?";
  ::gethostname(host, sizeof host - 1);
  const std::string who = std::to_string(::getpid()) + " " + host + "\n";
  ZT_REQUIRE(::ftruncate(fd_, 0) == 0 && ::pwrite(fd_, who.data(), who.size(), 0) == ssize_t(who.size()),
             "checkpoint.dir: cannot write " << path_ << ": " << std::strerror(errno));
}

DirLock& DirLock::operator=(DirLock&& o) noexcept {
  if (this != &o) {
    release();
    fd_ = std::exchange(o.fd_, -1);
    path_ = std::move(o.path_);
    created_ = std::move(o.created_);
    left_by_ = std::move(o.left_by_);
  }
  return *this;
}

void DirLock::release() {
  if (fd_ >= 0) {
    ::unlink(path_.c_str());  // while still held: see lock()
    ::close(fd_);
    fd_ = -1;
  }
  for (const std::string& d : created_) ::rmdir(d.c_str());  // only when empty
  created_.clear();
}

CheckpointStart open_checkpoint_dir(const CheckpointSection& c) {
  CheckpointStart s;
  if (c.dir.empty()) {
    s.resume_from = resolve_resume(c);
  } else {
    s.lock = DirLock(c.dir);
    if (c.resume == "none") {
      // A fresh run would save over another run's steps (same numbers) and move its `latest`.
      std::error_code ec;
      for (const fs::directory_entry& e : fs::directory_iterator(c.dir, ec)) {
        const std::string name = e.path().filename().string();
        ZT_REQUIRE(name != kLatestFile && name.rfind("step_", 0) != 0,
                   "checkpoint.dir: " << c.dir << " already holds checkpoints (" << name
                                      << "); set checkpoint.resume to \"auto\" to continue that run, or give a "
                                         "new or empty directory");
      }
    } else {
      s.resume_from = c.resume == "auto" ? auto_resume(c.dir, s.note) : resolve_resume(c);
    }
  }
  s.run_id = s.resume_from.empty() ? new_run_id() : read_step_meta(s.resume_from).run_id;
  if (c.dir.empty()) return s;
  if (c.resume == "none") {
    remove_leftovers(c.dir, s);
    return s;
  }
  for (const auto& [step, path] : step_dirs(c.dir)) {
    Meta m;
    try {
      m = read_step_meta(path);
    } catch (const Error& e) {
      throw Error("checkpoint.dir: cannot tell which run saved " + path + " (" + e.what() +
                  "); move it out of " + c.dir + ", or give another checkpoint.dir");
    }
    ZT_REQUIRE(m.run_id == s.run_id,
               "checkpoint.dir: " << c.dir << " already holds checkpoints of another run (" << fs::path(path).filename().string()
                                  << ", run id " << hex64(m.run_id) << "; this run "
                                  << (s.resume_from.empty() ? "starts fresh" : "continues run id " + hex64(s.run_id))
                                  << "); give this run a new or empty checkpoint.dir, or set checkpoint.resume to "
                                     "\"auto\" to continue that run");
  }
  remove_leftovers(c.dir, s);
  return s;
}

Continuation share_start(Comm& comm, const CheckpointSection& c, const CheckpointStart& start) {
  // The step directory travels as a number (control traffic carries integers): 0 none, 1 the
  // checkpoint.resume path itself, else 2 + the step of a step directory in checkpoint.dir ("auto")
  // or in the checkpoint.resume directory (a checkpoint.dir given by path).
  const fs::path parent = c.resume == "auto" ? fs::path(c.dir) : fs::path(c.resume);
  auto decode = [&](uint64_t code) {
    if (code == 0) return std::string();
    if (code == 1) return c.resume;
    return (parent / step_dir_name(int64_t(code - 2))).string();
  };
  uint64_t code = 0;
  if (comm.rank() == 0 && !start.resume_from.empty()) {
    int64_t step = 0;
    code = start.resume_from == c.resume ? 1
           : is_step_dir_name(fs::path(start.resume_from).filename().string(), step) ? 2 + uint64_t(step)
                                                                                      : 0;
    ZT_ASSERT(decode(code) == start.resume_from);
  }
  Continuation out;
  out.resume_from = decode(comm.all_gather_u64(code)[0]);
  out.run_id = comm.all_gather_u64(start.run_id)[0];
  return out;
}

std::vector<std::string> changed_plan_fields(const std::string& saved, const Plan& plan) {
  std::vector<std::string> out;
  if (saved.empty()) return out;
  const nlohmann::json old = nlohmann::json::parse(saved, nullptr, false);
  if (old.is_discarded()) return out;
  std::vector<std::string> fields = {"/data/train", "/data/val", "/data/shuffle", "/run/steps"};
  for (const auto& [key, value] : plan.resolved["optim"].items()) fields.push_back("/optim/" + key);
  for (const std::string& f : fields) {
    const nlohmann::json::json_pointer ptr(f);
    const nlohmann::json was = old.contains(ptr) ? old[ptr] : nlohmann::json("(not recorded)");
    const nlohmann::json& now = plan.resolved[ptr];
    if (was == now) continue;
    std::string name = f.substr(1);
    std::replace(name.begin(), name.end(), '/', '.');
    out.push_back(name + " " + was.dump() + " -> " + now.dump());
  }
  return out;
}

}  // namespace zt::ckpt
