#include "zero/estimate.h"

#include "model/gpt.h"
#include "backend/ops_cpu.h"
#if ZT_HAVE_CUDA
#include "backend/ops_cuda.h"
#endif
#include "runtime/checked.h"
#include "runtime/error.h"
#include "zero/engine_settings.h"
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

// NCCL's own device buffers, per rank, from its defaults (the NCCL source and its maintainers'
// notes; not measured on a GPU): each connection of each channel has a FIFO per protocol, Simple
// 4 MiB (NCCL_BUFFSIZE), LL128 120 x 640 x 8 steps x 8 B = 4.69 MiB (NCCL_LL128_BUFFSIZE), LL
// 8 x 512 x 8 steps x 16 B = 512 KiB (NCCL_LL_BUFFSIZE). A rank holds about two connections a
// channel (a ring's and a tree's; a ring needs two at any scale), and the channel count follows the
// topology: up to 32 where NVLink is fast (H100), fewer over PCIe (NCCL_MAX_NCHANNELS caps it).
// NVLS, CollNet and send/receive buffers are not counted. A world of one connects nothing.
void estimate_nccl_internal(CommEstimate& c, int world) {
  if (world == 1) return;
  c.nccl_channels = 32;
  c.nccl_connections = 2;
  c.nccl_conn_bytes = (size_t(4) << 20) + size_t(120) * 640 * 8 * 8 + size_t(8) * 512 * 8 * 16;
  c.nccl_internal = size_t(c.nccl_channels) * size_t(c.nccl_connections) * c.nccl_conn_bytes;
}

// The plan on the backend of op table Ops: the store's list for its types and tiers, its activations.
template <class Ops>
Estimate estimate_for(const Plan& plan, int world, int ranks_per_host, int rank = 0) {
  const DataMesh mesh = DataMesh::of(plan, world, rank, ranks_per_host);
  const EngineSettings s = engine_settings<Ops>(plan, mesh);  // as the run builds that rank
  const GPTConfig& cfg = s.model;
  const int B = s.micro_batch, Tn = s.seq_len;
  const ParamLayout layout = s.layout();
  const Partition part(layout, s.zero);

  Estimate e;
  e.plan_source = plan.source;
  e.stage = plan.zero.stage;
  e.world = world;
  e.micro_batch = B;
  e.seq_len = Tn;
  e.num_params = layout.num_params();
  e.padded_params = layout.total();
  e.backend_tier = Ops::tier;
  // bf16 with the CPU op table: backend "cpu-bf16" (train/backend_choice.cpp), the CPU's tables plus
  // the bf16 copies of the products' operands.
  const bool cpu_bf16 = Ops::tier == Tier::host && plan.device != "cuda" && plan.precision.compute == "bf16";
  e.backend_name = cpu_bf16 ? "cpu-bf16" : Ops::name;
  e.cpu_for_gpu_plan = Ops::tier == Tier::host && plan.device == "cuda";

  const std::string what = "model: per-rank memory (bytes)";
  auto count = [&](Category c, const std::string& name, Tier t, size_t bytes) {
    e.buffers.push_back({c, name, t, bytes});
    e.by_tier_category[{t, c}] = checked_add(e.by_tier_category[{t, c}], bytes, what);
    e.tier_totals[t] = checked_add(e.tier_totals[t], bytes, what);
  };
  // The store's own list (zero/store.h): what a run allocates, buffer for buffer, in its tier.
  for (const StateBuffer& b : list_model_state(layout, part, s.types, swap_spec_of(plan.offload, 0))) {
    count(b.cat, b.name(), b.tier, b.bytes());
    if (b.id == StateId::host_mirrors) e.comm.pinned_staging += b.bytes();
  }
  if (Ops::tier == Tier::device) {
    e.comm.backend = s.types.host_mirror_comm ? "mpi" : "nccl";
    StateTypes staged = s.types;
    staged.host_mirror_comm = true;
    for (const StateBuffer& b : list_model_state(layout, part, staged, swap_spec_of(plan.offload, 0)))
      if (b.id == StateId::host_mirrors) e.comm.host_staged_pinned += b.bytes();
    if (!s.types.host_mirror_comm) estimate_nccl_internal(e.comm, world);
  }
  const size_t act = GPT<Ops>::activation_bytes(cfg, B, Tn, s.recompute, s.activation_slots);
  e.pipeline = mesh.pipeline;
  e.pipeline_stage = mesh.stage;
  e.first_layer = cfg.layer0;
  e.layers = cfg.L;
  for (int c = 0; c < cfg.chunks(); ++c)
    e.layer_runs.emplace_back(cfg.whole_layer(cfg.chunk_begin(c)), cfg.chunk_begin(c + 1) - cfg.chunk_begin(c));
  e.activation_slots = s.activation_slots;
  count(Category::activations, "activations and activation gradients", Ops::tier, act);
  if (cpu_bf16) count(Category::activations, "bf16 copies of product operands", Tier::host, cpu_bf16_workspace_bytes(cfg, B, Tn));
  if (s.pipe_messages > 0)
    count(Category::comm, "pipeline messages (stage boundaries on NCCL)", Tier::device,
          size_t(s.pipe_messages) * s.pipe_message_bytes);
  e.bytes_per_step = part.bytes_per_step();
  e.bytes_formula = part.bytes_formula();
  e.shard_group = mesh.shard;
  e.replicas = mesh.replicas;
  e.bytes_shard_group = part.bytes_per_step_shard_group();
  e.bytes_replicas = part.bytes_per_step_replicas();
  e.tensor = mesh.tensor;
  e.data_world = mesh.world;
  e.bytes_tensor = uint64_t(plan.batch.grad_accum) * tensor_bytes_per_micro_step(cfg, B, Tn, s.recompute,
                                                                                 int(sizeof(typename Ops::T)));
  e.bytes_per_step = checked_add(e.bytes_per_step, e.bytes_tensor, "zero: bytes sent per step");
  if (mesh.tensor > 1) {
    GPTConfig sp = cfg, no_sp = cfg;
    sp.sp = true;
    no_sp.sp = false;
    if (plan.model.seq_len % mesh.tensor == 0) e.activations_sp = GPT<Ops>::activation_bytes(sp, B, Tn, s.recompute);
    e.activations_no_sp = GPT<Ops>::activation_bytes(no_sp, B, Tn, s.recompute);
  }

  RecomputeEstimate& r = e.recompute;
  r.policy = plan.recompute.policy;
  r.every = plan.recompute.every;
  r.activation_bytes = act;
  r.classifier_rows = GPT<Ops>::classifier_rows(cfg, B, Tn, s.recompute);
  r.logits_bytes = size_t(r.classifier_rows) * size_t(cfg.vocab()) * sizeof(typename Ops::T);
  for (const char* p : {"none", "selective", "block"}) {
    r.by_policy[p] = GPT<Ops>::activation_bytes(cfg, B, Tn, Recompute::from(p, 1, s.recompute.classifier_chunk));
    r.by_policy_whole_logits[p] = GPT<Ops>::activation_bytes(cfg, B, Tn, Recompute::from(p, 1, 0));
  }
  r.forward_flops = GPT<Ops>::forward_flops(cfg, B, Tn);
  r.extra_forward_flops = GPT<Ops>::recompute_flops(cfg, B, Tn, s.recompute, layout.embedding_units());
  return e;
}

}  // namespace

Estimate estimate_plan(const Plan& plan, int world, int ranks_per_host) {
  ZT_REQUIRE(world >= 1 && world <= kMaxWorld, "--world must be between 1 and " << kMaxWorld << ", got " << world);
#if ZT_HAVE_CUDA
  // device "cuda": the CUDA backend's buffers (precision "auto" is bf16 there, as choose_backend runs it).
  if (plan.device == "cuda")
    return plan.precision.compute == "fp32" ? estimate_for<CudaOps<float>>(plan, world, ranks_per_host)
                                            : estimate_for<CudaOps<bf16>>(plan, world, ranks_per_host);
#endif
  Estimate e = estimate_for<CpuOps<float>>(plan, world, ranks_per_host);  // the CPU backend: fp32 everywhere, host memory
  // Pipeline stages hold different blocks and activations: each one's, from its first rank.
  for (int st = 0; st < e.pipeline && e.pipeline > 1; ++st)
    e.stages.push_back(estimate_for<CpuOps<float>>(plan, world, ranks_per_host, st * (world / e.pipeline)));
  return e;
}

}  // namespace zt
