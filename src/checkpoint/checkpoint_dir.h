// checkpoint.dir at start-up (docs/design.md §3.7): which checkpoint a run continues, whether the
// directory's checkpoints are this run's, and a lock that keeps a second run out while this one
// runs. A run's checkpoints are those of its lineage (Meta::run_id): drawn when a run starts fresh,
// inherited by a run that resumes. A run writes, replaces and prunes only its own lineage's steps,
// so a directory holding another run's checkpoints is refused, whatever checkpoint.resume says.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "comm/comm.h"
#include "plan/plan.h"

namespace zt::ckpt {

// An flock on DIR/.lock, held from start-up to the end of the run (rank 0). The file records the
// holder's pid and host for the refusal a second run gets. On release the lock file goes, and so
// do the directories the lock created, when nothing else was put in them.
class DirLock {
 public:
  DirLock() = default;
  // Creates `dir` (and missing parents) and locks it; refuses "checkpoint.dir: DIR is in use by pid
  // N on host H" when another process holds it.
  explicit DirLock(const std::string& dir);
  ~DirLock() { release(); }
  DirLock(DirLock&& o) noexcept { *this = std::move(o); }
  DirLock& operator=(DirLock&& o) noexcept;
  DirLock(const DirLock&) = delete;
  DirLock& operator=(const DirLock&) = delete;
  // "pid N on host H" when the lock file was already there, written by a run that ended without
  // releasing it (killed: the flock went with the process, the file stayed); else "".
  const std::string& left_by() const { return left_by_; }

 private:
  void lock(const std::string& dir);
  void release();
  int fd_ = -1;
  std::string path_;
  std::vector<std::string> created_;  // deepest first
  std::string left_by_;
};

// Rank 0's start-up decision on checkpoint.dir and checkpoint.resume.
struct CheckpointStart {
  DirLock lock;             // none without checkpoint.dir
  std::string resume_from;  // the step directory this run continues; "" = a fresh start
  uint64_t run_id = 0;      // the lineage: the resumed checkpoint's, or new
  std::string note;         // "" or lines to print: what was cleaned, why resume "auto" took the step it took
};

// Rank 0, before anything but the lock is written: locks checkpoint.dir, resolves
// checkpoint.resume and refuses a directory with checkpoints of another lineage (for resume
// "none": any checkpoints). Resume "auto" with a `latest` that is missing or names no step takes the
// newest step directory that verifies as a load would (every rank file, every checksum), saying
// so in `note`, and refuses when none does: a run never restarts over checkpoints it did not see.
// Once the directory is known to be this run's, what a killed run left there (.tmp_step_N of a save
// it did not finish, .latest.tmp, its lock file) is removed, in one line of `note`: holding the lock
// proves no live run writes them.
CheckpointStart open_checkpoint_dir(const CheckpointSection& c);

// Every rank (collective): rank 0's step directory to resume from and lineage. `start` is read on
// rank 0 only.
struct Continuation {
  std::string resume_from;
  uint64_t run_id = 0;
};
Continuation share_start(Comm& comm, const CheckpointSection& c, const CheckpointStart& start);

// The plan fields that shape training (data, optimizer, run.steps) whose value differs from the
// plan recorded in a checkpoint (`saved`, JSON; "" when it has none): "optim.lr 0.003 -> 0.001".
std::vector<std::string> changed_plan_fields(const std::string& saved, const Plan& plan);

}  // namespace zt::ckpt
