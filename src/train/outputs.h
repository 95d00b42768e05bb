// The files a run writes: the metrics log, the resolved plan beside it, the final weights (rank 0)
// and a trace per rank (docs/running.md). Checked (runtime/output_path.h) before anything is allocated, written only
// once every check has passed, so a refused plan writes nothing and a run that starts never
// silently destroys an earlier one or one of its own inputs.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "checkpoint/checkpoint_dir.h"
#include "plan/plan.h"
#include "runtime/output_path.h"

namespace zt {

struct RunOutputs {
  std::string log;            // run.log
  std::string plan_json;      // plan.json beside it
  std::string final_weights;  // "" = none; else where to write (an existing symlink resolved to its target)
  std::string trace;          // "" = off; else this rank's trace file (Tracer::rank_path)
  ckpt::CheckpointStart checkpoint;  // checkpoint.dir locked for the run, checkpoint.resume resolved
};

// Rank 0: every output of the run (log, plan.json, final weights, the trace file of each of the
// `world` ranks, an earlier run's traces it moves aside) through one OutputPaths check against the
// run's inputs (register_plan_inputs, train/inputs.h) and each other; `final_weights_bytes` must fit
// on its disk. Writes nothing.
RunOutputs check_run_outputs(const Plan& plan, uint64_t final_weights_bytes, int world);
// The other ranks: their own trace file (their filesystem may not be rank 0's).
RunOutputs check_rank_outputs(const Plan& plan, int rank);

// Rank 0, before any rank opens its trace: creates the directories, moves an earlier run's metrics
// log, plan.json and trace files (every rank's, whatever the earlier world) aside to the first free
// `.N` suffix (the same N for all), and writes plan.json. Returns the line to print about the move,
// or "" when there was nothing to move.
std::string open_run_outputs(const Plan& plan, const RunOutputs& out);

}  // namespace zt
