#include "autoplan/rates.h"

#include <algorithm>
#include <cmath>

#include "runtime/error.h"

namespace zt::autoplan {

void price(Candidate* c, Measurements& m, const std::string& cache) {
  std::map<MicroKey, MicroStepCost>& micro = m.micro;
  std::map<LinkKey, LinkCost>& links = m.links;
  std::map<double, double>& overlap = m.overlap;
  const double adamw = m.adamw;
  Rates r = c->rates;
  const Choice& ch = c->choice;
  const MicroStepCost& none = micro[{ch.micro_batch, "none", c->embedding_rows, ch.tensor, ch.sequence_parallel}];
  const MicroStepCost& own = micro[{ch.micro_batch, ch.policy, c->embedding_rows, ch.tensor, ch.sequence_parallel}];
  r.block_s = c->choice.policy == "selective" ? own.block_s : none.block_s;
  r.block_recomputed_s = own.block_s;
  r.fixed_s = own.fixed_s;
  r.adamw_s_per_param = adamw;
  if (ch.data > 1) {
    const std::string group = data_group_name(ch);
    const LinkCost red = links[{c->shape.stage == 0 ? "all_reduce" : "reduce_scatter", ch.bucket_mb, group}];
    const LinkCost gat = links[{"all_gather", ch.bucket_mb, group}];
    r.reduce_alpha_s = red.alpha_s, r.reduce_bytes_per_s = red.bytes_per_s;
    r.gather_alpha_s = gat.alpha_s, r.gather_bytes_per_s = gat.bytes_per_s;
    r.overlap_exposed = overlap[c->choice.bucket_mb];
  }
  if (ch.shard_group != "world") {
    const LinkKey k{"all_reduce", ch.bucket_mb, replica_group_name(ch)};
    r.replica_alpha_s = links[k].alpha_s, r.replica_bytes_per_s = links[k].bytes_per_s;
  }
  if (ch.tensor > 1) {
    const double act_mb = tensor_link_mb(*c);
    const LinkCost t = links[{"all_reduce", act_mb, tensor_group_name(ch)}];
    r.tensor_alpha_s = t.alpha_s, r.tensor_bytes_per_s = t.bytes_per_s;
  }
  if (ch.pipeline > 1) {
    const LinkCost p = m.stage_links[{ch.pipeline, stage_link_bytes(*c)}];
    r.p2p_alpha_s = p.alpha_s, r.p2p_bytes_per_s = p.bytes_per_s;
    if (m.idle_shares.count({ch.pipeline, ch.micro_batch})) r.idle_share = m.idle_shares[{ch.pipeline, ch.micro_batch}];
  }
  r.memory_bytes_per_s = 28 / adamw;  // AdamW reads p, g, m, v and writes p, m, v: 28 bytes a parameter
  if (c->engine_first_micro_s > 0) {
    // Parameter offload: its passes backed out of the engine run's micro-steps (cost_model.h).
    const MicroStepCost& one = micro[{1, "none", c->embedding_rows, 1, false}];
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
