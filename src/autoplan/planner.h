// `train plan` (docs/autoplan.md): from a base plan and a world size to the fastest plan that fits
// this machine. Enumerates the choices that keep the global batch, sizes each with the exact
// memory estimate (zero/estimate.h), predicts its step time with the cost model (cost_model.h) from
// rates measured here (calibrate.h), ranks them, writes the best as a plan file and, with
// --validate, runs the top candidates for a few steps beside their predictions.
#pragma once
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "comm/comm.h"

namespace zt::autoplan {

struct PlanRequest {
  std::string base;                    // the base plan file
  std::vector<std::string> overrides;  // --set, as train estimate takes them
  int world = 1;
  long global_batch = 0;               // sequences per optimizer step; 0 = the base plan's at `world`
  std::string out;                     // the chosen plan; its report goes beside it (report_path)
  std::string calibration;             // the cache file ("" = default_cache_path())
  int validate = 0;                    // candidates to run (-1 = every one that fits)
  int validate_steps = 4;              // steps per validation run; the first is not timed
  int validate_rounds = 2;             // runs per candidate, in alternating order; the fastest counts
  int show = 12;                       // rows of the ranked table
  std::string version;                 // the build's (part of the machine's calibration key)
  // The comm section the ranks run (ZT_COMM_* applied; train.cu's comm_options): what the link and
  // overlap probes measure, keyed by, and written into the chosen plan. Null: the base plan's.
  nlohmann::json comm;
};

// `out` with ".json" replaced by ".report.json" (appended when it does not end in .json).
std::string report_path(const std::string& out);

// Collective over `comm`, whose world must be req.world. Returns the exit code; throws zt::Error
// (one line) on bad input.
int plan_command(const PlanRequest& req, Comm& comm);

}  // namespace zt::autoplan
