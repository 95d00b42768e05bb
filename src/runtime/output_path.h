// Every file the program writes is checked here before any work starts, and replaced only by a
// rename of a temporary file of ours (docs/design.md §3.8; DESIGN principle 12: nothing written
// destroys what the run did not create). The rules, one place for every command and layer:
//
//   - a new path, or an existing regular file (replaced); a symlink is written through to its
//     regular-file target (the link stays a link); devices, FIFOs, sockets, directories and
//     dangling symlinks are refused, and so is a path that names a directory by its spelling
//     (`dir/`, `dir/.`): its file would be a hidden temporary one inside;
//   - never one of the command's inputs, nor inside an input directory (same st_dev/st_ino, or the
//     same canonical parent and name for a path that does not exist yet), nor another output of
//     the same command;
//   - the directory that will hold it (or its nearest existing ancestor: missing ones are created
//     at start) accepts a new file, found by creating and removing a probe file (permission bits
//     do not say, for root or a read-only mount), and, when the size is known, has room for it.
//
// Every input file is checked by check_input_file before it is opened (a FIFO would block the open
// until a writer came, a device would read forever), and every command registers all it reads
// through one function (train/inputs.h) so that no output can be one of them.
//
// The Python scripts apply the same rules (scripts/zt_paths.py).
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <unordered_map>
#include <vector>

namespace zt {

// Why `path` cannot be read as an input file, in words that follow the path ("is a FIFO, not a
// regular file", "is a symlink to X, which does not exist"); "" when it can: a regular file,
// directly or through symlinks, or a path that does not exist at all (the open that follows says
// so with its own hint).
std::string input_file_problem(const std::string& path);
// Throws zt::Error "<what> <path> <problem>" (what: "model.init:", "data file", ...) unless
// input_file_problem is "".
void check_input_file(const std::string& what, const std::string& path);

// One output on its own (no inputs to compare with). Returns the path to write: the target of an
// existing symlink, else `path`. Throws zt::Error beginning with `field` and saying what to do.
std::string check_output_path(const std::string& field, const std::string& path, uint64_t bytes = 0);

// The inputs and outputs of one command, checked together.
class OutputPaths {
 public:
  // A file the command reads, or a directory all of whose contents it reads. `label` names it in
  // messages ("data.train", "the checkpoint being exported"). A path that does not exist is skipped.
  void input(const std::string& label, const std::string& path);
  // check_output_path, then: not an input, not inside an input directory, not an earlier output.
  std::string output(const std::string& field, const std::string& path, uint64_t bytes = 0);

 private:
  struct Input {
    std::string label, path;
    uint64_t dev, ino;
    bool dir;
  };
  std::vector<Input> inputs_;
  std::unordered_map<std::string, std::string> outputs_;  // "dev:ino" of an existing file, else its canonical path -> field
  std::vector<std::string> probed_;  // directories already found to accept new files
};

// Writes `path` (as returned by a check above) by way of a temporary file of ours beside it
// (`path.tmp.XXXXXX`, created exclusively: it never replaces anything) and a rename, so `path` is
// never half-written. Just before the rename `path` is checked again (it may have changed during a
// long run). The temporary file is removed on every failure; the error begins with `field`.
// `write` fills the (existing, empty) file it is given, creating or truncating it by name.
void write_by_rename(const std::string& field, const std::string& path,
                     const std::function<void(const std::string& tmp)>& write);

// One file of a set that belongs together (a plan and its report).
struct FileToWrite {
  std::string field, path;                            // as for write_by_rename
  std::function<void(const std::string& tmp)> write;  // fills the temporary file; when empty, `text` is written
  std::string text;
};
// write_by_rename for several files at once: every temporary file is written and every destination
// checked again before the first rename, so a failure while writing (a full disk) replaces none of
// them. The renames follow the order given (put the file that the others describe last).
void write_by_rename(const std::vector<FileToWrite>& files);

}  // namespace zt
