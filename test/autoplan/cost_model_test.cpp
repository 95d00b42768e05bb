// The planner's cost model (docs/autoplan.md, "The cost model" and "Calibration"): the parameter
// offload term against arithmetic done by hand, and the engine run's transfers backed out by the
// inverse of that term's overlap.
#include <gtest/gtest.h>

#include <algorithm>

#include "autoplan/cost_model.h"

namespace zt::autoplan {
namespace {

// Every micro-step's compute is fixed_s (no blocks, no gradient path), so compute_s / grad_accum
// is known exactly.
Prediction predict_passes(double first, double next, double flush, double share, int grad_accum, double fixed) {
  StepShape s;
  s.grad_accum = grad_accum;
  Rates r;
  r.fixed_s = fixed;
  r.pass_first_s = first, r.pass_next_s = next, r.pass_flush_s = flush;
  r.pass_exposed = share;
  r.adamw_s_per_param = 0;
  return predict(s, r);
}

TEST(CostModel, PassIoExposesEachMicroStepAndTheFlushOnce) {
  // 3 micro-steps of 0.1 s compute; half of the overlap hidden.
  // first: 0.2 - 0.5 * min(0.1, 0.2) = 0.15; each later: 0.05 - 0.5 * min(0.1, 0.05) = 0.025.
  const Prediction p = predict_passes(0.2, 0.05, 0.07, 0.5, 3, 0.1);
  EXPECT_DOUBLE_EQ(p.compute_s, 0.3);
  EXPECT_NEAR(p.pass_io_s, 0.15 + 2 * 0.025 + 0.07, 1e-15);
  EXPECT_NEAR(p.step_s, 0.3 + 0.27, 1e-15);
  EXPECT_EQ(p.bound, "compute");
  // Without parameter offload every pass rate is 0, and so is the term.
  EXPECT_EQ(predict_passes(0, 0, 0, 0.5, 3, 0.1).pass_io_s, 0);
}

TEST(CostModel, TransfersBehindInvertsTheOverlapTerm) {
  int checked = 0;
  for (double share : {0.0, 0.3, 0.88, 1.0})
    for (double compute : {0.03, 0.2})
      for (double io : {0.01, 0.05, 0.2, 0.5}) {
        const double exposed = io - (1 - share) * std::min(compute, io);
        if (exposed <= 0) {  // all hidden (share 0, io within compute): nothing to back out
          EXPECT_EQ(transfers_behind(exposed, compute, share), 0);
          continue;
        }
        EXPECT_NEAR(transfers_behind(exposed, compute, share), io, 1e-12)
            << "share " << share << " compute " << compute << " io " << io;
        ++checked;
      }
  EXPECT_EQ(checked, 28);  // of 32: at share 0, io 0.01 within 0.03 s and 0.01, 0.05, 0.2 within 0.2 s are all hidden
}

}  // namespace
}  // namespace zt::autoplan
