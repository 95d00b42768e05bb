// The candidates that fit ranked by predicted step time, shown (the table, why the first won) and
// written: the chosen plan and its report (docs/autoplan.md, "The report").
#pragma once
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "autoplan/calibrate.h"
#include "autoplan/candidates.h"
#include "autoplan/plan_inputs.h"
#include "autoplan/probes.h"

namespace zt::autoplan {

// "1.5 MiB" (one decimal under 10 MiB); milliseconds of `s` (one decimal under 0.1 s).
std::string mib(double bytes);
std::string ms(double s);

// The chosen plan and its report: both written, or neither replaced (runtime/output_path.h); the
// plan renamed last, so a plan on disk never goes without its report.
void write_plan_and_report(const std::string& out, const nlohmann::json& plan, const std::string& report,
                           const nlohmann::json& rep);

// One row per candidate: its choice, memory, predicted parts and step time (with `measured`, its
// measured time and the prediction's error).
void print_table(const std::vector<const Candidate*>& rows, bool measured);

// Fastest predicted first; of equal predictions, the one with less host memory.
void rank(std::vector<Candidate*>& fit);

// Rank 0: the ranked table (--show rows) and why the first won.
void print_ranking(const PlanRequest& req, const PlanInputs& in, const std::vector<Candidate*>& fit, bool root);

// Rank 0: the first of `fit` as the plan and the report: every candidate that fits with its
// shape, rates and prediction (and measured times once --validate ran), the calibrated rates and
// the probes used.
void write_outputs(const PlanRequest& req, const PlanInputs& in, const std::vector<Candidate>& all,
                   const std::vector<Candidate*>& fit, const std::map<std::string, long>& dropped,
                   const Measurements& measured, const Calibration& cal, int threads, bool root);

}  // namespace zt::autoplan
