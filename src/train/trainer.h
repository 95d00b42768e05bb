// The training loop: plan -> model, data, optimizer -> steps with logging, evaluation, samples.
#pragma once
#include <string>

#include "plan/plan.h"

namespace zt {

struct TrainResult {
  int steps = 0;
  double final_loss = 0.0;
  double final_val_loss = -1.0;  // < 0: no evaluation ran
};

// Runs the plan to completion. Throws zt::Error on failure (bad data, NaN loss, ...).
TrainResult train(const Plan& plan);

}  // namespace zt
