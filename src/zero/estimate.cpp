#include "zero/estimate.h"

#include <iomanip>
#include <map>
#include <sstream>

#include "model/gpt.h"
#include "backend/ops_cpu.h"
#if ZT_HAVE_CUDA
#include "backend/ops_cuda.h"
#endif
#include "runtime/checked.h"
#include "runtime/error.h"
#include "zero/offload_plan.h"
#include "zero/partition.h"
#include "zero/store.h"

namespace zt {

int parse_world(const std::string& text) {
  // Digits only: no sign, spaces or exponent; at most 6 of them so the value cannot overflow.
  const bool digits = !text.empty() && text.size() <= 6 && text.find_first_not_of("0123456789") == std::string::npos;
  const long n = digits ? std::stol(text) : 0;
  ZT_REQUIRE(n >= 1 && n <= kMaxWorld,
             "--world must be an integer between 1 and " << kMaxWorld << ", got \"" << clip(text, 30) << "\"");
  return int(n);
}

namespace {

// The plan on the backend of op table Ops: the store's list for its types and tiers, its activations.
template <class Ops>
Estimate estimate_for(const Plan& plan, int world) {
  const ModelSection& m = plan.model;
  const GPTConfig cfg = GPTConfig::make(m.n_layer, m.n_head, m.n_embd, m.seq_len, m.vocab_size);
  const ParamLayout layout(cfg, zero_pad_multiple(world), zero_embedding_rows(cfg, plan.zero.stage, world));
  ZeroConfig zc;
  zc.stage = plan.zero.stage; zc.world = world; zc.rank = 0; zc.overlap = plan.zero.overlap_comm;
  zc.bucket_mb = plan.zero.bucket_mb; zc.prefetch_units = plan.zero.prefetch_units;
  zc.grad_accum = plan.batch.grad_accum; zc.elem_bytes = sizeof(typename Ops::T);
  const int B = plan.batch.micro_batch;
  const int chunk = plan.recompute.classifier_chunk;
  const Recompute rc = Recompute::from(plan.recompute.policy, plan.recompute.every, chunk);
  const int cls_rows = GPT<Ops>::classifier_rows(cfg, B, m.seq_len, rc);
  // GPT::classifier_regathers() for this layout: chunks over a split embedding.
  zc.classifier_regather = cls_rows < B * m.seq_len && layout.embedding_units() > 1;
  zc.micro_tokens = size_t(B) * size_t(m.seq_len); zc.host = Ops::tier == Tier::host;
  const Partition part(layout, zc);

  Estimate e;
  std::map<std::pair<Tier, Category>, size_t> by;  // bytes per (tier, category)
  std::map<Tier, size_t> totals;
  const std::string what = "model: per-rank memory (bytes)";
  auto count = [&](Tier t, Category c, size_t bytes) {
    by[{t, c}] = checked_add(by[{t, c}], bytes, what);
    totals[t] = checked_add(totals[t], bytes, what);
  };
  // The store's own list (zero/store.h): what a run allocates, buffer for buffer, in its tier.
  StateTypes types = state_types_of<Ops>();
  // As the trainer builds it: the CUDA backend's AdamW on the host with offload.optimizer set.
  types.host_optimizer = Ops::tier == Tier::device && plan.offload.optimizer != "none";
  for (const StateBuffer& b : list_model_state(layout, part, types, swap_spec_of(plan.offload, 0))) {
    count(b.tier, b.cat, b.bytes());
    e.buffers.push_back({{"category", category_name(b.cat)}, {"name", b.name()}, {"tier", tier_name(b.tier)},
                         {"bytes", b.bytes()}});
  }
  const size_t act = GPT<Ops>::activation_bytes(cfg, B, m.seq_len, rc);
  count(Ops::tier, Category::activations, act);
  e.buffers.push_back({{"category", "activations"}, {"name", "activations and activation gradients"},
                       {"tier", tier_name(Ops::tier)}, {"bytes", act}});
  // The policy's price next to the alternatives (docs/design.md §3.11): activation bytes of every
  // policy, and the forward FLOPs backward spends again (matmuls and attention, per micro-step).
  const double fwd = GPT<Ops>::forward_flops(cfg, B, m.seq_len);
  // A split embedding's chunked classifier recomputes the logits twice in backward (input gradient
  // first, each unit's weight gradient at the end; docs/design.md §3.11).
  const double extra = GPT<Ops>::recompute_flops(cfg, B, m.seq_len, rc) +
                       (zc.classifier_regather ? 2.0 * B * m.seq_len * cfg.C * cfg.Vp : 0.0);
  // Every policy with this plan's classifier chunk, and without chunks (whole logits).
  auto by_policy = [&](int c) {
    nlohmann::json j;
    for (const char* p : {"none", "selective", "block"})
      j[p] = GPT<Ops>::activation_bytes(cfg, B, m.seq_len, Recompute::from(p, 1, c));
    return j;
  };
  const nlohmann::json acts_by = by_policy(chunk), acts_whole = by_policy(0);
  const size_t none = acts_by["none"], selective = acts_by["selective"], block = acts_by["block"];
  const size_t logits_bytes = size_t(cls_rows) * size_t(cfg.Vp) * sizeof(typename Ops::T);
  e.recompute = {{"policy", plan.recompute.policy}, {"every", plan.recompute.every}, {"activation_bytes", act},
                 {"classifier_chunk_rows", cls_rows}, {"classifier_chunk_logits_bytes", logits_bytes},
                 {"activation_bytes_by_policy", acts_by}, {"activation_bytes_by_policy_whole_logits", acts_whole},
                 {"extra_forward_flops_per_micro_step", extra}, {"forward_flops_per_micro_step", fwd}};

  for (const auto& [tier, total] : totals) {
    nlohmann::json row = nlohmann::json::object();
    for (const auto& [key, bytes] : by)
      if (key.first == tier) row[category_name(key.second)] = bytes;
    row["total"] = total;
    e.memory[tier_name(tier)] = row;
  }
  e.bytes_per_step = part.bytes_per_step();
  e.bytes_formula = part.bytes_formula();

  std::ostringstream os;
  os << "plan " << plan.source << ": zero stage " << plan.zero.stage << ", world " << world << ", "
     << double(layout.num_params()) / 1e6 << "M parameters (" << layout.total() << " padded), micro_batch "
     << plan.batch.micro_batch << " x seq_len " << m.seq_len << "\n\n";
  if (Ops::tier == Tier::device)
    os << "backend " << Ops::name << " (device \"cuda\"): device memory as the run tracks it; the CUDA context and\n"
          "cuBLASLt's workspace are not counted\n\n";
  else if (plan.device == "cuda" || plan.precision.compute == "bf16")  // cuda: a build without the CUDA backend
    os << "note: this estimate models the CPU backend (fp32, host memory); with device \"cuda\" in a CUDA build it\n"
          "models the CUDA backend's sizes (bf16 storage, fp32 master weights and AdamW state, device memory)\n\n";
  os << "per-rank memory:\n";
  for (const auto& b : e.buffers)
    os << "  " << std::left << std::setw(12) << b["category"].get<std::string>() << std::setw(38)
       << b["name"].get<std::string>() << std::setw(8) << b["tier"].get<std::string>() << std::right << std::setw(14)
       << format_bytes(double(b["bytes"].get<size_t>())) << "\n";
  os << "\n  " << std::left << std::setw(12) << "category";
  for (const auto& [tier, total] : totals) os << std::right << std::setw(14) << tier_name(tier);
  os << "\n";
  std::map<Category, bool> cats;
  for (const auto& [key, bytes] : by) cats[key.second] = true;
  for (const auto& [cat, _] : cats) {
    os << "  " << std::left << std::setw(12) << category_name(cat);
    for (const auto& [tier, total] : totals) {
      const auto it = by.find({tier, cat});
      os << std::right << std::setw(14) << (it == by.end() ? "-" : format_bytes(double(it->second)));
    }
    os << "\n";
  }
  os << "  " << std::left << std::setw(12) << "total";
  for (const auto& [tier, total] : totals) os << std::right << std::setw(14) << format_bytes(double(total));
  os << "\n";
  os << "\nactivations by recompute.policy: none " << format_bytes(double(none)) << ", selective "
     << format_bytes(double(selective)) << ", block " << format_bytes(double(block)) << " (this plan: "
     << plan.recompute.policy;
  if (plan.recompute.policy == "block") os << ", every " << plan.recompute.every;
  os << ")\nclassifier: ";
  if (cls_rows < B * m.seq_len)
    os << "chunks of " << cls_rows << " positions (" << format_bytes(double(logits_bytes)) << " of logits; whole: none "
       << format_bytes(double(acts_whole["none"].get<size_t>())) << ", block "
       << format_bytes(double(acts_whole["block"].get<size_t>())) << ")";
  else
    os << "whole (" << format_bytes(double(logits_bytes)) << " of logits)";
  os << "\nrecompute: " << std::fixed << std::setprecision(1) << extra / 1e9 << " GFLOP of forward again per micro-step ("
     << 100.0 * extra / (3.0 * fwd) << "% of a step's ~3 x " << fwd / 1e9
     << " GFLOP forward; matmuls and attention, pointwise work not counted)\n";
  os << "\nsent per rank per optimizer step: " << format_bytes(double(e.bytes_per_step)) << " (" << e.bytes_per_step
     << " bytes)\n  " << e.bytes_formula << "\n";
  e.table = os.str();
  return e;
}

}  // namespace

Estimate estimate_plan(const Plan& plan, int world) {
  ZT_REQUIRE(world >= 1 && world <= kMaxWorld, "--world must be between 1 and " << kMaxWorld << ", got " << world);
#if ZT_HAVE_CUDA
  // device "cuda": the CUDA backend's buffers (precision "auto" is bf16 there, as choose_backend runs it).
  if (plan.device == "cuda")
    return plan.precision.compute == "fp32" ? estimate_for<CudaOps<float>>(plan, world)
                                            : estimate_for<CudaOps<bf16>>(plan, world);
#endif
  return estimate_for<CpuOps<float>>(plan, world);  // the CPU backend: fp32 everywhere, host memory
}

}  // namespace zt
