// The loop (docs/design.md §3.9): run() is one step's table of contents; what each line calls
// lives in a file named for it: startup_checks, engine_assembly, checkpointing, evaluation,
// sampling, report.
#include "train/trainer.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <utility>
#include <string>
#include <vector>

#include "backend/ops_cpu.h"
#if ZT_HAVE_CUDA
#include "backend/ops_cuda.h"
#endif
#include "runtime/clock.h"
#include "runtime/trace.h"
#include "train/backend_choice.h"
#include "train/checkpointing.h"
#include "train/evaluation.h"
#include "train/pipeline_step.h"
#include "train/report.h"
#include "train/sampling.h"
#include "train/schedule.h"
#include "train/startup_checks.h"
#include "train/stop_signal.h"

namespace zt {

namespace {

template <class Ops>
class Trainer {
 public:
  using S = typename Ops::S;

  Trainer(const Plan& plan, Comm& comm, const RunControl& ctl) : plan_(plan), comm_(comm), ctl_(ctl), root_(comm.rank() == 0) {}
  ~Trainer() {
    if (tracer_ && parts_.comm) parts_.set_tracer(nullptr);  // comm_ outlives the trainer; the tracer goes first
  }

  TrainResult run() {
    setup();
    TrainResult res;
    res.steps = int(state_.step);
    const RunSection& run = plan_.run;
    const int B = plan_.batch.micro_batch, Tn = plan_.model.seq_len, accum = plan_.batch.grad_accum;
    // The ranks that read distinct batches: the data axis (a tensor group reads one, and a pipeline
    // group: zero/data_mesh.h).
    const int P = plan_.mesh.pipeline;
    const int batches = comm_.world() / (plan_.mesh.tensor * P);
    const double tokens_per_step = double(B) * Tn * accum * batches;
    std::vector<int> inputs(size_t(B) * Tn), targets(size_t(B) * Tn);
    // SIGTERM / SIGINT / SIGUSR1 end the run cleanly (stop_signal.h) when there is somewhere to save to;
    // without, SIGUSR1 is ignored with a warning.
    const StopSignals signals(!plan_.checkpoint.dir.empty(), root_);
    const auto t_start = Clock::now();
    double train_seconds = 0.0;

    const int world = comm_.world();
    const int stop = ctl_.stop_at >= 0 ? std::min(ctl_.stop_at, run.steps) : run.steps;
    // Throughput, losses and the "done" line count the steps this process runs, not the step reached.
    const int first = int(state_.step);
    if (root_ && !resume_.from.empty() && first >= run.steps)
      std::printf("nothing to do: checkpoint is at step %d = run.steps\n", first);
    for (int step = int(state_.step); step < stop; ++step) {
      const auto t0 = Clock::now();
      const double trace_t0 = tracer_ ? Tracer::now_us() : 0;
      const double lr = lr_at(step, plan_.optim.lr, plan_.optim.warmup_steps, run.steps, plan_.optim.schedule,
                              plan_.optim.min_lr_ratio);
      engine_->begin_step(step);
      if (parts_.tensor_comm) parts_.tensor_comm->begin_step(step);  // the engine's groups are the data axis's
      if (parts_.pipe_comm) parts_.pipe_comm->begin_step(step);
      if (parts_.boundary_comm && parts_.boundary_comm != parts_.pipe_comm) parts_.boundary_comm->begin_step(step);
      if (plan_.optim.grad_clip <= 0.0) engine_->update_args_known(lr);  // clip_scale is then 1
      double loss = 0.0;
      double first_micro_ms = 0;
      // Every rank's gradient is scaled by 1 / (tokens in the global batch), so the sum the
      // collectives compute is the global mean gradient.
      const S dloss = S(1.0 / (double(B) * Tn * accum * batches));
      if (parts_.pipe_comm) {
        loss = pipeline_step(step, dloss);  // the schedule's table over the stages (train/pipeline_step.h)
      } else {
        for (int micro = 0; micro < accum; ++micro) {
          data_.train->train_batch(step, micro, accum, inputs.data(), targets.data());
          check_tokens(inputs, targets, cfg_.V);
          engine_->begin_pass(micro, true);
          loss += model_->forward(inputs.data(), targets.data(), B, Tn, true, dloss) / accum;
          model_->backward();
          if (micro == 0) first_micro_ms = seconds_since(t0) * 1e3;
        }
      }
      const double backward_ms = seconds_since(t0) * 1e3;
      engine_->finish_gradients();
      if (parts_.pipe_comm) tied_embedding();
      const double gradients_ms = seconds_since(t0) * 1e3;
      if (world > 1) {  // the loss is the last stage's: world / P ranks hold it
        engine_comm_->all_reduce_sum(&loss, 1);
        loss /= world / P;
      }
      const double norm = engine_->grad_norm();
      ZT_REQUIRE(std::isfinite(loss) && std::isfinite(norm),
                 "training diverged at step " << step << ": loss " << loss << ", grad norm " << norm
                                              << " (lower optim.lr, or raise optim.warmup_steps)");
      engine_->optimizer_step(lr, clip_scale(norm, plan_.optim.grad_clip));
      dev_use_.sample();
      if (tracer_)
        tracer_->complete("step " + std::to_string(step), Tracer::kStep, trace_t0, Tracer::now_us() - trace_t0,
                          "\"step\":" + std::to_string(step) + ",\"loss\":" + std::to_string(loss));
      const CommStepStats cs = parts_.step_stats();
      const double ms = seconds_since(t0) * 1e3;
      train_seconds += ms / 1e3;
      res.add_step(step, loss, ms, first_micro_ms, backward_ms, gradients_ms, engine_->last_update_s() * 1e3);
      state_.step = step + 1;
      state_.next_sequence = int64_t(state_.step) * B * accum * batches;
      bytes_per_step_ = cs.bytes;
      if (parts_.replica_comm || parts_.tensor_comm || parts_.pipe_comm)  // the shard group's share of it
        bytes_shard_group_ = parts_.shard_comm->step_stats().bytes;
      if (parts_.replica_comm) bytes_replicas_ = parts_.replica_comm->step_stats().bytes;  // hybrid sharding
      if (parts_.tensor_comm) bytes_tensor_ = parts_.tensor_comm->step_stats().bytes;    // tensor parallelism
      if (parts_.pipe_comm)  // pipeline stages (the boundaries on their device group on NCCL)
        bytes_pipeline_ = parts_.pipe_comm->step_stats().bytes +
                          (parts_.boundary_comm != parts_.pipe_comm ? parts_.boundary_comm->step_stats().bytes : 0);
      if (root_)
        report_step(*log_, plan_, {step, loss, lr, norm, ms, tokens_per_step, cs, gradients_ms, res.update_ms.back(),
                                   train_seconds}, decorate_);
      if (end_of_step(step, res)) break;
    }
    return finish(res, first, tokens_per_step, train_seconds, t_start);
  }

 private:
  // One step's micro-batches through this pipeline stage (train/pipeline_step.h): every stage reads
  // them (the first its tokens, the last its targets). The last stage's mean loss, 0 elsewhere.
  double pipeline_step(int step, S dloss) {
    const int B = plan_.batch.micro_batch, Tn = plan_.model.seq_len, accum = plan_.batch.grad_accum;
    StepBatches b;
    b.inputs.assign(size_t(accum), std::vector<int>(size_t(B) * Tn));
    b.targets = b.inputs;
    for (int micro = 0; micro < accum; ++micro) {
      data_.train->train_batch(step, micro, accum, b.inputs[size_t(micro)].data(), b.targets[size_t(micro)].data());
      check_tokens(b.inputs[size_t(micro)], b.targets[size_t(micro)], cfg_.V);
    }
    return pipeline_train_step<Ops>(*model_, *engine_, *parts_.boundary_comm,
                                    parse_pipe_schedule("mesh.schedule", plan_.mesh.schedule), b, B, Tn, dloss,
                                    activation_slots_, parts_.device_messages(), tracer_.get());
  }
  void tied_embedding() {
    sum_tied_embedding<Ops>(*model_, *engine_, *parts_.pipe_comm);
  }

  // Evaluation, sample and checkpoint when due; true when a stop signal ends the run here (saved).
  bool end_of_step(int step, TrainResult& res) {
    const RunSection& run = plan_.run;
    const bool last = step + 1 == run.steps;
    if ((run.eval_every > 0 && (step + 1) % run.eval_every == 0) || last) {
      const double te = tracer_ ? Tracer::now_us() : 0;
      res.final_val_loss = evaluate<Ops>(*model_, *engine_, *data_.val, comm_, plan_, cfg_.V, step, log_.get(),
                                         parts_.pipe_comm);
      dev_use_.sample();
      if (tracer_) tracer_->complete("eval", Tracer::kStep, te, Tracer::now_us() - te);
    }
    if (tokenizer_ && ((run.sample_every > 0 && (step + 1) % run.sample_every == 0) || last))
      sample<Ops>(*model_, *engine_, *tokenizer_, plan_, cfg_.V, step, root_, parts_.pipe_comm);
    res.stopped = checkpoint_when_due<Ops>(comm_, plan_, state_, cfg_, run_id_, parts_, decorate_, step);
    return res.stopped;
  }

  // Final weights, the trace closed, the end state captured, the summary.
  TrainResult finish(TrainResult& res, int first, double tokens_per_step, double train_seconds, Clock::time_point t_start) {
    engine_->params_ready();  // nothing in flight past the loop (stages 1-2 all-gather)
    if (!plan_.run.final_weights.empty() && res.steps == plan_.run.steps)
      save_final_weights<Ops>(parts_, plan_, outputs_, root_);
    // A trace that cannot be written (a full disk) is reported after the run's summary is logged:
    // the training it describes is done and must not be lost with it.
    std::string trace_error;
    if (tracer_) {
      parts_.set_tracer(nullptr);
      engine_->set_tracer(nullptr);
      trace_error = close_trace(*tracer_, root_);
    }
    if (ctl_.end) {
      *ctl_.end = state_;
      capture_buffers<Ops>(*parts_.store, *ctl_.end);
    }
    const RunTotals totals{backend_name_, comm_.world(), first, seconds_since(t_start), train_seconds, tokens_per_step,
                           bytes_per_step_, engine_->max_gathered_alive(), dev_use_.to_json(),
                           bytes_shard_group_, bytes_replicas_, plan_.mesh.tensor, bytes_tensor_,
                           uint64_t(plan_.batch.grad_accum) * tensor_bytes_per_micro_step(cfg_, plan_.batch.micro_batch,
                                                                                          plan_.model.seq_len,
                                                                                          model_->recompute(),
                                                                                          int(sizeof(typename Ops::T))),
                           bytes_pipeline_};
    end_run(comm_, log_.get(), plan_, res, totals, mem_, *parts_.partition, tracer_ != nullptr, trace_error,
            outputs_.log);
    return res;
  }

  void setup() {
    const int world = comm_.world();
    if constexpr (Ops::tier == Tier::device) dev_use_.start();
    const int threads = use_rank_threads(plan_, comm_);
    const EngineSettings es = engine_settings<Ops>(plan_, DataMesh::of(plan_, world, comm_.rank(), 0));  // as `train estimate` sizes it
    cfg_ = es.model;
    activation_slots_ = es.activation_slots;

    // Everything that can refuse the plan (train/startup_checks.h). One verdict for all ranks
    // (agree_or_throw, comm.h): a refused plan prints one line rather than one per rank.
    Startup checked = check_startup(plan_, comm_, cfg_.V, GPT<Ops>::llmc_file_bytes(cfg_), Ops::tier == Tier::host);
    decorate_ = checked.decorate;
    data_ = std::move(checked.data);
    tokenizer_ = std::move(checked.tokenizer);
    outputs_ = std::move(checked.outputs);
    swap_ = std::move(checked.swap);
    agree_or_throw(comm_, checked.refusal, "refused the plan");
    const ckpt::Continuation cont = ckpt::share_start(comm_, plan_.checkpoint, outputs_.checkpoint);
    run_id_ = cont.run_id;

    parts_ = assemble_engine<Ops>(plan_, es, comm_, mem_, swap_, *data_.train);
    // Backend "cpu-bf16" (train/backend_choice.cpp): the CPU table with its products in bf16.
    if (Ops::tier == Tier::host && plan_.precision.compute == "bf16") {
      const size_t bytes = cpu_bf16_workspace_bytes(cfg_, es.micro_batch, es.seq_len);
      bf16_workspace_.memory = mem_.alloc(bytes, Tier::host, Category::activations, "bf16 copies of product operands");
      cpu::bf16::bind_workspace(bf16_workspace_.memory.data(), bytes);
      backend_name_ = "cpu-bf16";
    }
    model_ = parts_.model.get();
    engine_ = parts_.engine.get();
    engine_comm_ = parts_.comm;
    // model.init is read here (into the allocated parameters); a damaged file is still refused
    // before anything is written. A run that starts from a TrainState takes its buffers instead.
    agree_or_throw(comm_, start_state<Ops>(plan_, ctl_, cont, world, parts_, state_, resume_), "refused the plan");
    // The first write: rank 0 moves an earlier run's files aside (its traces too) before any rank
    // opens its trace (docs/traces.md).
    std::string moved;
    if (root_) moved = open_run_outputs(plan_, outputs_);
    if (!outputs_.trace.empty()) {
      if (world > 1) comm_.barrier();
      tracer_ = std::make_unique<Tracer>(outputs_.trace, comm_.rank());
      parts_.set_tracer(tracer_.get());
      engine_->set_tracer(tracer_.get());
    }
    total_load(comm_, resume_);

    if (!root_) return;
    report_start(moved, outputs_.checkpoint.note, resume_, plan_, state_.step);
    log_ = std::make_unique<MetricsLog>(outputs_.log);
    const GPTConfig all_layers = cfg_.unstaged();  // as engine_settings cut it into stages
    print_banner(plan_, {backend_name_, Ops::tier == Tier::device, world, threads, cfg_, &model_->layout(), &data_,
                         parts_.partition->buckets().size(), &swap_, &mem_,
                         plan_.mesh.pipeline > 1 ? describe_pipeline<Ops>(plan_, all_layers) : ""});
  }

  const Plan& plan_;
  Comm& comm_;
  const RunControl& ctl_;
  const bool root_;
  TrainState state_;
  GPTConfig cfg_;
  int activation_slots_ = 1;  // pipeline: micro-batches this stage holds at once (engine_settings)
  MemoryTracker mem_;
  // cpu-bf16's workspace, bound while the run lasts (kernels/matmul_bf16.h).
  struct BoundWorkspace {
    Allocation memory;
    ~BoundWorkspace() {
      if (memory.data()) cpu::bf16::bind_workspace(nullptr, 0);
    }
  } bf16_workspace_;
  const char* backend_name_ = Ops::name;
  DataLoaders data_;
  std::unique_ptr<Tokenizer> tokenizer_;
  EngineParts<Ops> parts_;  // model, partition, store, the engine's comm, engine (train/engine_assembly.h)
  GPT<Ops>* model_ = nullptr;          // parts_.model
  ZeroEngine<Ops>* engine_ = nullptr;  // parts_.engine
  Comm* engine_comm_ = nullptr;        // parts_.comm: comm_, or the CUDA backend's NCCL / host-mirror comm over it
  std::unique_ptr<Tracer> tracer_;     // run.trace; null = off
  uint64_t bytes_per_step_ = 0;
  uint64_t bytes_shard_group_ = 0, bytes_replicas_ = 0;  // hybrid sharding: bytes_per_step_ by group
  uint64_t bytes_pipeline_ = 0;                          // pipeline stages: bytes_per_step_'s share
  uint64_t bytes_tensor_ = 0;                             // tensor parallelism: the tensor group's share
  std::unique_ptr<MetricsLog> log_;
  RunOutputs outputs_;  // rank 0: all; the others: their trace
  offload::SwapSpec swap_;  // offload.optimizer / offload.params "nvme" (train/offload_setup.h); disabled otherwise
  bool decorate_ = false;
  Resume resume_;        // the checkpoint this run continues (from "" = none)
  uint64_t run_id_ = 0;  // its lineage (checkpoint/checkpoint_dir.h): recorded in every checkpoint it saves
  DeviceMemory dev_use_;
};

template <class Ops>
TrainResult run_trainer(const Plan& plan, Comm& comm, const RunControl& ctl) {
  Trainer<Ops> trainer(plan, comm, ctl);
  try {
    return trainer.run();
  } catch (const OutOfMemory& e) {
    throw Error(std::string(e.what()) + "next step: " + next_memory_step(plan, comm.world()));
  }
}

}  // namespace

TrainResult train(const Plan& plan, Comm& comm, const RunControl& ctl) {
  const std::string backend = choose_backend(plan, comm.world());
  // cpu-bf16: the same table; the Trainer binds the bf16 workspace that routes its products to oneDNN.
  if (backend == "cpu-fp32" || backend == "cpu-bf16") return run_trainer<CpuOps<float>>(plan, comm, ctl);
#if ZT_HAVE_CUDA
  select_gpu(comm);
  if (backend == "cuda-fp32") return run_trainer<CudaOps<float>>(plan, comm, ctl);
  return run_trainer<CudaOps<bf16>>(plan, comm, ctl);
#else
  throw Error("device: \"cuda\" but this build has no CUDA backend");
#endif
}

}  // namespace zt
