// `train estimate`'s output: the numbers of estimate_plan (zero/estimate.cpp) as text and as JSON.
#include <iomanip>
#include <sstream>

#include "zero/estimate.h"

namespace zt {

namespace {

std::string nccl_formula(const CommEstimate& c) {
  std::ostringstream os;
  os << c.nccl_channels << " channels x " << c.nccl_connections << " connections x " << c.nccl_conn_bytes
     << " bytes (Simple 4 MiB + LL128 4.69 MiB + LL 512 KiB)";
  return os.str();
}

// On a device backend: how the collectives move, and the memory that goes with it outside the table.
void comm_text(std::ostream& os, const Estimate& e) {
  const CommEstimate& c = e.comm;
  if (c.backend == "nccl") {
    os << "\ncomm: nccl (device buffers, no host copies): pinned host staging " << format_bytes(double(c.pinned_staging))
       << " (comm.backend \"mpi\", host-staged, would pin " << format_bytes(double(c.host_staged_pinned)) << ")\n";
    if (e.world == 1) {
      os << "  NCCL's own device buffers: none (a world of one connects no peers)\n";
      return;
    }
    os << "  NCCL's own device buffers (not allocated or tracked by zerotrain, not in the table above;\n"
          "  approximate, from NCCL's defaults, not measured on a GPU): ~"
       << format_bytes(double(c.nccl_internal)) << "\n    = " << nccl_formula(c)
       << "\n    assumes " << c.nccl_channels << " channels (NVLink; PCIe uses fewer), a ring's and a tree's connection per"
          " channel,\n    the default NCCL_BUFFSIZE / NCCL_LL128_BUFFSIZE / NCCL_LL_BUFFSIZE; NCCL_MAX_NCHANNELS and those\n"
          "    variables change it\n";
  } else {
    os << "\ncomm: mpi (device buffers host-staged through pinned memory): pinned host staging "
       << format_bytes(double(c.pinned_staging)) << " (comm.backend \"nccl\": none)\n";
  }
}

}  // namespace

nlohmann::json estimate_json(const Estimate& e) {
  nlohmann::json memory, buffers = nlohmann::json::array();
  for (const auto& [tier, total] : e.tier_totals) {
    nlohmann::json row = nlohmann::json::object();
    for (const auto& [key, bytes] : e.by_tier_category)
      if (key.first == tier) row[category_name(key.second)] = bytes;
    row["total"] = total;
    memory[tier_name(tier)] = row;
  }
  for (const EstimatedBuffer& b : e.buffers)
    buffers.push_back({{"category", category_name(b.category)}, {"name", b.name}, {"tier", tier_name(b.tier)},
                       {"bytes", b.bytes}});
  const RecomputeEstimate& r = e.recompute;
  const nlohmann::json recompute = {{"policy", r.policy},
                                    {"every", r.every},
                                    {"activation_bytes", r.activation_bytes},
                                    {"classifier_chunk_rows", r.classifier_rows},
                                    {"classifier_chunk_logits_bytes", r.logits_bytes},
                                    {"activation_bytes_by_policy", r.by_policy},
                                    {"activation_bytes_by_policy_whole_logits", r.by_policy_whole_logits},
                                    {"extra_forward_flops_per_micro_step", r.extra_forward_flops},
                                    {"forward_flops_per_micro_step", r.forward_flops}};
  nlohmann::json out = {{"memory", memory}, {"buffers", buffers}, {"bytes_per_step", e.bytes_per_step},
                        {"world", e.world},   {"stage", e.stage},     {"recompute", recompute},
                        {"shard_group", e.shard_group},
                        {"replicas", e.replicas},
                        {"bytes_per_step_shard_group", e.bytes_shard_group},
                        {"bytes_per_step_replicate_group", e.bytes_replicas},
                        {"tensor", e.tensor},
                        {"data_world", e.data_world},
                        {"bytes_per_step_tensor_group", e.bytes_tensor}};
  out["pipeline"] = e.pipeline;
  if (e.pipeline > 1) {
    nlohmann::json stages = nlohmann::json::array();
    for (const Estimate& st : e.stages) {
      const nlohmann::json j = estimate_json(st);
      stages.push_back({{"stage", st.pipeline_stage},
                        {"first_layer", st.first_layer},
                        {"layers", st.layers},
                        {"layer_runs", st.layer_runs},
                        {"activation_slots", st.activation_slots},
                        {"memory", j["memory"]},
                        {"bytes_per_step", st.bytes_per_step}});
    }
    out["pipeline_stages"] = stages;
  }
  if (e.tensor > 1)
    out["sequence_parallel_activation_bytes"] = {{"with", e.activations_sp}, {"without", e.activations_no_sp}};
  if (e.backend_tier == Tier::device) {
    const CommEstimate& c = e.comm;
    out["comm"] = {{"backend", c.backend},
                   {"pinned_staging_bytes", c.pinned_staging},
                   {"host_staged_pinned_bytes", c.host_staged_pinned}};
    if (c.backend == "nccl") {
      out["comm"]["nccl_internal_bytes_approx"] = c.nccl_internal;
      out["comm"]["nccl_internal_formula"] = nccl_formula(c);
    }
  }
  return out;
}

std::string estimate_text(const Estimate& e) {
  std::ostringstream os;
  os << "plan " << e.plan_source << ": zero stage " << e.stage << ", world " << e.world << ", "
     << double(e.num_params) / 1e6 << "M parameters (" << e.padded_params << " padded), micro_batch " << e.micro_batch
     << " x seq_len " << e.seq_len << "\n";
  if (e.tensor > 1)
    os << "tensor parallelism: " << e.world / e.tensor << " tensor groups of " << e.tensor
       << " ranks (each rank holds 1/" << e.tensor << " of every block's matrices and of the vocabulary: the numbers "
       << "below are tensor rank 0's); the data axis: " << e.data_world << (e.data_world == 1 ? " rank\n" : " ranks\n");
  if (e.pipeline > 1) {
    os << "pipeline parallelism: " << e.pipeline << " stages; the numbers below are stage 0's (rank 0's). Per stage:\n";
    for (const Estimate& st : e.stages) {
      os << "  stage " << st.pipeline_stage << ": layers ";
      for (size_t c = 0; c < st.layer_runs.size(); ++c) {
        const auto [first, n] = st.layer_runs[c];
        os << (c ? "," : "") << first;
        if (n > 1) os << "-" << first + n - 1;
      }
      os << ", activations of " << st.activation_slots << " micro-batch(es) in flight "
         << format_bytes(double(st.recompute.activation_bytes)) << ", total "
         << format_bytes(double(st.tier_total(st.backend_tier))) << "\n";
    }
  }
  if (e.replicas > 1)
    os << "hybrid sharding: " << e.replicas << " shard groups of " << e.shard_group
       << " ranks, each a replica: model state sharded as at world " << e.shard_group << "\n";
  os << "\n";
  if (e.backend_tier == Tier::device)
    os << "backend " << e.backend_name << " (device \"cuda\"): device memory as the run tracks it; the CUDA context and\n"
          "cuBLASLt's workspace are not counted\n\n";
  else if (e.backend_name == "cpu-bf16")
    os << "backend cpu-bf16: host memory as the run tracks it; oneDNN's primitives (one per product shape, made on\n"
          "first use) are not counted\n\n";
  else if (e.cpu_for_gpu_plan)
    os << "note: this estimate models the CPU backend (fp32, host memory); with device \"cuda\" in a CUDA build it\n"
          "models the CUDA backend's sizes (bf16 storage, fp32 master weights and AdamW state, device memory)\n\n";
  os << "per-rank memory:\n";
  for (const EstimatedBuffer& b : e.buffers)
    os << "  " << std::left << std::setw(12) << category_name(b.category) << std::setw(38) << b.name << std::setw(8)
       << tier_name(b.tier) << std::right << std::setw(14) << format_bytes(double(b.bytes)) << "\n";
  os << "\n  " << std::left << std::setw(12) << "category";
  for (const auto& [tier, total] : e.tier_totals) os << std::right << std::setw(14) << tier_name(tier);
  os << "\n";
  std::map<Category, bool> cats;
  for (const auto& [key, bytes] : e.by_tier_category) cats[key.second] = true;
  for (const auto& [cat, _] : cats) {
    os << "  " << std::left << std::setw(12) << category_name(cat);
    for (const auto& [tier, total] : e.tier_totals) {
      const auto it = e.by_tier_category.find({tier, cat});
      os << std::right << std::setw(14) << (it == e.by_tier_category.end() ? "-" : format_bytes(double(it->second)));
    }
    os << "\n";
  }
  os << "  " << std::left << std::setw(12) << "total";
  for (const auto& [tier, total] : e.tier_totals) os << std::right << std::setw(14) << format_bytes(double(total));
  os << "\n";

  const RecomputeEstimate& r = e.recompute;
  os << "\nactivations by recompute.policy: none " << format_bytes(double(r.by_policy.at("none"))) << ", selective "
     << format_bytes(double(r.by_policy.at("selective"))) << ", block " << format_bytes(double(r.by_policy.at("block")))
     << " (this plan: " << r.policy;
  if (r.policy == "block") os << ", every " << r.every;
  os << ")\n";
  if (e.tensor > 1) {
    os << "sequence parallelism: activations ";
    if (e.activations_sp > 0) os << format_bytes(double(e.activations_sp)) << " with, ";
    else os << "(seq_len not divisible by mesh.tensor) ";
    os << format_bytes(double(e.activations_no_sp)) << " without\n";
  }
  os << "classifier: ";
  if (r.classifier_rows < e.micro_batch * e.seq_len)
    os << "chunks of " << r.classifier_rows << " positions (" << format_bytes(double(r.logits_bytes))
       << " of logits; whole: none " << format_bytes(double(r.by_policy_whole_logits.at("none"))) << ", block "
       << format_bytes(double(r.by_policy_whole_logits.at("block"))) << ")";
  else
    os << "whole (" << format_bytes(double(r.logits_bytes)) << " of logits)";
  const double extra = r.extra_forward_flops, fwd = r.forward_flops;
  os << "\nrecompute: " << std::fixed << std::setprecision(1) << extra / 1e9 << " GFLOP of forward again per micro-step ("
     << 100.0 * extra / (3.0 * fwd) << "% of a step's ~3 x " << fwd / 1e9
     << " GFLOP forward; matmuls and attention, pointwise work not counted)\n";
  if (e.backend_tier == Tier::device) comm_text(os, e);
  os << "\nsent per rank per optimizer step";
  if (e.backend_tier == Tier::device) os << " (" << e.comm.backend << ")";
  os << ": " << format_bytes(double(e.bytes_per_step)) << " (" << e.bytes_per_step << " bytes)\n  " << e.bytes_formula
     << "\n";
  if (e.replicas > 1)
    os << "  within the shard group " << format_bytes(double(e.bytes_shard_group)) << ", across the replicas "
       << format_bytes(double(e.bytes_replicas))
       << " (with the shard group a host, only the latter crosses between hosts)\n";
  if (e.tensor > 1)
    os << "  on the tensor group " << format_bytes(double(e.bytes_tensor)) << " (activations: " << e.tensor
       << " ranks all-reduce (micro_batch, seq_len, n_embd) 4 n_layer + 2 times per micro-step, docs/tensor.md), on the "
          "data axis "
       << format_bytes(double(e.bytes_per_step - e.bytes_tensor)) << "\n";
  return os.str();
}

}  // namespace zt
