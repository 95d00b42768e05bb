// Rate assembly (docs/autoplan.md, "Calibration"): the rates one candidate's prediction multiplies
// by, picked from what the probes measured for its micro-batch, policy, embedding split and bucket
// size, with parameter offload's passes backed out of its engine run (cost_model.h), then its
// prediction.
#pragma once
#include <string>

#include "autoplan/candidates.h"
#include "autoplan/probes.h"

namespace zt::autoplan {

// Fills c->rates and c->pred. `cache`: named when a prediction comes out as nonsense.
void price(Candidate* c, Measurements& m, const std::string& cache);

}  // namespace zt::autoplan
