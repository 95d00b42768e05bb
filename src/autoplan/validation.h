// --validate (docs/autoplan.md, "--validate"): the top candidates trained for a few steps, in
// rounds of alternating order, each one's fastest run beside its prediction.
#pragma once
#include <string>
#include <vector>

#include "autoplan/candidates.h"
#include "autoplan/plan_inputs.h"
#include "comm/comm.h"

namespace zt::autoplan {

// Collective. Fills each run candidate's measured times; rank 0 prints the rounds and the table.
// Returns whether any candidate ran (req.validate 0: none).
bool validate(const PlanRequest& req, const PlanInputs& in, std::vector<Candidate*>& fit, Comm& comm,
              const std::string& out_dir);

}  // namespace zt::autoplan
