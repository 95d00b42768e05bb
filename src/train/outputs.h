// The files a run writes (rank 0): the metrics log, the resolved plan beside it, the final
// weights. Checked before anything is allocated, written only once every check has passed, so a
// refused plan writes nothing and a run that starts never silently destroys an earlier one.
#pragma once
#include <cstdint>
#include <functional>
#include <string>

#include "plan/plan.h"

namespace zt {

struct RunOutputs {
  std::string log;            // run.log
  std::string plan_json;      // plan.json beside it
  std::string final_weights;  // "" = none; else where to write (an existing symlink resolved to its target)
};

// Refuses (zt::Error naming the plan field) an output path that is a directory or not a regular
// file, whose directory cannot be created or written (probed with a file that is removed at once),
// or, for the final weights (`final_weights_bytes`), a disk without room for them. Writes nothing.
RunOutputs check_run_outputs(const Plan& plan, uint64_t final_weights_bytes);

// Creates the directories, moves an earlier run's metrics log and plan.json aside to the first
// free `.N` suffix (the same N for both), and writes plan.json. Returns the line to print about
// the move, or "" when there was nothing to move.
std::string open_run_outputs(const Plan& plan, const RunOutputs& out);

// Writes `path` by way of `path.tmp` and a rename, so `path` is never half-written; the temporary
// file is removed on every failure, and the error names `field`. `write` creates and fills the
// file it is given.
void write_by_rename(const std::string& field, const std::string& path,
                     const std::function<void(const std::string& tmp)>& write);

}  // namespace zt
