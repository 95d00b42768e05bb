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

// The backend train() will use for this plan on `world` ranks: "cpu-fp32", "cuda-fp32" or
// "cuda-bf16". Throws (one clear line) when this build or machine cannot run it, so the caller
// can check before writing anything.
std::string choose_backend(const Plan& plan, int world);

// The next rung of the memory ladder for a run that did not fit on the device (appended to the
// out-of-memory message): what to change in the plan, using only options this build runs.
std::string next_memory_step(const Plan& plan, int world);

}  // namespace zt
