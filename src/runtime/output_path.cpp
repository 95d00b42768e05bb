#include "runtime/output_path.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>

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

// Why `path` cannot be replaced by a regular file of ours ("" = it can: missing or a regular file,
// directly or through a symlink). A rename onto a device (as root: /dev/null) would replace the
// device, and one onto a symlink the link, hence the refusals.
std::string kind_problem(const std::string& path) {
  struct stat ls, st;
  if (::lstat(path.c_str(), &ls) != 0) {
    if (errno == ENOENT) return "";
    return std::string("cannot be used: ") + std::strerror(errno);
  }
  if (::stat(path.c_str(), &st) != 0) {
    std::error_code ec;
    const fs::path to = fs::read_symlink(path, ec);
    return "is a symlink to " + (ec ? std::string("a path") : to.string()) +
           " which cannot be reached; give a new path, or a link to a regular file";
  }
  if (S_ISDIR(st.st_mode)) return "is a directory; give the path of a file in it";
  if (!S_ISREG(st.st_mode))
    return std::string("is not a regular file (") + kind_of(st.st_mode) + "); give a new path, or a regular file to replace";
  return "";
}

// The path to write: the target of an existing symlink (so the rename at the end replaces the
// file, not the link), else `path`.
std::string write_target(const std::string& path) {
  struct stat ls;
  if (::lstat(path.c_str(), &ls) == 0 && S_ISLNK(ls.st_mode)) {
    std::error_code ec;
    const fs::path resolved = fs::canonical(path, ec);
    if (!ec) return resolved.string();
  }
  return path;
}

// The nearest directory that exists at or above the directory of `target`: where missing ones
// would be created and the new file lands.
fs::path existing_dir(const std::string& field, const std::string& path, const std::string& target) {
  fs::path dir = fs::path(target).parent_path();
  for (;;) {
    if (dir.empty()) dir = ".";
    struct stat ds;
    if (::stat(dir.c_str(), &ds) == 0) {
      ZT_REQUIRE(S_ISDIR(ds.st_mode), field << ": " << dir.string() << " is not a directory (in " << path << ")");
      return dir;
    }
    ZT_REQUIRE(errno == ENOENT, field << ": cannot use " << dir.string() << " (for " << path << "): " << std::strerror(errno));
    dir = dir.parent_path();
  }
}

void probe_dir(const std::string& field, const std::string& path, const fs::path& dir) {
  std::string probe = (dir / ".zt_probe_XXXXXX").string();
  const int fd = ::mkstemp(probe.data());
  ZT_REQUIRE(fd >= 0, field << ": cannot create files in " << dir.string() << " (for " << path << "): "
                            << std::strerror(errno) << "; choose another path");
  ::close(fd);
  ::unlink(probe.c_str());
}

void check_room(const std::string& field, const std::string& path, const fs::path& dir, uint64_t bytes) {
  struct statvfs vs;
  if (bytes == 0 || ::statvfs(dir.c_str(), &vs) != 0) return;
  const uint64_t free_bytes = uint64_t(vs.f_bavail) * uint64_t(vs.f_frsize);
  ZT_REQUIRE(free_bytes >= bytes, field << ": " << path << " needs " << format_bytes(double(bytes)) << " but "
                                        << dir.string() << " has only " << format_bytes(double(free_bytes))
                                        << " free; free some space or choose another path");
}

std::string check_kind(const std::string& field, const std::string& path) {
  const std::string problem = kind_problem(path);
  ZT_REQUIRE(problem.empty(), field << ": " << path << " " << problem);
  // "dir/" that does not exist yet: the temporary file would land inside it as a hidden file and
  // the final rename onto the directory fail, after the whole run.
  const fs::path name = fs::path(path).filename();
  ZT_REQUIRE(!name.empty() && name != "." && name != "..",
             field << ": " << path << " ends in \"" << (name.empty() ? "/" : name.string())
                   << "\": it names a directory, not a file; give the path of a file (in that directory: add its name)");
  return write_target(path);
}

// `text` into the existing temporary file `tmp`; the error names `path`, the file it stands for.
void write_text(const std::string& tmp, const std::string& path, const std::string& text) {
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_TRUNC | O_CLOEXEC);
  ZT_REQUIRE(fd >= 0, "cannot write " << path << ": " << std::strerror(errno));
  int err = 0;
  for (size_t done = 0; done < text.size();) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      err = n < 0 ? errno : EIO;
      break;
    }
    done += size_t(n);
  }
  if (::close(fd) != 0 && err == 0) err = errno;
  ZT_REQUIRE(err == 0, "cannot write " << path << ": " << std::strerror(err));
}

void remove_quietly(const std::string& path) {
  std::error_code ec;
  fs::remove(path, ec);
}

}  // namespace

std::string check_output_path(const std::string& field, const std::string& path, uint64_t bytes) {
  ZT_REQUIRE(!path.empty(), field << ": empty path");
  const std::string target = check_kind(field, path);
  const fs::path dir = existing_dir(field, path, target);
  probe_dir(field, path, dir);
  check_room(field, path, dir, bytes);
  return target;
}

std::string input_file_problem(const std::string& path) {
  struct stat ls, st;
  if (::lstat(path.c_str(), &ls) != 0) {
    if (errno == ENOENT || errno == ENOTDIR) return "";
    return std::string("cannot be read: ") + std::strerror(errno);
  }
  if (::stat(path.c_str(), &st) != 0) {
    const int err = errno;
    std::error_code ec;
    const fs::path to = fs::read_symlink(path, ec);
    return "is a symlink to " + (ec ? std::string("a path") : to.string()) + ", which " +
           (err == ENOENT ? std::string("does not exist") : std::string("cannot be reached: ") + std::strerror(err));
  }
  if (S_ISDIR(st.st_mode)) return "is a directory, not a regular file";
  if (!S_ISREG(st.st_mode)) return std::string("is ") + kind_of(st.st_mode) + ", not a regular file";
  return "";
}

void check_input_file(const std::string& what, const std::string& path) {
  const std::string problem = input_file_problem(path);
  ZT_REQUIRE(problem.empty(), what << " " << path << " " << problem);
}

void OutputPaths::input(const std::string& label, const std::string& path) {
  struct stat st;
  if (path.empty() || ::stat(path.c_str(), &st) != 0) return;
  inputs_.push_back({label, path, uint64_t(st.st_dev), uint64_t(st.st_ino), S_ISDIR(st.st_mode)});
}

std::string OutputPaths::output(const std::string& field, const std::string& path, uint64_t bytes) {
  ZT_REQUIRE(!path.empty(), field << ": empty path");
  const std::string target = check_kind(field, path);
  const fs::path dir = existing_dir(field, path, target);
  const std::string dir_key = fs::weakly_canonical(dir).string();
  if (std::find(probed_.begin(), probed_.end(), dir_key) == probed_.end()) {
    probe_dir(field, path, dir);
    probed_.push_back(dir_key);
  }
  check_room(field, path, dir, bytes);

  // The file itself (when it exists), then each directory above it, against the inputs.
  std::error_code ec;
  const fs::path canon = fs::weakly_canonical(target, ec);
  ZT_REQUIRE(!ec, field << ": cannot resolve " << path << ": " << ec.message());
  struct stat self;
  const bool exists = ::stat(canon.c_str(), &self) == 0;
  const std::string key =
      exists ? std::to_string(self.st_dev) + ":" + std::to_string(self.st_ino) : canon.string();
  for (fs::path a = canon;; a = a.parent_path()) {
    struct stat st;
    if (::stat(a.c_str(), &st) == 0) {
      const bool is_self = exists && a == canon;
      for (const Input& in : inputs_) {
        if (in.dev != uint64_t(st.st_dev) || in.ino != uint64_t(st.st_ino) || (!is_self && !in.dir)) continue;
        ZT_REQUIRE(false, field << ": " << path << " is " << (is_self ? "" : "inside ") << "one of this command's inputs ("
                                << in.label << ": " << in.path << "); write it elsewhere");
      }
    }
    if (a == a.root_path() || a.empty() || !a.has_relative_path()) break;
  }
  const auto [it, fresh] = outputs_.emplace(key, field);
  ZT_REQUIRE(fresh, field << ": " << path << " is also where " << it->second << " goes; give each output its own path");
  return target;
}

void write_by_rename(const std::string& field, const std::string& path,
                     const std::function<void(const std::string& tmp)>& write) {
  write_by_rename(std::vector<FileToWrite>{{field, path, write, ""}});
}

void write_by_rename(const std::vector<FileToWrite>& files) {
  std::vector<std::string> tmps;
  auto drop_all_but = [&](size_t keep) {
    for (size_t i = 0; i < tmps.size(); ++i)
      if (i != keep) remove_quietly(tmps[i]);
  };
  // Said when a failure leaves every destination as it was, and there is more than one.
  auto none_replaced = [&] {
    if (files.size() < 2) return std::string();
    std::string s = "; none of ";
    for (size_t i = 0; i < files.size(); ++i) s += (i ? ", " : "") + files[i].path;
    return s + " was replaced";
  };
  for (const FileToWrite& f : files) {
    std::string tmp = f.path + ".tmp.XXXXXX";
    const int fd = ::mkstemp(tmp.data());
    if (fd < 0) {
      const int err = errno;
      drop_all_but(tmps.size());
      ZT_REQUIRE(false, f.field << ": cannot create a temporary file beside " << f.path << ": " << std::strerror(err)
                                << none_replaced());
    }
    tmps.push_back(tmp);
    // mkstemp creates 0600; the result gets the mode any new file of ours gets.
    const mode_t mask = ::umask(0);
    ::umask(mask);
    (void)::fchmod(fd, 0666 & ~mask);
    ::close(fd);
    try {
      if (f.write)
        f.write(tmp);
      else
        write_text(tmp, f.path, f.text);
    } catch (const std::exception& e) {
      drop_all_but(tmps.size());
      throw Error(f.field + ": " + e.what() + none_replaced());
    }
  }
  // A destination may have changed during a long run: the finished result is kept rather than
  // renamed over something that is no longer a regular file of ours to replace.
  for (size_t i = 0; i < files.size(); ++i) {
    std::string problem = kind_problem(files[i].path);
    struct stat ls;
    if (problem.empty() && ::lstat(files[i].path.c_str(), &ls) == 0 && S_ISLNK(ls.st_mode)) problem = "became a symlink";
    if (problem.empty()) continue;
    drop_all_but(i);
    ZT_REQUIRE(false, files[i].field << ": " << files[i].path << " changed during the run (it " << problem
                                     << "); the result is kept in " << tmps[i] << none_replaced());
  }
  for (size_t i = 0; i < files.size(); ++i) {
    std::error_code ec;
    fs::rename(tmps[i], files[i].path, ec);
    if (!ec) continue;
    for (size_t k = i; k < tmps.size(); ++k) remove_quietly(tmps[k]);
    std::string replaced;
    for (size_t k = 0; k < i; ++k) replaced += (k ? ", " : "") + files[k].path;
    ZT_REQUIRE(false, files[i].field << ": cannot rename " << tmps[i] << " to " << files[i].path << ": " << ec.message()
                                     << (replaced.empty() ? "" : " (already replaced: " + replaced + ")"));
  }
}

}  // namespace zt
