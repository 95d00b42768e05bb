// What the loop tells a person and the metrics log (docs/running.md): the start-up banner, the
// line and log record of each step, and the run's summary (the "summary" record tests and
// scripts/compare read). Rank 0 alone reports.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "comm/comm.h"
#include "model/config.h"
#include "model/layout.h"
#include "offload/swap_file.h"
#include "plan/plan.h"
#include "runtime/memory.h"
#include "runtime/trace.h"
#include "train/progress.h"
#include "train/startup_checks.h"
#include "train/trainer.h"
#include "zero/partition.h"

namespace zt {

// Device memory as the CUDA runtime counts it (cudaMemGetInfo), beside the tracker's device tier:
// free once the context exists (the driver's own memory and cuBLASLt's workspace already taken),
// then the lowest free seen after any step. The difference is what this run allocated, tracked or
// not, rounded up by the allocator; other processes on the same GPU count too.
struct DeviceMemory {
  bool on_device = false;  // the CUDA backend; otherwise nothing is counted and the summary says null
  size_t total = 0, free_at_start = 0, free_min = 0;
  void start();  // the CUDA backend: creates the context, then counts
  void sample();
  nlohmann::json to_json() const;
};

// The lines printed once the run's parts exist, before the first step.
struct Banner {
  const char* backend = "";  // Ops::name
  bool on_device = false;
  int world = 1, threads = 1;
  GPTConfig cfg;
  const ParamLayout* layout = nullptr;
  const DataLoaders* data = nullptr;
  size_t buckets = 0;
  const offload::SwapSpec* swap = nullptr;
  const MemoryTracker* mem = nullptr;
  std::string pipeline;  // describe_pipeline (train/pipeline_step.h); "" without pipeline stages
};
void print_banner(const Plan& plan, const Banner& b);

// Closes the run's trace; rank 0 (`root`) says where it went. Returns the error of a trace that
// could not be written ("" = none), reported once the summary is logged.
std::string close_trace(Tracer& tracer, bool root);

// One optimizer step as the loop measured it on rank 0.
struct StepReport {
  int step = 0;  // the step index (0-based); the line shows step + 1
  double loss = 0, lr = 0, norm = 0, ms = 0;
  double tokens_per_step = 0;
  CommStepStats comm;
  double gradients_ms = 0, update_ms = 0;
  double train_seconds = 0;  // the steps this process ran so far, for the ETA
};
// The metrics record of every step; the printed line every run.log_every steps and at the last
// (with `tty`, an ETA line rewritten in place between them).
void report_step(MetricsLog& log, const Plan& plan, const StepReport& s, bool tty);

// The run as a whole, for the "done" line and the summary record.
struct RunTotals {
  const char* backend = "";  // Ops::name
  int world = 1;
  int first = 0;  // the step this process started at (> 0: resumed)
  double wall_s = 0, train_seconds = 0, tokens_per_step = 0;
  uint64_t bytes_per_step = 0;  // the last step's bytes sent by this rank
  int max_gathered_units = 0;
  nlohmann::json device_memory;
  // Hybrid sharding (zero/data_mesh.h): bytes_per_step within the shard group and across replicas.
  uint64_t bytes_shard_group = 0, bytes_replicas = 0;
  // Tensor parallelism (model/tensor_parallel.h): ranks per tensor group, bytes_per_step's share on
  // the tensor group, and the model's formula for it (tensor_bytes_per_micro_step x grad_accum).
  int tensor = 1;
  uint64_t bytes_tensor = 0, bytes_tensor_theory = 0;
  // Pipeline parallelism (train/pipeline_step.h): bytes_per_step's share on the pipeline group (the
  // stage boundaries' activations and gradients, the tied embedding's gradient sum).
  uint64_t bytes_pipeline = 0;
};
// Collective, the run's last words: rank 0 (the one with a `log`) prints the "done" line and the
// memory table and logs the summary, with every rank's VmHWM (tracked + untracked, for tests that
// hold each rank to the estimate). `trace_error` (close_trace) is thrown after the summary is
// logged: the training it describes is done and must not be lost with it. `traced`: run.trace is
// on (the ranks then meet once more, so that the others report a lost trace only after rank 0 has
// logged); `log_path`: where rank 0's summary is.
void end_run(Comm& comm, MetricsLog* log, const Plan& plan, const TrainResult& res, const RunTotals& t,
             const MemoryTracker& mem, const Partition& partition, bool traced, const std::string& trace_error,
             const std::string& log_path);

}  // namespace zt
