#include "train/trainer.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <sstream>
#include <utility>
#include <vector>

#include <cblas.h>
#include <omp.h>

#include "data/loader.h"
#include "data/tokenizer.h"
#include "model/gpt.h"
#include "backend/ops_cpu.h"
#include "checkpoint/state_io.h"
#if ZT_HAVE_CUDA
#include "backend/ops_cuda.h"
#include "runtime/cuda_context.h"
#include "comm/nccl_comm.h"
#include "comm/host_mirror_comm.h"
#endif
#include "runtime/device.h"
#include "runtime/error.h"
#include "runtime/launcher.h"
#include "runtime/memory.h"
#include "runtime/support.h"
#include "runtime/trace.h"
#include "train/backend_choice.h"
#include "train/offload_setup.h"
#include "train/outputs.h"
#include "train/progress.h"
#include "train/schedule.h"
#include "train/state.h"
#include "train/stop_signal.h"
#include "zero/engine.h"
#include "zero/engine_settings.h"
#include "zero/estimate.h"
#include "zero/partition.h"
#include "zero/store.h"

namespace zt {

namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// Small deterministic RNG for sampling (xorshift64*), independent of the standard library.
struct SampleRng {
  uint64_t s;
  double uniform() {
    s ^= s >> 12; s ^= s << 25; s ^= s >> 27;
    return double((s * 0x2545F4914F6CDD1Dull) >> 11) * 0x1.0p-53;
  }
};

template <class Ops>
class Trainer {
 public:
  using T = typename Ops::T;
  using S = typename Ops::S;

  Trainer(const Plan& plan, Comm& comm, const RunControl& ctl) : plan_(plan), comm_(comm), ctl_(ctl), root_(comm.rank() == 0) {}
  ~Trainer() {
    if (tracer_) engine_comm_->set_tracer(nullptr);  // comm_ outlives the trainer
  }

  TrainResult run() {
    setup();
    TrainResult res;
    res.steps = int(state_.step);
    const RunSection& run = plan_.run;
    const int B = plan_.batch.micro_batch, Tn = plan_.model.seq_len, accum = plan_.batch.grad_accum;
    const double tokens_per_step = double(B) * Tn * accum * comm_.world();
    std::vector<int> inputs(size_t(B) * Tn), targets(size_t(B) * Tn);
    const bool tty = decorate_;
    // SIGTERM / SIGINT / SIGUSR1 end the run cleanly (stop_signal.h) when there is somewhere to save to;
    // without, SIGUSR1 is ignored with a warning.
    const StopSignals signals(!plan_.checkpoint.dir.empty(), root_);
    const auto t_start = Clock::now();
    double train_seconds = 0.0;

    const int world = comm_.world();
    const int stop = ctl_.stop_at >= 0 ? std::min(ctl_.stop_at, run.steps) : run.steps;
    // Throughput, losses and the "done" line count the steps this process runs, not the step reached.
    const int first = int(state_.step);
    if (root_ && !resume_from_.empty() && first >= run.steps)
      std::printf("nothing to do: checkpoint is at step %d = run.steps\n", first);
    // Stages 1-2 with overlap: each step's lookup is prepared ahead of the parameter all-gathers by
    // the step before (ZeroEngine::prepare_lookup), the first one here; the last step prepares one
    // that no forward uses, so that every step sends the same bytes.
    std::vector<int> next_inputs(inputs.size()), next_targets(inputs.size());
    auto prepare_lookup = [&](int step) {
      if (!engine_->lookup_preparable()) return false;  // no batch loaded for nothing
      loader_->train_batch(step, 0, accum, next_inputs.data(), next_targets.data());
      return engine_->prepare_lookup(next_inputs.data(), B, Tn);
    };
    if (state_.step < stop && prepare_lookup(int(state_.step))) engine_->params_ready();  // before begin_step's count
    for (int step = int(state_.step); step < stop; ++step) {
      const auto t0 = Clock::now();
      const double trace_t0 = tracer_ ? Tracer::now_us() : 0;
      const double lr = lr_at(step, plan_.optim.lr, plan_.optim.warmup_steps, run.steps, plan_.optim.schedule,
                              plan_.optim.min_lr_ratio);
      engine_->begin_step(step);
      if (plan_.optim.grad_clip <= 0.0) engine_->update_args_known(lr);  // clip_scale is then 1
      double loss = 0.0;
      double first_micro_ms = 0;
      for (int micro = 0; micro < accum; ++micro) {
        loader_->train_batch(step, micro, accum, inputs.data(), targets.data());
        check_tokens(inputs, targets);
        // Every rank's gradient is scaled by 1 / (tokens in the global batch), so the sum the
        // collectives compute is the global mean gradient.
        const S dloss = S(1.0 / (double(B) * Tn * accum * world));
        engine_->begin_pass(micro, true);
        loss += model_->forward(inputs.data(), targets.data(), B, Tn, true, dloss) / accum;
        model_->backward();
        if (micro == 0) first_micro_ms = seconds_since(t0) * 1e3;
      }
      const double backward_ms = seconds_since(t0) * 1e3;
      engine_->finish_gradients();
      const double gradients_ms = seconds_since(t0) * 1e3;
      if (world > 1) {
        engine_comm_->all_reduce_sum(&loss, 1);
        loss /= world;
      }
      const double norm = engine_->grad_norm();
      ZT_REQUIRE(std::isfinite(loss) && std::isfinite(norm),
                 "training diverged at step " << step << ": loss " << loss << ", grad norm " << norm
                                              << " (lower optim.lr, or raise optim.warmup_steps)");
      prepare_lookup(step + 1);
      engine_->optimizer_step(lr, clip_scale(norm, plan_.optim.grad_clip));
      sample_device_memory();
      if (tracer_)
        tracer_->complete("step " + std::to_string(step), Tracer::kStep, trace_t0, Tracer::now_us() - trace_t0,
                          "\"step\":" + std::to_string(step) + ",\"loss\":" + std::to_string(loss));
      const CommStepStats cs = engine_comm_->step_stats();
      const double ms = seconds_since(t0) * 1e3;
      train_seconds += ms / 1e3;
      res.steps = step + 1;
      res.final_loss = loss;
      res.losses.push_back(loss);
      res.step_ms.push_back(ms);
      res.first_micro_ms.push_back(first_micro_ms);
      res.backward_ms.push_back(backward_ms);
      res.gradients_ms.push_back(gradients_ms);
      res.update_ms.push_back(engine_->last_update_s() * 1e3);
      state_.step = step + 1;
      state_.next_sequence = int64_t(state_.step) * B * accum * world;
      bytes_per_step_ = cs.bytes;

      if (root_) {
        log_->write({{"step", step + 1}, {"loss", loss}, {"lr", lr}, {"grad_norm", norm}, {"ms", ms},
                     {"tokens_per_s", tokens_per_step / (ms / 1e3)}, {"comm_bytes", cs.bytes},
                     {"comm_wait_ms", cs.wait_s * 1e3}, {"comm_host_waits", cs.host_waits},
                     {"gradients_ms", gradients_ms}, {"update_ms", engine_->last_update_s() * 1e3}});
        const double eta = train_seconds / (step + 1) * (run.steps - step - 1);
        if (step % run.log_every == 0 || step + 1 == run.steps) {
          if (tty) std::printf("\r\033[K");
          std::printf("step %5d/%d | loss %.4f | lr %.2e | norm %.3f | %.1f ms | %.0f tok/s%s\n", step + 1, run.steps,
                      loss, lr, norm, ms, tokens_per_step / (ms / 1e3),
                      tty ? (" | eta " + format_duration(eta)).c_str() : "");
        } else if (tty) {
          std::printf("\r\033[Kstep %d/%d | loss %.4f | eta %s", step + 1, run.steps, loss, format_duration(eta).c_str());
        }
        std::fflush(stdout);
      }

      const bool last = step + 1 == run.steps;
      if ((run.eval_every > 0 && (step + 1) % run.eval_every == 0) || last) {
        const double te = tracer_ ? Tracer::now_us() : 0;
        res.final_val_loss = evaluate(step);
        sample_device_memory();
        if (tracer_) tracer_->complete("eval", Tracer::kStep, te, Tracer::now_us() - te);
      }
      if (tokenizer_ && ((run.sample_every > 0 && (step + 1) % run.sample_every == 0) || last)) sample(step);
      const int every = plan_.checkpoint.every;
      std::string stop = plan_.checkpoint.dir.empty() ? "" : StopSignals::agree(comm_);
      if ((every > 0 && ((step + 1) % every == 0 || last)) || !stop.empty()) {
        engine_->params_ready();  // the parameter all-gather of stages 1-2 may still be in flight
        save_checkpoint();
        // A signal that came during a periodic save makes it the last: another step and a second
        // save would double the time a scheduler's KillWait must allow.
        if (stop.empty()) stop = StopSignals::agree(comm_);
      }
      if (!stop.empty()) {
        res.stopped = true;
        if (root_) std::printf("stopped by %s after step %d (checkpoint saved; checkpoint.resume \"auto\" continues)\n",
                               stop.c_str(), step + 1);
        break;
      }
    }
    engine_->params_ready();  // nothing in flight past the loop (stages 1-2 all-gather)
    if (!plan_.run.final_weights.empty() && res.steps == run.steps) save_final_weights();
    // A trace that cannot be written (a full disk) is reported after the run's summary is logged:
    // the training it describes is done and must not be lost with it.
    std::string trace_error;
    if (tracer_) {
      engine_comm_->set_tracer(nullptr);
      engine_->set_tracer(nullptr);
      try {
        tracer_->close();
        if (root_) std::printf("trace written to %s (one file per rank; scripts/trace_merge joins them)\n",
                               tracer_->path().c_str());
      } catch (const Error& e) {
        trace_error = e.what();
      }
    }
    if (ctl_.end) {
      *ctl_.end = state_;
      capture_buffers<Ops>(*store_, *ctl_.end);
    }

    const double wall = seconds_since(t_start);
    // Every rank's VmHWM (tracked + untracked), for tests that hold each rank to the estimate.
    const std::vector<uint64_t> rss = comm_.all_gather_u64(process_peak_rss_bytes());
    if (!root_) {
      if (tracer_) comm_.barrier();  // rank 0 has logged the summary
      ZT_REQUIRE(trace_error.empty(), trace_error << " (training finished; rank 0 logged the summary)");
      return res;
    }
    const int ran = int(res.losses.size());
    const nlohmann::json none;  // null in the summary: nothing of the kind happened in this process
    if (ran > 0) {
      std::printf("\ndone: %d steps", ran);
      if (first > 0) std::printf(" (resumed at step %d)", first);
      std::printf(" in %s (%.0f tokens/s while training); final loss %.4f", format_duration(wall).c_str(),
                  tokens_per_step * ran / train_seconds, res.final_loss);
      if (res.final_val_loss >= 0) std::printf(", val loss %.4f", res.final_val_loss);
      std::printf("\n");
    }
    std::printf("\nmemory per rank (tracked, current and peak):\n%s", mem_.table(true).c_str());
    if (comm_.world() > 1)
      std::printf("communication: %s sent per rank per step (%s)\n", format_bytes(double(bytes_per_step_)).c_str(),
                  partition_->bytes_formula().c_str());
    log_->write({{"summary",
                  {{"steps", res.steps},
                   {"steps_run", ran},
                   {"final_loss", ran > 0 ? nlohmann::json(res.final_loss) : none},
                   {"final_val_loss", res.final_val_loss >= 0 ? nlohmann::json(res.final_val_loss) : none},
                   {"tokens_per_s", ran > 0 ? nlohmann::json(tokens_per_step * ran / train_seconds) : none},
                   {"wall_s", wall},
                   {"peak_memory_bytes", mem_.peak_json()},
                   {"peak_rss_bytes", process_peak_rss_bytes()},  // rank 0's VmHWM: tracked + untracked
                   {"peak_rss_bytes_per_rank", rss},
                   {"bytes_sent_per_step", bytes_per_step_},
                   {"bytes_sent_per_step_theory", partition_->bytes_per_step()},
                   {"max_gathered_units", engine_->max_gathered_alive()},
                   {"device_memory", device_memory_json()},
                   {"world", comm_.world()},
                   {"comm_backend", plan_.comm.backend},
                   {"zero_stage", plan_.zero.stage},
                   {"backend", Ops::name}}}});
    if (tracer_) comm_.barrier();  // the other ranks report a lost trace only now
    ZT_REQUIRE(trace_error.empty(), trace_error << " (training finished; its summary is in " << outputs_.log << ")");
    return res;
  }

 private:
  // Device memory as the CUDA runtime counts it (cudaMemGetInfo), beside the tracker's device tier:
  // free once the context exists (the driver's own memory and cuBLASLt's workspace already taken),
  // then the lowest free seen after any step. The difference is what this run allocated, tracked or
  // not, rounded up by the allocator; other processes on the same GPU count too.
  struct DeviceUse {
    size_t total = 0, free_at_start = 0, free_min = 0;
  };
  DeviceUse dev_use_;
  void sample_device_memory() {
    if constexpr (Ops::tier == Tier::device) dev_use_.free_min = std::min(dev_use_.free_min, device::free_bytes());
  }
  nlohmann::json device_memory_json() const {
    if (Ops::tier != Tier::device) return nullptr;
    return {{"total_bytes", dev_use_.total},
            {"free_at_start_bytes", dev_use_.free_at_start},
            {"used_peak_bytes", dev_use_.free_at_start - std::min(dev_use_.free_at_start, dev_use_.free_min)}};
  }

  void setup() {
    const int world = comm_.world();
    if constexpr (Ops::tier == Tier::device) {
#if ZT_HAVE_CUDA
      (void)cuda::Context::get();  // the context and its workspace exist before the first count
#endif
      dev_use_.total = device::total_bytes();
      dev_use_.free_at_start = dev_use_.free_min = device::free_bytes();
    }
    // The CPUs the launcher gave this rank (runtime/launcher.h), not the whole host.
    const int threads = plan_.run.threads > 0 ? plan_.run.threads
                                              : threads_per_rank(this_launch(), affinity_cpus(), comm_.local_world());
    omp_set_num_threads(threads);
    openblas_set_num_threads(threads);

    const ModelSection& m = plan_.model;
    const EngineSettings es = engine_settings<Ops>(plan_, world, comm_.rank());  // as `train estimate` sizes it
    cfg_ = es.model;
    const int B = es.micro_batch, Tn = es.seq_len;

    // Everything that can refuse the plan comes before the first large allocation and the first
    // write: a refused plan has allocated and written nothing, and nothing that could be known now
    // is found after training. The token scan and the output paths look at the same files from
    // every rank, so rank 0 alone does them.
    std::string refusal;
    try {
      decorate_ = decorate_progress();
      open_data();
      if (!plan_.data.tokenizer.empty()) tokenizer_ = std::make_unique<Tokenizer>(plan_.data.tokenizer);
      if (root_) {
        check_token_ids();
        outputs_ = check_run_outputs(plan_, GPT<Ops>::llmc_file_bytes(cfg_), world);
      } else {
        outputs_ = check_rank_outputs(plan_, comm_.rank());
      }
      // The CUDA backend's host memory is modelled when the plan names device "cuda" (zero/estimate.h).
      if (Ops::tier == Tier::host || plan_.device == "cuda") check_host_memory();
      swap_ = prepare_offload(plan_, world, comm_.rank(), comm_.local_world(), Ops::tier == Tier::host);
    } catch (const std::exception& e) {
      refusal = e.what();
    }
    agree_on_startup(refusal);
    const ckpt::Continuation cont = ckpt::share_start(comm_, plan_.checkpoint, outputs_.checkpoint);
    run_id_ = cont.run_id;

    // Units padded so every rank's shard has the same size. The model keeps no parameters or
    // gradients of its own: they are the store's (zero/store.h), pointed at by the engine.
    const int stage = plan_.zero.stage;
    model_ = std::make_unique<GPT<Ops>>(es.model, B, Tn, mem_, es.pad_multiple, false, false, es.recompute,
                                        es.embedding_rows);
    partition_ = std::make_unique<Partition>(model_->layout(), es.zero);
    store_ = std::make_unique<StateStore>(list_model_state(model_->layout(), *partition_, es.types, swap_), mem_, swap_);
    // The CUDA backend's collectives (comm.backend, train/backend_choice.h): NCCL on the device
    // buffers (comm/nccl_comm.h), or through pinned host mirrors over MPI (comm/host_mirror_comm.h).
    engine_comm_ = &comm_;
#if ZT_HAVE_CUDA
    if constexpr (Ops::tier == Tier::device) {
      if (plan_.comm.backend == "nccl")
        device_comm_ = make_nccl_comm(nccl_options(), comm_, Ops::stream(), es.types.param == DType::bf16);
      else
        device_comm_ = std::make_unique<HostMirrorComm>(
            comm_, host_mirror_regions(*store_, es.types.param, stage), int(dtype_bytes(es.types.param)));
      engine_comm_ = device_comm_.get();
    }
#endif
    engine_ = std::make_unique<ZeroEngine<Ops>>(*model_, *partition_, *store_, *engine_comm_, plan_.optim);
    // model.init is read here (into the allocated parameters); a damaged file is still refused
    // before anything is written. A run that starts from a TrainState takes its buffers instead.
    state_.seed = plan_.run.seed;
    try {
      if (ctl_.start) {
        ZT_REQUIRE(ctl_.start->seed == plan_.run.seed && ctl_.start->step <= plan_.run.steps,
                   "train state: step " << ctl_.start->step << ", seed " << ctl_.start->seed
                                        << " does not continue this plan (run.seed " << plan_.run.seed << ", run.steps "
                                        << plan_.run.steps << ")");
        state_.step = ctl_.start->step;
        state_.next_sequence = ctl_.start->next_sequence;
        restore_buffers<Ops>(*ctl_.start, *store_);
        engine_->optimizer().set_steps_taken(int(state_.step));
      } else if (!(resume_from_ = cont.resume_from).empty()) {
        loaded_ = ckpt::load_store<Ops>(resume_from_, plan_, world, model_->layout(), *store_, loaded_meta_);
        state_.step = loaded_meta_.step;
        state_.next_sequence = loaded_meta_.next_sequence;
        engine_->optimizer().set_steps_taken(int(state_.step));
      } else {
        engine_->init_parameters(plan_.run.seed, m.init);
      }
    } catch (const OutOfMemory&) {
      throw;
    } catch (const Error& e) {
      refusal = e.what();
    }
    agree_on_startup(refusal);
    // The first write: rank 0 moves an earlier run's files aside (its traces too) before any rank
    // opens its trace (docs/traces.md).
    std::string moved;
    if (root_) moved = open_run_outputs(plan_, outputs_);
    if (!outputs_.trace.empty()) {
      if (world > 1) comm_.barrier();
      tracer_ = std::make_unique<Tracer>(outputs_.trace, comm_.rank());
      engine_comm_->set_tracer(tracer_.get());
      engine_->set_tracer(tracer_.get());
    }
    if (!resume_from_.empty()) {
      double bytes = double(loaded_.bytes), seconds = loaded_.seconds;
      if (world > 1) {  // all ranks' bytes; the load ends when the slowest rank is done
        comm_.all_reduce_sum(&bytes, 1);
        for (uint64_t us : comm_.all_gather_u64(uint64_t(seconds * 1e6))) seconds = std::max(seconds, double(us) / 1e6);
      }
      loaded_.bytes = uint64_t(bytes);
      loaded_.seconds = seconds;
    }

    if (!root_) return;
    if (!moved.empty()) std::printf("%s\n", moved.c_str());
    if (!outputs_.checkpoint.note.empty()) std::printf("%s\n", outputs_.checkpoint.note.c_str());
    if (!resume_from_.empty())
      std::printf("%s (saved at world %lld, zero.stage %lld; resuming at step %lld)\n", loaded_.summary("loaded").c_str(),
                  (long long)loaded_meta_.world, (long long)loaded_meta_.stage, (long long)state_.step);
    if (!resume_from_.empty())
      for (const std::string& w : ckpt::changed_plan_fields(loaded_meta_.plan, plan_))
        std::fprintf(stderr, "warning: checkpoint.resume: %s (the checkpoint's plan -> this plan)\n", w.c_str());
    log_ = std::make_unique<MetricsLog>(outputs_.log);
    if (Ops::tier == Tier::device) std::printf("device: %s\n", device::describe().c_str());
    std::printf("backend %s, %d rank(s) x %d threads | model L=%d NH=%d C=%d T=%d V=%d (Vp=%d): %.2fM parameters in %d units\n",
                Ops::name, world, threads, cfg_.L, cfg_.NH, cfg_.C, cfg_.maxT, cfg_.V, cfg_.Vp,
                double(model_->layout().num_params()) / 1e6, model_->layout().num_units());
    std::printf("data: %zu train tokens (%zu sequences) in %zu file(s), %zu val tokens\n", loader_->num_tokens(),
                loader_->num_sequences(), loader_->files().size(), val_loader_->num_tokens());
    std::printf("batch: micro_batch %d x seq_len %d x grad_accum %d x world %d = %lld tokens per step\n", B, Tn,
                plan_.batch.grad_accum, world, (long long)B * Tn * plan_.batch.grad_accum * world);
    std::printf("zero: stage %d, %s, %zu gradient bucket(s)\n", stage,
                plan_.zero.overlap_comm ? "overlapped bucketed communication" : "naive blocking per-unit communication",
                partition_->buckets().size());
    std::printf("comm: %s\n", describe_comm_backend(plan_.comm.backend, Ops::tier == Tier::device).c_str());
    if (swap_.enabled()) std::printf("%s\n", describe_offload(swap_, plan_, world, Ops::tier == Tier::host).c_str());
    std::printf("\nmemory per rank (tracked):\n%s\n", mem_.table(false).c_str());
    std::fflush(stdout);
  }

  // The NCCL comm's timeout and fault injection, as the MPI comm has them (train.cu).
  CommOptions nccl_options() const {
    CommOptions co;
    co.timeout_s = plan_.comm.timeout_s;
    co.fault_skip_rank = plan_.comm.fault_skip_rank;
    co.fault_skip_step = plan_.comm.fault_skip_step;
    return co;
  }

  // One verdict for all ranks (comm.h): a refused plan prints one line rather than one per rank.
  void agree_on_startup(const std::string& refusal) { agree_or_throw(comm_, refusal, "refused the plan"); }

  // The loaders, and data too small for one step or one evaluation: a short train file would
  // repeat sequences within a step (several ranks reading the same data), a short val file used to
  // be found at the final evaluation, after all the training.
  void open_data() {
    const int world = comm_.world(), rank = comm_.rank();
    const int B = plan_.batch.micro_batch, Tn = plan_.model.seq_len, accum = plan_.batch.grad_accum;
    // Shard errors name the file; the prefix names the plan field that pointed at it.
    auto open = [&](const char* field, const std::string& pattern, bool shuffle) {
      try {
        return std::make_unique<DataLoader>(pattern, B, Tn, rank, world, plan_.run.seed, shuffle);
      } catch (const Error& e) {
        throw Error(std::string(field) + ": " + e.what());
      }
    };
    loader_ = open("data.train", plan_.data.train, plan_.data.shuffle);
    val_loader_ = open("data.val", plan_.data.val, false);
    const char* ranks = world == 1 ? " rank" : " ranks";
    const uint64_t per_step = uint64_t(B) * uint64_t(accum) * uint64_t(world);
    ZT_REQUIRE(loader_->num_sequences() >= per_step,
               "data.train: " << plan_.data.train << " holds " << loader_->num_sequences() << " sequence(s) of " << Tn + 1
                              << " tokens, fewer than one optimizer step uses (" << per_step << " = micro_batch " << B
                              << " x grad_accum " << accum << " x " << world << ranks
                              << "); add data, or lower batch.micro_batch or batch.grad_accum");
    const uint64_t per_eval = uint64_t(B) * uint64_t(world);
    ZT_REQUIRE(val_loader_->num_sequences() >= per_eval,
               "data.val: " << plan_.data.val << " holds " << val_loader_->num_sequences() << " sequence(s) of " << Tn + 1
                            << " tokens, fewer than one evaluation batch (" << per_eval << " = micro_batch " << B << " x "
                            << world << ranks << "); add data, or lower batch.micro_batch");
  }

  // One pass over every token at start: an id outside the vocabulary used to stop the run at
  // whatever step first drew its sequence (or never, if none did).
  void check_token_ids() const {
    for (const auto& [field, loader] : {std::pair{"data.train", loader_.get()}, std::pair{"data.val", val_loader_.get()}})
      if (const auto bad = loader->first_token_at_least(cfg_.V))
        throw Error(std::string(field) + ": " + bad->file + " holds token id " + std::to_string(bad->id) + " at token " +
                    std::to_string(bad->position) + ", outside the vocabulary (model.vocab_size " +
                    std::to_string(cfg_.V) + "); tokenize the data for this vocabulary, or raise model.vocab_size");
  }

  // The estimate is what the tracker will allocate (tested to the byte), so it can be compared
  // before allocating: past the available memory the kernel's OOM killer would end the run with no
  // message at all. Every rank on this host allocates its own.
  void check_host_memory() const {
    const HostMemory avail = host_memory_available();
    if (avail.bytes == 0) return;  // nothing to compare with (not Linux)
    // Host memory of every kind: pageable, and pinned (the CUDA backend's staging and offloaded state).
    const Estimate est = estimate_plan(plan_, comm_.world());
    const uint64_t per_rank = est.tier_total(Tier::host) + est.tier_total(Tier::pinned);
    const uint64_t need = per_rank * uint64_t(comm_.local_world());
    ZT_REQUIRE(need <= avail.bytes,
               "memory: this plan needs " << format_bytes(double(need)) << " on this host (" << format_bytes(double(per_rank))
                                          << " per rank x " << comm_.local_world() << " rank(s), as ./train estimate "
                                          << "reports) but " << format_bytes(double(avail.bytes)) << " is available ("
                                          << avail.source << "); next step: " << next_memory_step(plan_, comm_.world()));
  }

  void save_final_weights() {
    // Collective (stage 3 gathers one unit at a time); rank 0 writes each unit as it comes.
    if (root_) {
      write_by_rename("run.final_weights", outputs_.final_weights,
                      [&](const std::string& tmp) { engine_->save_llmc(tmp, true); });
      std::printf("final weights written to %s (llm.c format)\n", plan_.run.final_weights.c_str());
    } else {
      engine_->save_llmc("", false);
    }
  }

  // Collective: every rank writes its shards (checkpoint/checkpoint.h), nothing is gathered.
  void save_checkpoint() {
    ckpt::Meta m;
    m.step = state_.step;
    m.seed = state_.seed;
    m.next_sequence = state_.next_sequence;
    m.world = comm_.world();
    m.rank = comm_.rank();
    m.stage = plan_.zero.stage;
    m.plan_hash = plan_hash(plan_.resolved.dump());
    m.model = cfg_;
    m.param_dtype = sizeof(T) == 2 ? "bf16" : "f32";
    m.run_id = run_id_;
    m.plan = plan_.resolved.dump();
    // On a terminal, rank 0 shows how far its own file is (progress.h: decorate_progress). After
    // each piece, a second stop signal abandons the save (stop_signal.h).
    int shown = -1;
    bool pause = ckpt::fault_pause_in_save(comm_.rank(), m.step);
    const int signals_before = StopSignals::count();
    const ckpt::Progress progress = [&](double f) {
      if (pause && f >= 0.5) {  // tests: a save caught half way until a signal comes during it
        pause = false;
        StopSignals::wait_for_signal(signals_before, 60);
      }
      StopSignals::Saving::check();
      if (!root_ || !decorate_ || int(f * 100) == shown) return;
      shown = int(f * 100);
      std::printf("\r\033[Kcheckpoint: saving step %lld: %d%%", (long long)m.step, shown);
      std::fflush(stdout);
    };
    const StopSignals::Saving saving;
    const ckpt::Transfer t = ckpt::save_store<Ops>(comm_, plan_.checkpoint, m, model_->layout(), *store_, progress);
    if (root_) {
      if (decorate_) std::printf("\r\033[K");
      std::printf("%s\n", t.summary("saved").c_str());
      std::fflush(stdout);
    }
  }

  // The start-up scan found no id outside the vocabulary; this guards the embedding lookup against
  // a shard rewritten while the run maps it.
  void check_tokens(const std::vector<int>& inputs, const std::vector<int>& targets) const {
    for (size_t i = 0; i < inputs.size(); ++i)
      ZT_REQUIRE(inputs[i] < cfg_.V && targets[i] < cfg_.V,
                 "data: token id " << std::max(inputs[i], targets[i]) << " is outside the vocabulary (model.vocab_size "
                                   << cfg_.V << ")");
  }

  double evaluate(int step) {
    const int B = plan_.batch.micro_batch, Tn = plan_.model.seq_len;
    const int64_t n = std::min<int64_t>(plan_.run.eval_batches, val_loader_->num_eval_batches());
    ZT_REQUIRE(n > 0, "data.val: " << plan_.data.val << " holds fewer than " << B * comm_.world() << " sequences of "
                                   << Tn + 1 << " tokens");
    std::vector<int> inputs(size_t(B) * Tn), targets(size_t(B) * Tn);
    double sum = 0.0;
    for (int64_t i = 0; i < n; ++i) {
      val_loader_->eval_batch(i, inputs.data(), targets.data());
      check_tokens(inputs, targets);
      engine_->begin_pass(0, false);
      sum += model_->forward(inputs.data(), targets.data(), B, Tn);
    }
    if (comm_.world() > 1) comm_.all_reduce_sum(&sum, 1);
    const double val = sum / double(n * comm_.world());
    if (root_) {
      log_->write({{"step", step + 1}, {"val_loss", val}});
      std::printf("step %5d | val loss %.4f (%lld batches)\n", step + 1, val, (long long)(n * comm_.world()));
    }
    return val;
  }

  // Autoregressive sample from <|endoftext|>, temperature 1: the full forward at the current
  // length each token (cheap at these sizes; no KV cache in the training model).
  void sample(int step) {
    const int Tn = plan_.model.seq_len, n = std::min(plan_.run.sample_tokens, Tn - 1);
    std::vector<int> tokens{tokenizer_->eot()};
    SampleRng rng{plan_.run.seed * 0x9E3779B97F4A7C15ull + uint64_t(step) + 1};
    for (int i = 0; i < n; ++i) {
      const int t = int(tokens.size());
      engine_->begin_pass(0, false);  // every rank samples the same tokens (stage 3 gathers need all)
      model_->forward(tokens.data(), nullptr, 1, t);
      const std::vector<float> logits = model_->logits_row(t - 1);
      double maxv = -1e30;
      for (int v = 0; v < cfg_.V; ++v) maxv = std::max(maxv, double(logits[v]));
      double sum = 0.0;
      for (int v = 0; v < cfg_.V; ++v) sum += std::exp(double(logits[v]) - maxv);
      double r = rng.uniform() * sum;
      int next = cfg_.V - 1;
      for (int v = 0; v < cfg_.V; ++v) {
        r -= std::exp(double(logits[v]) - maxv);
        if (r <= 0) { next = v; break; }
      }
      tokens.push_back(next);
    }
    if (!root_) return;
    std::vector<int> body(tokens.begin() + 1, tokens.end());
    std::printf("---- sample at step %d ----\n%s\n---------------------------\n", step + 1, tokenizer_->decode(body).c_str());
    std::fflush(stdout);
  }

  const Plan& plan_;
  Comm& comm_;
  const RunControl& ctl_;
  const bool root_;
  TrainState state_;
  GPTConfig cfg_;
  MemoryTracker mem_;
  std::unique_ptr<DataLoader> loader_, val_loader_;
  std::unique_ptr<Tokenizer> tokenizer_;
  std::unique_ptr<GPT<Ops>> model_;
  std::unique_ptr<Partition> partition_;
  std::unique_ptr<StateStore> store_;
  // CUDA backend: the engine's comm for device buffers, NCCL or StagedComm, over comm_ (declared
  // before engine_: outlives it). engine_comm_: device_comm_, or comm_ itself on the CPU backend.
  std::unique_ptr<Comm> device_comm_;
  Comm* engine_comm_ = nullptr;
  std::unique_ptr<ZeroEngine<Ops>> engine_;
  std::unique_ptr<Tracer> tracer_;  // run.trace; null = off
  uint64_t bytes_per_step_ = 0;
  std::unique_ptr<MetricsLog> log_;
  RunOutputs outputs_;  // rank 0: all; the others: their trace
  offload::SwapSpec swap_;  // offload.optimizer / offload.params "nvme" (train/offload_setup.h); disabled otherwise
  bool decorate_ = false;
  std::string resume_from_;  // the checkpoint this run continues ("" = none)
  uint64_t run_id_ = 0;      // its lineage (checkpoint/checkpoint_dir.h): recorded in every checkpoint it saves
  ckpt::Transfer loaded_;
  ckpt::Meta loaded_meta_;
};

}  // namespace

namespace {

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
  if (backend == "cpu-fp32") return run_trainer<CpuOps<float>>(plan, comm, ctl);
#if ZT_HAVE_CUDA
  // Ranks on one host take its GPUs in turn (local rank modulo the count): with fewer GPUs than
  // ranks, several ranks share one (their collectives are host-staged, zero/staged_comm.h).
  int gpus = 0;
  ZT_CHECK_CUDA(cudaGetDeviceCount(&gpus));
  cuda::Context::select(comm.local_rank() % std::max(1, gpus));
  if (backend == "cuda-fp32") return run_trainer<CudaOps<float>>(plan, comm, ctl);
  return run_trainer<CudaOps<bf16>>(plan, comm, ctl);
#else
  throw Error("device: \"cuda\" but this build has no CUDA backend");
#endif
}

}  // namespace zt
