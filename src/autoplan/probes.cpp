#include "autoplan/probes.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <set>
#include <tuple>
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

std::string data_group_name(const Choice& c) {
  if (c.shard_group != "world") return "shard S" + c.shard_group;
  return c.meshed() ? "data P" + std::to_string(c.pipeline) + "T" + std::to_string(c.tensor) : "";
}
std::string replica_group_name(const Choice& c) { return "replica S" + c.shard_group; }
std::string tensor_group_name(const Choice& c) {
  return "tensor P" + std::to_string(c.pipeline) + "T" + std::to_string(c.tensor);
}

double tensor_link_mb(const Candidate& c) {
  const nlohmann::json& model = c.resolved["model"];
  return double(size_t(c.choice.micro_batch) * model["seq_len"].get<size_t>() * model["n_embd"].get<size_t>() * 4) /
         double(1 << 20);
}

size_t stage_link_bytes(const Candidate& c) { return size_t(std::max(c.shape.p2p_bytes, c.shape.tie_bytes)); }

namespace {

// The mesh's groups as training forms them (train/engine_assembly.cpp): stages of consecutive
// ranks, in a stage tensor groups of adjacent ranks, the data axis across them.
struct MeshGroups {
  std::unique_ptr<Comm> data, tensor;
  std::unique_ptr<Comm> replica;  // hybrid sharding: one rank of each shard group
};
// Hybrid sharding's (the data axis the world): shard groups of S consecutive ranks, replicas across.
MeshGroups split_shards(Comm& comm, int S) {
  MeshGroups g;
  g.data = comm.split(comm.rank() / S, comm.rank(), "shard");
  g.replica = comm.split(comm.rank() % S, comm.rank(), "replicate");
  return g;
}
MeshGroups split_mesh(Comm& comm, int P, int T) {
  const int rank = comm.rank(), per_stage = comm.world() / P, stage = rank / per_stage, in_stage = rank % per_stage;
  MeshGroups g;
  g.data = comm.split(stage * T + in_stage % T, rank, "data");
  g.tensor = comm.split(stage * (per_stage / T) + in_stage / T, rank, "tensor");
  return g;
}

}  // namespace

Measurements measure_candidates(const PlanInputs& in, std::vector<Candidate*>& fit, Calibration& cal, Comm& comm,
                                const std::string& out_dir, int threads) {
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
    const int tp = c->choice.tensor;
    const bool sp = c->choice.sequence_parallel;
    needed.insert({c->choice.micro_batch, "none", c->embedding_rows, tp, sp});
    needed.insert({c->choice.micro_batch, c->choice.policy, c->embedding_rows, tp, sp});
    if (c->choice.params_offloaded) needed.insert({1, "none", c->embedding_rows, 1, false});  // the engine run's micro-steps
  }
  if (root) std::printf("calibrating (%d thread(s) per rank; cache %s)...\n", threads, cache.c_str());
  const auto t_cal = std::chrono::steady_clock::now();
  std::fflush(stdout);
  // (policy, embedding rows, tensor ranks, sp) -> micro-batches
  std::map<std::tuple<std::string, int, int, bool>, std::set<int>> batches;
  for (const auto& [b, pol, rows, tp, sp] : needed) batches[{pol, rows, tp, sp}].insert(b);
  for (const auto& [what, bs] : batches) {
    const auto& [pol, rows, tp, sp] = what;
    for (const auto& [b, cost] : cal.micro_steps(cfg, bs, T, policy_of(pol), chunk, rows, tp, sp))
      micro[{b, pol, rows, tp, sp}] = cost;
  }
  m.adamw = cal.adamw_s_per_param();
  std::map<LinkKey, LinkCost>& links = m.links;
  std::map<double, double>& overlap = m.overlap;
  bool any_nvme = false;
  // Each tensor group's link timings at every micro-batch's size: one fit over all of them below.
  std::map<std::string, std::vector<LinkPoint>> tensor_points;
  // The mesh's groups, split once per mesh (Comm::split is collective: every rank, the same order).
  // Keyed (stages, tensor ranks, shard group).
  std::map<std::tuple<int, int, std::string>, MeshGroups> groups;
  auto key_of = [](const Choice& ch) { return std::make_tuple(ch.pipeline, ch.tensor, ch.shard_group); };
  for (Candidate* c : fit) {
    const Choice& ch = c->choice;
    if ((!ch.meshed() && ch.shard_group == "world") || groups.count(key_of(ch))) continue;
    groups[key_of(ch)] = ch.shard_group != "world" ? split_shards(comm, std::stoi(ch.shard_group))
                                                   : split_mesh(comm, ch.pipeline, ch.tensor);
  }
  for (Candidate* c : fit) {
    any_nvme |= c->choice.optimizer_offloaded;
    const Choice& ch = c->choice;
    MeshGroups* g = groups.count(key_of(ch)) ? &groups[key_of(ch)] : nullptr;
    if (ch.shard_group != "world") {  // the replicas' all-reduce, at the bucket size
      const LinkKey k{"all_reduce", ch.bucket_mb, replica_group_name(ch)};
      if (!links.count(k)) links[k] = cal.link("all_reduce", size_t(ch.bucket_mb * double(1 << 20)), g->replica.get(), std::get<2>(k));
    }
    if (ch.tensor > 1) {  // the tensor group's collectives, at one micro-batch's activations
      const double act_mb = tensor_link_mb(*c);
      const LinkKey k{"all_reduce", act_mb, tensor_group_name(ch)};
      if (!links.count(k))
        links[k] = cal.link("all_reduce", size_t(act_mb * double(1 << 20)), g->tensor.get(), std::get<2>(k),
                            &tensor_points[std::get<2>(k)]);
    }
    // The stage boundary at the larger of its two messages (a micro-batch's activations, the tied
    // embedding's gradient shard) and a sixteenth of it: latency and bandwidth apart.
    const size_t stage_bytes = stage_link_bytes(*c);
    if (ch.pipeline > 1 && !m.stage_links.count({ch.pipeline, stage_bytes}))
      m.stage_links[{ch.pipeline, stage_bytes}] = cal.stage_link(ch.pipeline, stage_bytes);
    // Stages sharing one host's cores: what a busy stage gets while the others wait.
    if (ch.pipeline > 1 && c->shape.ranks_per_host == c->shape.ranks && !m.idle_shares.count({ch.pipeline, ch.micro_batch}))
      m.idle_shares[{ch.pipeline, ch.micro_batch}] = cal.stage_idle_share(cfg, ch.pipeline, ch.micro_batch, T);
    if (ch.data == 1) continue;
    const size_t bytes = size_t(ch.bucket_mb * double(1 << 20));
    const std::string name = data_group_name(ch);
    for (const char* op : {"all_reduce", "reduce_scatter", "all_gather"})
      if (!links.count({op, ch.bucket_mb, name}))
        links[{op, ch.bucket_mb, name}] = cal.link(op, bytes, g ? g->data.get() : nullptr, name);
    // The share overlap leaves exposed is the world's at that bucket: every rank computes and runs
    // its comm thread at once whatever group it sends on.
    if (!overlap.count(ch.bucket_mb)) overlap[ch.bucket_mb] = cal.overlap_exposed_share(cfg, T, bytes);
  }
  // A tensor group's collectives are the same ops at every micro-batch, in bytes proportional to it:
  // one latency and one bandwidth fitted over every size probed, where fits of two sizes each
  // scattered (the 2-host bed: 111-163 MB/s and 0.82-0.90 ms on one 125 MB/s link, which ranked
  // B 4 x 2 ahead of B 8 x 1 and measured 13% slower; docs/autoplan.md, "Measured: the mesh").
  for (auto& [key, cost] : links)
    if (tensor_points.count(std::get<2>(key))) cost = fit_link(tensor_points[std::get<2>(key)]);
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
