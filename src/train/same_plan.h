// Every rank must run the same plan with the same build: ranks that disagree on a bucket size, a
// stage or the comm thread's collectives would wait on collectives the others never start. Training
// and the planner check it before their first collective that could differ.
#pragma once
#include <cstdint>
#include <string>

#include "plan/plan.h"

namespace zt {

class Comm;  // comm/comm.h

// A rank that failed before its communicator existed (a bad plan) still joins the others' first
// collective here, with this bit set and its message's hash in the rest (train.cu's main), so that
// every rank ends together and the failure is said once. Comm settings never set it.
constexpr uint64_t kFailedBeforeComm = uint64_t(1) << 63;

// Collective. plan.comm and plan.resolved["comm"] as the ranks run them (ZT_COMM_* applied: the
// environment can differ per rank where the plan files agree). Throws an AgreedError on every rank
// (said once, by rank 0) when they differ: the comm settings first, naming the environment as their
// likely cause; then a hash of the resolved plan, `version` and `also` (whatever else the ranks must
// agree on, e.g. the planner's options); and when comm.fault_skip_rank names no rank of this world.
// Where a rank failed before its communicator existed, the others throw quietly (it says why).
void check_same_plan_everywhere(const Plan& plan, const std::string& version, Comm& comm, const std::string& also = "");

}  // namespace zt
