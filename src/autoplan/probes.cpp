#include "autoplan/probes.h"

#include <chrono>
#include <cstdio>
#include <set>
#include <sstream>

#include "autoplan/engine_runs.h"
#include "model/config.h"
#include "model/recompute.h"
#include "runtime/error.h"

namespace zt::autoplan {

std::string comm_key(const Plan& base) {
  std::ostringstream comm_key;
  comm_key << "comm " << base.comm.collectives << " thread" << int(base.comm.thread) << " inflight" << base.comm.inflight
           << " poll_us" << base.comm.poll_us;
  return comm_key.str();
}

Measurements measure_candidates(const PlanInputs& in, std::vector<Candidate*>& fit, Calibration& cal, Comm& comm,
                                const std::string& out_dir, int threads) {
  const int world = in.world;
  const bool root = comm.rank() == 0, direct = in.direct;
  const Plan& base = in.base;
  const std::string& cache = in.cache;
  const GPTConfig cfg = GPTConfig::make(base.model.n_layer, base.model.n_head, base.model.n_embd, base.model.seq_len,
                                        base.model.vocab_size);
  const int T = base.model.seq_len, chunk = base.recompute.classifier_chunk;
  Measurements m;
  std::map<MicroKey, MicroStepCost>& micro = m.micro;
  auto policy_of = [](const std::string& name) {
    return name == "block" ? Recompute::Policy::block : name == "selective" ? Recompute::Policy::selective : Recompute::Policy::none;
  };
  std::set<MicroKey> needed;
  for (Candidate* c : fit) {
    needed.insert({c->choice.micro_batch, "none", c->embedding_rows});
    needed.insert({c->choice.micro_batch, c->choice.policy, c->embedding_rows});
    if (c->choice.params_offloaded) needed.insert({1, "none", c->embedding_rows});  // the engine run's micro-steps
  }
  if (root) std::printf("calibrating (%d thread(s) per rank; cache %s)...\n", threads, cache.c_str());
  const auto t_cal = std::chrono::steady_clock::now();
  std::fflush(stdout);
  std::map<std::pair<std::string, int>, std::set<int>> batches;  // (policy, embedding rows) -> micro-batches
  for (const auto& [b, pol, rows] : needed) batches[{pol, rows}].insert(b);
  for (const auto& [what, bs] : batches)
    for (const auto& [b, cost] : cal.micro_steps(cfg, bs, T, policy_of(what.first), chunk, what.second))
      micro[{b, what.first, what.second}] = cost;
  m.adamw = cal.adamw_s_per_param();
  std::map<std::pair<std::string, double>, LinkCost>& links = m.links;
  std::map<double, double>& overlap = m.overlap;
  bool any_nvme = false;
  for (Candidate* c : fit) {
    any_nvme |= c->choice.optimizer_offloaded;
    if (world == 1) continue;
    const size_t bytes = size_t(c->choice.bucket_mb * double(1 << 20));
    for (const char* op : {"all_reduce", "reduce_scatter", "all_gather"})
      if (!links.count({op, c->choice.bucket_mb})) links[{op, c->choice.bucket_mb}] = cal.link(op, bytes);
    if (!overlap.count(c->choice.bucket_mb)) overlap[c->choice.bucket_mb] = cal.overlap_exposed_share(cfg, T, bytes);
  }
  // Offload, measured as it runs (docs/autoplan.md, "Calibration"): the optimizer step and
  // parameter offload's passes from short runs of the engine itself where the data is there to
  // train on, else from the optimizer pipeline and pass probes; the passes' overlap with compute
  // from the pass probe. The engine runs come first: on this machine a run measured right after
  // the disk probe moved the optimizer's bytes at half the rate it did otherwise (and the rate
  // training reaches), which waiting 5 s did not change. The disk alone, last, is only reported.
  bool have_data = true;
  try {
    (void)plan_from_json(base.resolved, /*check_files=*/true);
  } catch (const Error&) {
    have_data = false;
  }
  for (Candidate* c : fit) {
    if (!c->choice.optimizer_offloaded) continue;
    if (have_data) {
      const EngineRates e = engine_rates(*c, cal, comm, out_dir);
      c->rates.pipeline_s_per_byte = e.optimizer_s_per_byte;
      c->engine_first_micro_s = e.first_micro_s, c->engine_next_micro_s = e.next_micro_s, c->engine_flush_s = e.flush_s;
    } else {
      c->rates.pipeline_s_per_byte = cal.optimizer_pipeline_s_per_byte(c->swap, size_t(c->shape.shard_params));
    }
  }
  for (Candidate* c : fit) {
    if (!c->choice.params_offloaded) continue;
    const PassCost pass = cal.pass_io(c->swap, c->unit_shards, c->embedding_units, c->regather, /*transfers=*/!have_data);
    if (!have_data) c->rates.pass_first_s = pass.first_s, c->rates.pass_next_s = pass.next_s;
    c->rates.pass_exposed = pass.exposed;
  }
  if (root && !have_data && any_nvme)
    std::printf("calibration: no training data (%s), so offload's rates are the optimizer pipeline and pass probes', "
                "which predict them slower than the engine runs them\n", base.data.train.c_str());
  m.disk = any_nvme ? cal.disk_bytes_per_s(base.offload.nvme_dir, direct) : 0;
  const double disk = m.disk;
  cal.save();
  if (any_nvme) settle_disk(base.offload.nvme_dir);  // the probes' files: flushed and trimmed before anything else runs
  if (root)
    std::printf("calibration: %d probe(s) measured in %.1f s, the rest from the cache\n", cal.measured(),
                std::chrono::duration<double>(std::chrono::steady_clock::now() - t_cal).count());
  // What the offloaded optimizer step reaches against the disk alone (docs/offload.md: offload at
  // the disk's speed).
  for (const Candidate* c : fit)
    if (root && c->rates.pipeline_s_per_byte > 0) {
      const double pipe = 1 / c->rates.pipeline_s_per_byte;
      std::printf("offload: the optimizer step moves %.2f GB/s (reads and writes together), the disk "
                  "alone %.2f GB/s mixed: %.0f%%\n", pipe / 1e9, disk / 1e9, 100 * pipe / disk);
      break;
    }
  return m;
}

}  // namespace zt::autoplan
