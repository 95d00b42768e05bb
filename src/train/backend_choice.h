// Which backend runs a plan, and what to try when a plan does not fit: the decisions made before a
// Trainer exists (backend_choice.cpp; docs/design.md §3.8; runtime/support.h is the one table of
// what each backend supports).
#pragma once
#include <string>

#include "plan/plan.h"

namespace zt {

// The backend train() will use for this plan on `world` ranks: "cpu-fp32", "cuda-fp32" or
// "cuda-bf16". Throws (one clear line) when this build or machine cannot run it, so the caller
// can check before writing anything.
std::string choose_backend(const Plan& plan, int world);
// The same choice and checks for planning (train estimate): device "cuda" needs no GPU here, so that
// a GPU run can be sized on a machine without one (device "auto" still means a GPU only if one is here).
std::string planned_backend(const Plan& plan, int world);

// The next rung of the memory ladder (docs/plans.md) for a run that did not fit: what to change in
// the plan, using only options this build runs.
std::string next_memory_step(const Plan& plan, int world);

}  // namespace zt
