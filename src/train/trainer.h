// The training loop: plan -> model, data, ZeRO engine -> steps with logging, evaluation, samples.
#pragma once
#include <string>
#include <vector>

#include "comm/comm.h"
#include "plan/plan.h"

namespace zt {

struct TrainState;  // train/state.h

struct TrainResult {
  int steps = 0;  // the step after the last one run
  std::vector<double> losses;  // of the steps this call ran
  std::vector<double> step_ms;  // their wall times on this rank
  // Per step on this rank, from its start: to the end of its first micro-step's backward, of its last
  // one's, and to its gradients' being final (after finish_gradients): the engine's passes apart
  // from its optimizer step (the planner's engine runs, docs/autoplan.md).
  std::vector<double> first_micro_ms, backward_ms, gradients_ms;
  std::vector<double> update_ms;  // each step's update itself (ZeroEngine::last_update_s) on this rank
  double final_loss = 0.0;
  double final_val_loss = -1.0;  // < 0: no evaluation ran
  bool stopped = false;  // SIGTERM/SIGINT: a checkpoint was saved and the run ended early (exit 0)

  // Step `step` ran: its loss and times.
  void add_step(int step, double loss, double ms, double first_micro, double backward, double gradients,
                double update) {
    steps = step + 1;
    final_loss = loss;
    losses.push_back(loss);
    step_ms.push_back(ms);
    first_micro_ms.push_back(first_micro);
    backward_ms.push_back(backward);
    gradients_ms.push_back(gradients);
    update_ms.push_back(update);
  }
};

// Where a call starts and stops (docs/design.md §3.9). By default: from the plan's init at step 0
// to run.steps. With `start`, the model state and step come from a captured TrainState (same plan
// and world); with `stop_at`, the loop ends before that step (no final evaluation, sample or
// weights); with `end`, the state after the last step is captured there.
struct RunControl {
  const TrainState* start = nullptr;
  int stop_at = -1;
  TrainState* end = nullptr;
};

// Runs the plan on this rank of `comm`. Throws zt::Error on failure (bad data, NaN loss, a
// collective that timed out, ...).
TrainResult train(const Plan& plan, Comm& comm, const RunControl& ctl = {});

}  // namespace zt
