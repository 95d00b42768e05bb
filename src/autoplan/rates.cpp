#include "autoplan/rates.h"

#include <algorithm>
#include <cmath>

#include "runtime/error.h"

namespace zt::autoplan {

void price(Candidate* c, Measurements& m, int world, const std::string& cache) {
  std::map<MicroKey, MicroStepCost>& micro = m.micro;
  std::map<std::pair<std::string, double>, LinkCost>& links = m.links;
  std::map<double, double>& overlap = m.overlap;
  const double adamw = m.adamw;
  Rates r = c->rates;
  const MicroStepCost& none = micro[{c->choice.micro_batch, "none", c->embedding_rows}];
  const MicroStepCost& own = micro[{c->choice.micro_batch, c->choice.policy, c->embedding_rows}];
  r.block_s = c->choice.policy == "selective" ? own.block_s : none.block_s;
  r.block_recomputed_s = own.block_s;
  r.fixed_s = own.fixed_s;
  r.adamw_s_per_param = adamw;
  if (world > 1) {
    const LinkCost red = links[{c->shape.stage == 0 ? "all_reduce" : "reduce_scatter", c->choice.bucket_mb}];
    const LinkCost gat = links[{"all_gather", c->choice.bucket_mb}];
    r.reduce_alpha_s = red.alpha_s, r.reduce_bytes_per_s = red.bytes_per_s;
    r.gather_alpha_s = gat.alpha_s, r.gather_bytes_per_s = gat.bytes_per_s;
    r.overlap_exposed = overlap[c->choice.bucket_mb];
  }
  r.memory_bytes_per_s = 28 / adamw;  // AdamW reads p, g, m, v and writes p, m, v: 28 bytes a parameter
  if (c->engine_first_micro_s > 0) {
    // Parameter offload: its passes backed out of the engine run's micro-steps (cost_model.h).
    const MicroStepCost& one = micro[{1, "none", c->embedding_rows}];
    const EngineBase b = back_out_passes(c->shape, one.block_s, one.fixed_s, c->engine_first_micro_s,
                                         c->engine_next_micro_s, c->engine_flush_s, r);
    c->engine_base_micro_s = b.micro_s, c->engine_base_compute_s = b.compute_s, c->engine_base_tail_s = b.tail_s;
  }
  c->rates = r;
  c->pred = predict(c->shape, r);
  // The cache's values are checked on load; this is the backstop for one that passed and still
  // predicts nonsense (a rate far off its kind's range).
  ZT_REQUIRE(std::isfinite(c->pred.step_s) && c->pred.step_s > 0,
             "plan: " << c->choice.label() << " is predicted at " << c->pred.step_s << " s a step from the rates in "
                      << cache << " (report: the rates): remove that file to measure again");
}

}  // namespace zt::autoplan
