#include "train/report.h"

#include <algorithm>
#include <cstdio>
#include <string>

#include "runtime/device.h"
#include "runtime/error.h"
#include "train/backend_choice.h"
#include "train/offload_setup.h"
#include "zero/data_mesh.h"
#if ZT_HAVE_CUDA
#include "runtime/cuda_context.h"
#endif

namespace zt {

void DeviceMemory::start() {
  on_device = true;
#if ZT_HAVE_CUDA
  (void)cuda::Context::get();  // the context and its workspace exist before the first count
#endif
  total = device::total_bytes();
  free_at_start = free_min = device::free_bytes();
}

void DeviceMemory::sample() {
  if (on_device) free_min = std::min(free_min, device::free_bytes());
}

nlohmann::json DeviceMemory::to_json() const {
  if (!on_device) return nullptr;
  return {{"total_bytes", total},
          {"free_at_start_bytes", free_at_start},
          {"used_peak_bytes", free_at_start - std::min(free_at_start, free_min)}};
}

void print_banner(const Plan& plan, const Banner& b) {
  const int world = b.world, B = plan.batch.micro_batch, Tn = plan.model.seq_len;
  const GPTConfig& cfg = b.cfg;
  if (b.on_device) std::printf("device: %s\n", device::describe().c_str());
  std::printf("backend %s, %d rank(s) x %d threads | model L=%d NH=%d C=%d T=%d V=%d (Vp=%d): %.2fM parameters in %d units\n",
              b.backend, world, b.threads, cfg.L, cfg.NH, cfg.C, cfg.maxT, cfg.V, cfg.Vp,
              double(b.layout->num_params()) / 1e6, b.layout->num_units());
  std::printf("data: %zu train tokens (%zu sequences) in %zu file(s), %zu val tokens\n", b.data->train->num_tokens(),
              b.data->train->num_sequences(), b.data->train->files().size(), b.data->val->num_tokens());
  const DataMesh mesh = DataMesh::of(plan, world, 0, 0);  // "host" is a number by now (record_shard_group)
  if (mesh.tensor == 1 && mesh.pipeline == 1)
    std::printf("batch: micro_batch %d x seq_len %d x grad_accum %d x world %d = %lld tokens per step\n", B, Tn,
                plan.batch.grad_accum, world, (long long)B * Tn * plan.batch.grad_accum * world);
  else  // a tensor group reads one batch, and a pipeline group: the data axis counts
    std::printf("batch: micro_batch %d x seq_len %d x grad_accum %d x data axis %d = %lld tokens per step\n", B, Tn,
                plan.batch.grad_accum, mesh.world, (long long)B * Tn * plan.batch.grad_accum * mesh.world);
  std::printf("zero: stage %d, %s, %zu gradient bucket(s)\n", plan.zero.stage,
              plan.zero.overlap_comm ? "overlapped bucketed communication" : "naive blocking per-unit communication",
              b.buckets);
  if (mesh.tensor > 1)
    std::printf("mesh: tensor parallelism, %d tensor groups of %d ranks (each holds 1/%d of every block and of the "
                "vocabulary; parameters above are one rank's)%s\n",
                world / mesh.tensor, mesh.tensor, mesh.tensor,
                plan.mesh.sequence_parallel ? ", sequence parallel" : "");
  if (!b.pipeline.empty()) std::printf("mesh: %s\n", b.pipeline.c_str());
  if (mesh.hybrid()) std::printf("zero: hybrid sharding, %s\n", describe_mesh(mesh).c_str());
  std::printf("comm: %s\n", describe_comm_backend(plan.comm.backend, b.on_device).c_str());
  if (b.swap->enabled()) std::printf("%s\n", describe_offload(*b.swap, plan, world, !b.on_device).c_str());
  std::printf("\nmemory per rank (tracked):\n%s\n", b.mem->table(false).c_str());
  std::fflush(stdout);
}

std::string close_trace(Tracer& tracer, bool root) {
  try {
    tracer.close();
    if (root) std::printf("trace written to %s (one file per rank; scripts/trace_merge joins them)\n",
                          tracer.path().c_str());
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

void report_step(MetricsLog& log, const Plan& plan, const StepReport& s, bool tty) {
  const int step = s.step, steps = plan.run.steps;
  const double ms = s.ms;
  log.write({{"step", step + 1}, {"loss", s.loss}, {"lr", s.lr}, {"grad_norm", s.norm}, {"ms", ms},
             {"tokens_per_s", s.tokens_per_step / (ms / 1e3)}, {"comm_bytes", s.comm.bytes},
             {"comm_wait_ms", s.comm.wait_s * 1e3}, {"comm_host_waits", s.comm.host_waits},
             {"gradients_ms", s.gradients_ms}, {"update_ms", s.update_ms}});
  const double eta = s.train_seconds / (step + 1) * (steps - step - 1);
  if (step % plan.run.log_every == 0 || step + 1 == steps) {
    if (tty) std::printf("\r\033[K");
    std::printf("step %5d/%d | loss %.4f | lr %.2e | norm %.3f | %.1f ms | %.0f tok/s%s\n", step + 1, steps, s.loss,
                s.lr, s.norm, ms, s.tokens_per_step / (ms / 1e3), tty ? (" | eta " + format_duration(eta)).c_str() : "");
  } else if (tty) {
    std::printf("\r\033[Kstep %d/%d | loss %.4f | eta %s", step + 1, steps, s.loss, format_duration(eta).c_str());
  }
  std::fflush(stdout);
}

void end_run(Comm& comm, MetricsLog* log, const Plan& plan, const TrainResult& res, const RunTotals& t,
             const MemoryTracker& mem, const Partition& partition, bool traced, const std::string& trace_error,
             const std::string& log_path) {
  const std::vector<uint64_t> rss = comm.all_gather_u64(process_peak_rss_bytes());
  // Each rank's tracked peak activations in the backend's tier: pipeline stages hold different ones.
  const Tier tier = std::string(t.backend).rfind("cuda", 0) == 0 ? Tier::device : Tier::host;
  const std::vector<uint64_t> acts = comm.all_gather_u64(mem.peak(tier, Category::activations));
  const std::vector<uint64_t> tracked = comm.all_gather_u64(mem.peak_total(tier));
  if (!log) {
    if (traced) comm.barrier();  // rank 0 has logged the summary
    ZT_REQUIRE(trace_error.empty(), trace_error << " (training finished; rank 0 logged the summary)");
    return;
  }
  const int ran = int(res.losses.size());
  const nlohmann::json none;  // null in the summary: nothing of the kind happened in this process
  if (ran > 0) {
    std::printf("\ndone: %d steps", ran);
    if (t.first > 0) std::printf(" (resumed at step %d)", t.first);
    std::printf(" in %s (%.0f tokens/s while training); final loss %.4f", format_duration(t.wall_s).c_str(),
                t.tokens_per_step * ran / t.train_seconds, res.final_loss);
    if (res.final_val_loss >= 0) std::printf(", val loss %.4f", res.final_val_loss);
    std::printf("\n");
  }
  std::printf("\nmemory per rank (tracked, current and peak):\n%s", mem.table(true).c_str());
  if (t.world > 1 && t.bytes_pipeline > 0)
    std::printf("communication: %s sent per rank per step: %s on the pipeline group (stage boundaries, the tied "
                "embedding's gradient), %s on the tensor group, %s on the data axis (%s)\n",
                format_bytes(double(t.bytes_per_step)).c_str(), format_bytes(double(t.bytes_pipeline)).c_str(),
                format_bytes(double(t.bytes_tensor)).c_str(),
                format_bytes(double(t.bytes_per_step - t.bytes_tensor - t.bytes_pipeline)).c_str(),
                partition.bytes_formula().c_str());
  else if (t.world > 1 && t.tensor > 1)
    std::printf("communication: %s sent per rank per step: %s on the tensor group (activations, docs/tensor.md), "
                "%s on the data axis (%s)\n",
                format_bytes(double(t.bytes_per_step)).c_str(), format_bytes(double(t.bytes_tensor)).c_str(),
                format_bytes(double(t.bytes_per_step - t.bytes_tensor)).c_str(), partition.bytes_formula().c_str());
  else if (t.world > 1)
    std::printf("communication: %s sent per rank per step (%s)\n", format_bytes(double(t.bytes_per_step)).c_str(),
                partition.bytes_formula().c_str());
  log->write({{"summary",
               {{"steps", res.steps},
                {"steps_run", ran},
                {"final_loss", ran > 0 ? nlohmann::json(res.final_loss) : none},
                {"final_val_loss", res.final_val_loss >= 0 ? nlohmann::json(res.final_val_loss) : none},
                {"tokens_per_s", ran > 0 ? nlohmann::json(t.tokens_per_step * ran / t.train_seconds) : none},
                {"wall_s", t.wall_s},
                {"peak_memory_bytes", mem.peak_json()},
                {"peak_rss_bytes", process_peak_rss_bytes()},  // rank 0's VmHWM: tracked + untracked
                {"peak_rss_bytes_per_rank", rss},
                {"peak_activation_bytes_per_rank", acts},
                {"peak_tracked_bytes_per_rank", tracked},
                {"pipeline", plan.mesh.pipeline},
                {"pipeline_schedule", plan.mesh.schedule},
                {"bytes_sent_per_step", t.bytes_per_step},
                {"bytes_sent_per_step_theory", partition.bytes_per_step() + t.bytes_tensor_theory},
                {"shard_group", partition.config().world},
                {"replicas", partition.config().replicas},
                {"bytes_shard_group_per_step", partition.config().replicas > 1 || t.tensor > 1 || plan.mesh.pipeline > 1
                                                   ? t.bytes_shard_group
                                                   : t.bytes_per_step},
                {"bytes_pipeline_group_per_step", t.bytes_pipeline},
                {"bytes_shard_group_per_step_theory", partition.bytes_per_step_shard_group()},
                {"bytes_replicate_group_per_step", t.bytes_replicas},
                {"bytes_replicate_group_per_step_theory", partition.bytes_per_step_replicas()},
                {"tensor", t.tensor},
                {"bytes_tensor_group_per_step", t.bytes_tensor},
                {"bytes_tensor_group_per_step_theory", t.bytes_tensor_theory},
                {"max_gathered_units", t.max_gathered_units},
                {"device_memory", t.device_memory},
                {"world", t.world},
                {"comm_backend", plan.comm.backend},
                {"zero_stage", plan.zero.stage},
                {"backend", t.backend}}}});
  if (traced) comm.barrier();  // the other ranks report a lost trace only now
  ZT_REQUIRE(trace_error.empty(), trace_error << " (training finished; its summary is in " << log_path << ")");
}

}  // namespace zt
