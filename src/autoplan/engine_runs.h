// The planner's runs of the engine itself (docs/autoplan.md, "Calibration" and "--validate"): a
// candidate trained in this process for a few steps, writing nothing outside a directory beside
// --out that goes on every exit; the offload rates measured that way (the engine probe); and the
// step times --validate compares with the predictions.
#pragma once
#include <signal.h>

#include <string>

#include <nlohmann/json.hpp>

#include "autoplan/calibrate.h"
#include "autoplan/candidates.h"
#include "comm/comm.h"
#include "train/trainer.h"

namespace zt::autoplan {

// Installs a handler for the planner's lifetime that removes the run directory in progress
// (SIGINT, SIGTERM or SIGHUP during a probe or --validate run end the process; those runs save
// nothing, and an exception's RAII never runs there); the handlers before restored after.
class RunDirSignals {
 public:
  RunDirSignals();
  ~RunDirSignals();
  RunDirSignals(const RunDirSignals&) = delete;
  RunDirSignals& operator=(const RunDirSignals&) = delete;

 private:
  static constexpr int kSignals[3] = {SIGINT, SIGTERM, SIGHUP};
  struct sigaction old_[3];
};

// Seconds per step of `plan`, the median of `steps` after the first; and of its optimizer update
// (ZeroEngine::last_update_s), likewise.
struct Measured {
  double step_s, update_s;
};
Measured measure(const nlohmann::json& resolved, int steps, Comm& comm, const std::string& parent);

// Offload measured as the engine runs it: the candidate trained in this process for a few steps
// at micro-batch 1 and its own sequence length (its shards and swap files are the candidate's),
// so that its transfers have compute between them as in training: runs of 16-token micro-steps,
// their I/O back to back, measured the update 25-40% slower than the candidates ran it
// (scenario 2, 2026-11-27).
// - The optimizer step: seconds per byte it moves (Rates' pipeline_s_per_byte), from the time of
//   the update itself (ZeroEngine::last_update_s: the sub-group pipeline with the AdamW) over the
//   candidate's optimizer_io_bytes. Without parameter offload the run is at stage 3 where N > 1:
//   the same shard, and the stage's other costs are the links' to predict.
// - With parameter offload, its micro-steps, from a run of kEngineProbeMicroSteps: the
//   first is the time to the end of its backward; each later one, a third of the time from there
//   to the end of the last one's; the flush, from there to the gradients' being final (the
//   gradient writes still in flight, once a step). plan() backs the transfers out of them. From one
//   run: the difference of two runs carried both runs' noise, and runs here differ by up to 60%
//   (the disk's speed drifts over seconds) where the steps within one differ by a few percent.
// A run is made up to kEngineProbeRuns times while the runs so far took under kEngineProbeBudget_s,
// and the one of least step time kept. Cached like a probe, by the partition's shape.
struct EngineRates {
  double optimizer_s_per_byte = 0;
  double first_micro_s = 0, next_micro_s = 0, flush_s = 0;  // with parameter offload
};
EngineRates engine_rates(const Candidate& c, Calibration& cal, Comm& comm, const std::string& parent);

}  // namespace zt::autoplan
