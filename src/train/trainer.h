// The training loop: plan -> model, data, ZeRO engine -> steps with logging, evaluation, samples.
#pragma once
#include <string>

#include "comm/comm.h"
#include "plan/plan.h"

namespace zt {

struct TrainResult {
  int steps = 0;
  double final_loss = 0.0;
  double final_val_loss = -1.0;  // < 0: no evaluation ran
};

// Runs the plan to completion on this rank of `comm`. Throws zt::Error on failure (bad data, NaN
// loss, a collective that timed out, ...).
TrainResult train(const Plan& plan, Comm& comm);

}  // namespace zt
