#include "autoplan/candidates.h"

#include <algorithm>
#include <cstdio>
#include <set>

#include "autoplan/ranking.h"
#include "backend/ops_cpu.h"
#include "model/gpt.h"
#include "runtime/error.h"
#include "runtime/launcher.h"
#include "train/backend_choice.h"
#include "zero/engine_settings.h"
#include "zero/estimate.h"
#include "zero/offload_plan.h"
#include "zero/partition.h"

namespace zt::autoplan {

namespace {

// The data axis at `data` ranks, as before the mesh: micro-batch x accumulation, recomputation,
// ZeRO stage and offload, bucket and overlap.
void data_axis(const Plan& base, const Choice& mesh, long per_rank_sequences, bool offload,
               const std::string& offload_to, int ranks_per_host, std::vector<Choice>& out) {
  const int data = mesh.data;
  std::vector<int> batches;
  for (long b = 1; b <= per_rank_sequences; ++b)
    if (per_rank_sequences % b == 0) batches.push_back(int(b));
  std::vector<std::pair<std::string, int>> policies = {{"none", 1}, {"selective", 1}, {"block", 1}};
  if (base.model.n_layer >= 2) policies.push_back({"block", 2});
  struct Placement {
    int stage;
    bool opt, params;
  };
  std::vector<Placement> placements;
  if (data == 1) {
    placements.push_back({0, false, false});
    if (offload) placements.insert(placements.end(), {{2, true, false}, {3, true, true}});
  } else {
    for (int st = 0; st <= 3; ++st) placements.push_back({st, false, false});
    if (offload) placements.insert(placements.end(), {{1, true, false}, {2, true, false}, {3, true, false}, {3, true, true}});
  }
  std::vector<double> buckets = {base.zero.bucket_mb};
  if (data > 1 && base.zero.bucket_mb / 4 >= 0.25) buckets.push_back(base.zero.bucket_mb / 4);
  std::vector<bool> overlaps = data > 1 ? std::vector<bool>{true, false} : std::vector<bool>{base.zero.overlap_comm};
  // Hybrid sharding where the data axis is the world and spans hosts (docs/autoplan.md, "Candidates").
  const bool hybrid = !mesh.meshed() && ranks_per_host > 1 && ranks_per_host < data && data % ranks_per_host == 0;
  for (const Placement& pl : placements) {
    std::vector<std::string> groups = {"world"};
    if (hybrid && pl.stage > 0 && !pl.opt) groups.push_back(std::to_string(ranks_per_host));
    for (const std::string& group : groups)
      for (const auto& [policy, every] : policies)
        for (int b : batches)
          for (double bucket : buckets)
            for (bool ov : overlaps) {
              Choice c = mesh;
              c.stage = pl.stage, c.optimizer_offloaded = pl.opt, c.params_offloaded = pl.params, c.offload_to = offload_to;
              c.policy = policy, c.every = every;
              c.micro_batch = b, c.grad_accum = int(per_rank_sequences / b);
              c.bucket_mb = bucket, c.overlap = ov;
              c.shard_group = group;
              out.push_back(c);
            }
  }
}

}  // namespace

std::vector<Choice> enumerate(const Plan& base, int world, long global, bool offload, const std::string& offload_to,
                              bool mesh, int ranks_per_host, std::map<std::string, long>& dropped) {
  std::vector<Choice> out;
  for (int P = 1; P <= (mesh ? world : 1); ++P)
    for (int T = 1; T <= (mesh ? world / P : 1); ++T) {
      if (world % (P * T) != 0) continue;
      Choice m;
      m.pipeline = P, m.tensor = T, m.data = world / (P * T);
      if (global % m.data != 0) {
        dropped["the data axis does not divide the global batch"] += 1;
        continue;
      }
      // Offload's rates come from engine runs of the data axis alone (docs/autoplan.md, "Calibration").
      const bool offload_here = offload && !m.meshed();
      for (int chunks : P > 1 ? std::vector<int>{1, 2} : std::vector<int>{1})
        for (bool sp : T > 1 ? std::vector<bool>{false, true} : std::vector<bool>{false}) {
          m.chunks = chunks, m.sequence_parallel = sp;
          data_axis(base, m, global / m.data, offload_here, offload_to, ranks_per_host, out);
        }
    }
  return out;
}

namespace {

// Why the plan's own checks refused a candidate, by the field they name (plan: FIELD: ...), in
// words the count in the first line can use.
std::string refusal_reason(const std::string& message) {
  static const std::pair<const char*, const char*> known[] = {
      {"plan: mesh.tensor:", "the tensor ranks do not divide the heads"},
      {"plan: mesh.sequence_parallel:", "the tensor ranks do not divide the sequence"},
      {"plan: mesh.pipeline:", "a stage would hold no block"},
      {"plan: mesh.chunks:", "a model chunk would hold no block"},
      {"plan: zero.stage:", "ZeRO stages 2-3 with pipeline stages"},
      {"plan: batch.grad_accum:", "interleaved micro-batches not a multiple of the stages"}};
  for (const auto& [prefix, why] : known)
    if (message.rfind(prefix, 0) == 0) return why;
  const size_t colon = message.find(':', 6);
  return "refused by the plan's checks (" + message.substr(0, colon == std::string::npos ? 60 : colon) + ")";
}

}  // namespace

std::vector<Candidate> size_candidates(const PlanRequest& req, const PlanInputs& in, Comm& comm,
                                       std::map<std::string, long>& dropped) {
  const int world = in.world, local = in.local;
  const bool root = comm.rank() == 0, on_device = in.on_device, nvme = in.nvme, direct = in.direct;
  const Plan& base = in.base;
  const std::string& backend = in.backend;
  const HostMemory& avail = in.avail;
  const uint64_t nvme_free = in.nvme_free, device_avail = in.device_avail;
  const std::string& nvme_why = in.nvme_why;
  // A key the planner searches, given with --set, fixes it: only the candidates that keep it. (The
  // batch keys and zero.bucket_mb are not among them: with --set they give the global batch and
  // the bucket size the search starts from, docs/autoplan.md.)
  std::vector<std::string> fixed;
  for (const std::string& o : req.overrides) {
    const std::string key = o.substr(0, o.find('='));
    for (const char* k : {"mesh.pipeline", "mesh.tensor", "mesh.chunks", "mesh.sequence_parallel", "zero.shard_group",
                          "zero.stage", "zero.overlap_comm", "offload.optimizer", "offload.params", "recompute.policy",
                          "recompute.every"})
      if (key == k && std::find(fixed.begin(), fixed.end(), key) == fixed.end()) fixed.push_back(key);
  }
  std::vector<Choice> choices;
  // The CUDA backend is planned for memory on the data axis alone (docs/autoplan.md, "On the CUDA backend").
  for (const Choice& ch :
       enumerate(base, world, in.global, nvme, on_device ? "cpu" : "nvme", !on_device, on_device ? 1 : local, dropped)) {
    const nlohmann::json cj = ch.to_json();
    bool keeps = true;
    for (const std::string& k : fixed) {
      const size_t dot = k.find('.');
      keeps = keeps && cj[k] == base.resolved[k.substr(0, dot)][k.substr(dot + 1)];
    }
    if (keeps) choices.push_back(ch);
  }
  if (!fixed.empty()) {
    std::string what;
    for (const std::string& k : fixed) {
      const size_t dot = k.find('.');
      what += (what.empty() ? "" : ", ") + k + "=" + base.resolved[k.substr(0, dot)][k.substr(dot + 1)].dump();
    }
    ZT_REQUIRE(!choices.empty(), "plan: --set " << what << ": no candidate the planner searches at " << world
                                  << " rank(s) has that (docs/autoplan.md, \"Candidates\""
                                  << (nvme ? "" : "; no offload here: " + nvme_why)
                                  << "): drop the --set to let it choose, or train that plan as it is");
    if (root) std::printf("plan: --set fixes %s: only candidates with that\n", what.c_str());
  }
  std::vector<Candidate> all;
  for (const Choice& ch : choices) {
    Candidate c;
    c.choice = ch;
    c.resolved = base.resolved;
    ch.apply(c.resolved);
    c.resolved["batch"]["world"] = world;  // its batch is for this world: training at another is refused
    Plan p;
    Estimate est;
    try {
      p = plan_from_json(c.resolved, false);
      p.source = base.source;
      record_backend(p, backend);
      record_comm_backend(p, planned_comm_backend(p, backend, world));
      est = estimate_plan(p, world);
    } catch (const Error& e) {
      dropped[refusal_reason(e.what())] += 1;
      continue;
    }
    const uint64_t transient = uint64_t(GPTConfig::pad_vocab(p.model.vocab_size)) * uint64_t(p.model.n_embd) * 4;
    // Stages hold different blocks: the fullest stage's rank counts (every rank of a host may be it).
    uint64_t tracked = est.tier_total(Tier::host) + est.tier_total(Tier::pinned);
    for (const Estimate& st : est.stages) tracked = std::max<uint64_t>(tracked, st.tier_total(Tier::host) + st.tier_total(Tier::pinned));
    c.host = tracked + transient + kRuntimeOverhead;
    c.nvme = est.tier_total(Tier::nvme);
    c.fits = (avail.bytes == 0 || c.host * uint64_t(local) <= avail.bytes) && (c.nvme == 0 || c.nvme * uint64_t(local) <= nvme_free);
    if (on_device) {
      c.device = est.tier_total(Tier::device) + (est.comm.backend == "nccl" ? est.comm.nccl_internal : 0);
      c.fits = c.fits && c.device <= device_avail;
    }
    c.shape = step_shape(p, est, world);
    c.shape.ranks = world, c.shape.ranks_per_host = local;
    const EngineSettings es = engine_settings<CpuOps<float>>(p, DataMesh::of(p, world, 0, 0));
    c.embedding_rows = es.embedding_rows;
    c.swap = swap_spec_of(p.offload, comm.rank(), direct);
    if (ch.params_offloaded) {
      const ParamLayout layout = es.layout();
      const Partition part(layout, es.zero);
      for (int u = 0; u < layout.num_units(); ++u) c.unit_shards.push_back(part.unit_shard_numel(u));
      c.embedding_units = layout.embedding_units();
      c.regather = es.zero.classifier_regather;
    }
    all.push_back(std::move(c));
  }
  return all;
}

std::vector<Candidate*> fitting(std::vector<Candidate>& all) {
  std::set<std::string> fits_with_overlap;
  for (const Candidate& c : all)
    if (c.fits && c.choice.overlap) fits_with_overlap.insert(c.choice.to_json().dump());
  std::vector<Candidate*> fit;
  for (Candidate& c : all) {
    Choice twin = c.choice;
    twin.overlap = true;
    if (c.fits && (c.choice.overlap || !fits_with_overlap.count(twin.to_json().dump()))) fit.push_back(&c);
  }
  return fit;
}

void print_fit(const PlanRequest& req, const PlanInputs& in, size_t all, size_t fit,
               const std::map<std::string, long>& dropped, bool root) {
  const HostMemory& avail = in.avail;
  if (root && !dropped.empty()) {
    long n = 0;
    std::string why;
    for (const auto& [reason, count] : dropped) n += count, why += (why.empty() ? "" : "; ") + reason + ": " + std::to_string(count);
    std::printf("plan: %ld mesh candidate(s) left out before sizing (%s)\n", n, why.c_str());
  }
  if (root)
    std::printf("plan: %s at %d rank(s), %ld sequences per step (%ld per rank): %zu candidates, %zu fit in %s per host (%s)%s%s\n",
                req.base.c_str(), in.world, in.global, in.per_rank, all, fit,
                avail.bytes ? mib(double(avail.bytes)).c_str() : "unknown memory", avail.source.c_str(),
                in.on_device ? (" and " + mib(double(in.device_avail)) + " per rank on the GPU (" + in.backend + ")").c_str() : "",
                in.nvme ? "" : (" (no offload candidates: " + in.nvme_why + ")").c_str());
}

void refuse_no_fit(const std::vector<Candidate>& all, const PlanInputs& in) {
  const int local = in.local;
  const bool nvme = in.nvme;
  const HostMemory& avail = in.avail;
  const uint64_t nvme_free = in.nvme_free;
  const std::string& nvme_why = in.nvme_why;
  const Plan& base = in.base;
  const auto least_host = std::min_element(all.begin(), all.end(), [](auto& a, auto& b) { return a.host < b.host; });
  std::ostringstream os;
  os << "plan: no candidate fits: the smallest needs " << mib(double(least_host->host)) << " host memory per rank x "
     << local << " rank(s) on this host (" << least_host->choice.label() << ")";
  if (least_host->nvme) os << " and " << mib(double(least_host->nvme)) << " in offload.nvme_dir per rank";
  os << "; available: " << (avail.bytes ? mib(double(avail.bytes)) : "unknown") << " host (" << avail.source << ")";
  if (nvme) os << ", " << mib(double(nvme_free)) << " in " << base.offload.nvme_dir;
  else os << ", no offload (" << nvme_why << ")";
  throw Error(os.str());
}

}  // namespace zt::autoplan
