#include "train/checkpointing.h"

#include <algorithm>
#include <cstring>
#include <cstdio>
#include <vector>

#include "backend/ops_cpu.h"
#include "checkpoint/state_io.h"
#include "model/llmc_writer.h"
#include "runtime/error.h"
#include "runtime/output_path.h"
#include "train/stop_signal.h"
#include "zero/data_mesh.h"
#if ZT_HAVE_CUDA
#include "backend/ops_cuda.h"
#endif

namespace zt {

template <class Ops>
std::string start_state(const Plan& plan, const RunControl& ctl, const ckpt::Continuation& cont, int world,
                        EngineParts<Ops>& parts, TrainState& state, Resume& resume) {
  state.seed = plan.run.seed;
  try {
    if (ctl.start) {
      ZT_REQUIRE(ctl.start->seed == plan.run.seed && ctl.start->step <= plan.run.steps,
                 "train state: step " << ctl.start->step << ", seed " << ctl.start->seed
                                      << " does not continue this plan (run.seed " << plan.run.seed << ", run.steps "
                                      << plan.run.steps << ")");
      state.step = ctl.start->step;
      state.next_sequence = ctl.start->next_sequence;
      restore_buffers<Ops>(*ctl.start, *parts.store);
      parts.engine->optimizer().set_steps_taken(int(state.step));
    } else if (!(resume.from = cont.resume_from).empty()) {
      resume.loaded = ckpt::load_store<Ops>(resume.from, plan, world, parts.model->layout(), *parts.store, resume.meta);
      state.step = resume.meta.step;
      state.next_sequence = resume.meta.next_sequence;
      parts.engine->optimizer().set_steps_taken(int(state.step));
    } else {
      parts.engine->init_parameters(plan.run.seed, plan.model.init);
    }
  } catch (const OutOfMemory&) {
    throw;
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

void total_load(Comm& comm, Resume& resume) {
  if (resume.from.empty()) return;
  double bytes = double(resume.loaded.bytes), seconds = resume.loaded.seconds;
  if (comm.world() > 1) {  // all ranks' bytes; the load ends when the slowest rank is done
    comm.all_reduce_sum(&bytes, 1);
    for (uint64_t us : comm.all_gather_u64(uint64_t(seconds * 1e6))) seconds = std::max(seconds, double(us) / 1e6);
  }
  resume.loaded.bytes = uint64_t(bytes);
  resume.loaded.seconds = seconds;
}

void report_start(const std::string& moved, const std::string& note, const Resume& resume, const Plan& plan,
                  int64_t step) {
  if (!moved.empty()) std::printf("%s\n", moved.c_str());
  if (!note.empty()) std::printf("%s\n", note.c_str());
  if (resume.from.empty()) return;
  const int64_t data = resume.meta.world / (resume.meta.tensor * resume.meta.pipeline);  // the data axis
  const std::string groups = resume.meta.shard_group > 0 && resume.meta.shard_group < data
                                 ? ", zero.shard_group " + std::to_string(resume.meta.shard_group)
                                 : "";
  std::string mesh = resume.meta.pipeline > 1 ? ", mesh.pipeline " + std::to_string(resume.meta.pipeline) : "";
  if (resume.meta.tensor > 1) mesh += ", mesh.tensor " + std::to_string(resume.meta.tensor);
  std::printf("%s (saved at world %lld, zero.stage %lld%s%s; resuming at step %lld)\n", resume.loaded.summary("loaded").c_str(),
              (long long)resume.meta.world, (long long)resume.meta.stage, groups.c_str(), mesh.c_str(), (long long)step);
  for (const std::string& w : ckpt::changed_plan_fields(resume.meta.plan, plan))
    std::fprintf(stderr, "warning: checkpoint.resume: %s (the checkpoint's plan -> this plan)\n", w.c_str());
}

template <class Ops>
void save_checkpoint(Comm& comm, const Plan& plan, const TrainState& state, const GPTConfig& cfg, uint64_t run_id,
                     const ParamLayout& layout, const StateStore& store, bool decorate) {
  const bool root = comm.rank() == 0;
  ckpt::Meta m;
  m.step = state.step;
  m.seed = state.seed;
  m.next_sequence = state.next_sequence;
  m.world = comm.world();
  m.rank = comm.rank();
  m.stage = plan.zero.stage;
  m.shard_group = DataMesh::of(plan, comm.world(), comm.rank(), 0).shard;  // "host" is a number by now
  m.plan_hash = plan_hash(plan.resolved.dump());
  m.model = cfg;
  m.tensor = cfg.tp;
  m.pipeline = plan.mesh.pipeline;
  m.param_dtype = sizeof(typename Ops::T) == 2 ? "bf16" : "f32";
  m.run_id = run_id;
  m.plan = plan.resolved.dump();
  // On a terminal, rank 0 shows how far its own file is (progress.h: decorate_progress). After
  // each piece, a second stop signal abandons the save (stop_signal.h).
  int shown = -1;
  bool pause = ckpt::fault_pause_in_save(comm.rank(), m.step);
  const int signals_before = StopSignals::count();
  const ckpt::Progress progress = [&](double f) {
    if (pause && f >= 0.5) {  // tests: a save caught half way until a signal comes during it
      pause = false;
      StopSignals::wait_for_signal(signals_before, 60);
    }
    StopSignals::Saving::check();
    if (!root || !decorate || int(f * 100) == shown) return;
    shown = int(f * 100);
    std::printf("\r\033[Kcheckpoint: saving step %lld: %d%%", (long long)m.step, shown);
    std::fflush(stdout);
  };
  const StopSignals::Saving saving;
  const ckpt::Transfer t = ckpt::save_store<Ops>(comm, plan.checkpoint, m, layout, store, progress);
  if (root) {
    if (decorate) std::printf("\r\033[K");
    std::printf("%s\n", t.summary("saved").c_str());
    std::fflush(stdout);
  }
}

template <class Ops>
bool checkpoint_when_due(Comm& comm, const Plan& plan, const TrainState& state, const GPTConfig& cfg, uint64_t run_id,
                         EngineParts<Ops>& parts, bool decorate, int step) {
  const bool last = step + 1 == plan.run.steps;
  const int every = plan.checkpoint.every;
  std::string stop = plan.checkpoint.dir.empty() ? "" : StopSignals::agree(comm);
  if ((every > 0 && ((step + 1) % every == 0 || last)) || !stop.empty()) {
    parts.engine->params_ready();  // the parameter all-gather of stages 1-2 may still be in flight
    save_checkpoint<Ops>(comm, plan, state, cfg, run_id, parts.model->layout(), *parts.store, decorate);
    // A signal that came during a periodic save makes it the last: another step and a second
    // save would double the time a scheduler's KillWait must allow.
    if (stop.empty()) stop = StopSignals::agree(comm);
  }
  if (stop.empty()) return false;
  if (comm.rank() == 0)
    std::printf("stopped by %s after step %d (checkpoint saved; checkpoint.resume \"auto\" continues)\n", stop.c_str(),
                step + 1);
  return true;
}

namespace {

// A later pipeline stage's weights on their way to rank 0: records (whole tensor index, begin,
// count, count floats) packed into batches of about 1 MiB, each sent as its byte size, then its
// bytes; a size of 0 ends the stage's weights.
class StageWeightsToRoot {
 public:
  explicit StageWeightsToRoot(Comm& pipe) : pipe_(pipe) {}
  void add(int k, const float* v, size_t begin, size_t n) {
    const int64_t head[3] = {k, int64_t(begin), int64_t(n)};
    const auto* h = reinterpret_cast<const unsigned char*>(head);
    const auto* b = reinterpret_cast<const unsigned char*>(v);
    batch_.insert(batch_.end(), h, h + sizeof head);
    batch_.insert(batch_.end(), b, b + n * sizeof(float));
    if (batch_.size() >= kBatchBytes) flush();
  }
  void finish() {
    flush();
    send_size(0);
  }
  // Rank 0: stage s's records into `w`, until its end.
  static void receive(Comm& pipe, int s, LlmcWriter& w) {
    std::vector<unsigned char> batch;
    for (;;) {
      uint64_t size = 0;
      pipe.wait(pipe.recv(&size, sizeof size, s));
      if (size == 0) return;
      batch.resize(size);
      pipe.wait(pipe.recv(batch.data(), size, s));
      for (size_t at = 0; at < size;) {
        int64_t head[3];
        std::memcpy(head, batch.data() + at, sizeof head);
        at += sizeof head;
        ZT_ASSERT(head[2] >= 0 && at + size_t(head[2]) * sizeof(float) <= size);
        w.write(int(head[0]), reinterpret_cast<const float*>(batch.data() + at), size_t(head[1]), size_t(head[2]));
        at += size_t(head[2]) * sizeof(float);
      }
    }
  }

 private:
  static constexpr size_t kBatchBytes = size_t(1) << 20;
  void send_size(uint64_t size) { pipe_.wait(pipe_.send(&size, sizeof size, 0)); }
  void flush() {
    if (batch_.empty()) return;
    send_size(batch_.size());
    pipe_.wait(pipe_.send(batch_.data(), batch_.size(), 0));
    batch_.clear();
  }
  Comm& pipe_;
  std::vector<unsigned char> batch_;
};

}  // namespace

template <class Ops>
void save_final_weights(EngineParts<Ops>& parts, const Plan& plan, const RunOutputs& outputs, bool root) {
  ZeroEngine<Ops>& engine = *parts.engine;
  Comm* pipe = parts.pipe_comm;
  if (root) {
    write_by_rename("run.final_weights", outputs.final_weights, [&](const std::string& tmp) {
      const ParamLayout whole(parts.model->config().whole(), 1);
      LlmcWriter w(tmp, whole);
      engine.save_llmc([&](int k, const float* v, size_t begin, size_t n) { w.write(k, v, begin, n); });
      for (int s = 1; pipe && s < pipe->world(); ++s) StageWeightsToRoot::receive(*pipe, s, w);
      w.finish();
    });
    std::printf("final weights written to %s (llm.c format)\n", plan.run.final_weights.c_str());
  } else if (pipe && parts.stage_comm->rank() == 0) {  // a later stage's first rank
    StageWeightsToRoot out(*pipe);
    engine.save_llmc([&](int k, const float* v, size_t begin, size_t n) { out.add(k, v, begin, n); });
    out.finish();
  } else {
    engine.save_llmc({});
  }
}

#define ZT_CHECKPOINTING(Ops)                                                                                     \
  template std::string start_state<Ops>(const Plan&, const RunControl&, const ckpt::Continuation&, int,          \
                                        EngineParts<Ops>&, TrainState&, Resume&);                                 \
  template void save_checkpoint<Ops>(Comm&, const Plan&, const TrainState&, const GPTConfig&, uint64_t,            \
                                     const ParamLayout&, const StateStore&, bool);                                \
  template bool checkpoint_when_due<Ops>(Comm&, const Plan&, const TrainState&, const GPTConfig&, uint64_t,         \
                                         EngineParts<Ops>&, bool, int);                                            \
  template void save_final_weights<Ops>(EngineParts<Ops>&, const Plan&, const RunOutputs&, bool);
ZT_CHECKPOINTING(CpuOps<float>)
#if ZT_HAVE_CUDA
ZT_CHECKPOINTING(CudaOps<float>)
ZT_CHECKPOINTING(CudaOps<bf16>)
#endif
#undef ZT_CHECKPOINTING

}  // namespace zt
