// Every rank must run the same plan with the same build: ranks that disagree on a bucket size, a
// stage or the comm thread's collectives would wait on collectives the others never start. Training
// and the planner check it before their first collective that could differ.
#pragma once
#include <string>

#include "plan/plan.h"

namespace zt {

class Comm;  // comm/comm.h

// Collective. plan.comm and plan.resolved["comm"] as the ranks run them (ZT_COMM_* applied: the
// environment can differ per rank where the plan files agree). Throws one line on every rank when
// they differ: the comm settings first, naming the environment as their likely cause; then a hash
// of the resolved plan, `version` and `also` (whatever else the ranks must agree on, e.g. the
// planner's options).
void check_same_plan_everywhere(const Plan& plan, const std::string& version, Comm& comm, const std::string& also = "");

}  // namespace zt
