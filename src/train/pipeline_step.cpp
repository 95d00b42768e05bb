#include "train/pipeline_step.h"

#include <algorithm>
#include <iomanip>
#include <sstream>
#include <string>
#include <utility>

#include "backend/ops_cpu.h"
#if ZT_HAVE_CUDA
#include "backend/ops_cuda.h"
#endif
#include "runtime/error.h"
#include "runtime/trace.h"
#include "train/startup_checks.h"
#include "zero/engine_settings.h"

namespace zt {

namespace {

// One pass on the "pipeline stage" track of run.trace (nothing without a tracer).
struct PassSpan {
  PassSpan(Tracer* tr, std::string name) : tr(tr), name(std::move(name)), t0(tr ? Tracer::now_us() : 0) {}
  ~PassSpan() {
    if (tr) tr->complete(name, Tracer::kPipeline, t0, Tracer::now_us() - t0);
  }
  Tracer* tr;
  std::string name;
  double t0;
};

// The stage's passes for the runner: each micro-batch's forward and backward on its own activation
// slot (slot = micro mod slots: a stage's micro-batches in flight are consecutive, at most `slots`).
template <class Ops>
class ModelStage final : public PipeStageWork {
 public:
  using S = typename Ops::S;
  ModelStage(GPT<Ops>& model, ZeroEngine<Ops>& engine, const StepBatches& b, int B, int Tn, S dloss, int slots,
             Tracer* tr)
      : model_(model), engine_(engine), b_(b), B_(B), Tn_(Tn), dloss_(dloss), slots_(slots),
        bytes_(boundary_floats(model.config(), B, Tn) * sizeof(float)), tr_(tr) {}

  static size_t boundary_floats(const GPTConfig& cfg, int B, int Tn) {
    return cfg.sp_rows(size_t(B) * size_t(Tn)) * size_t(cfg.C);
  }

  void forward(int, int micro, const float* input, float* output) override {
    const PassSpan span(tr_, "F" + std::to_string(micro));
    model_.use_activation_slot(micro % slots_);
    engine_.begin_pass(micro, true);
    if (input) Ops::h2d(model_.stage_input(), input, bytes_);
    const size_t i = size_t(micro);
    loss_ += model_.forward(b_.inputs[i].data(), b_.targets[i].data(), B_, Tn_, true, dloss_);
    if (output) Ops::d2h(output, model_.stage_output(), bytes_);
  }
  void backward(int, int micro, const float* output_grad, float* input_grad) override {
    const PassSpan span(tr_, "B" + std::to_string(micro));
    model_.use_activation_slot(micro % slots_);
    engine_.begin_pass(micro, true);
    if (output_grad) Ops::h2d(model_.stage_output_grad(), output_grad, bytes_);
    model_.backward();
    if (input_grad) Ops::d2h(input_grad, model_.stage_input_grad(), bytes_);
  }
  double loss_sum() const { return loss_; }

 private:
  GPT<Ops>& model_;
  ZeroEngine<Ops>& engine_;
  const StepBatches& b_;
  const int B_, Tn_;
  const S dloss_;
  const int slots_;
  const size_t bytes_;
  Tracer* tr_;
  double loss_ = 0.0;
};

}  // namespace

template <class Ops>
double pipeline_train_step(GPT<Ops>& model, ZeroEngine<Ops>& engine, Comm& pipe, PipeSchedule schedule,
                           const StepBatches& batches, int B, int Tn, typename Ops::S dloss, int slots,
                           Tracer* tracer, PipeStepStats* stats) {
  static_assert(Ops::tier == Tier::host, "the stages' messages are host floats (the CPU backend)");
  const int m = int(batches.inputs.size());
  ModelStage<Ops> work(model, engine, batches, B, Tn, dloss, slots, tracer);
  const PipeStepStats s = run_pipe_step(schedule, PipeShape{pipe.world(), m, 1}, pipe, work,
                                        ModelStage<Ops>::boundary_floats(model.config(), B, Tn));
  if (stats) *stats = s;
  model.use_activation_slot(0);
  return work.loss_sum() / m;
}

template <class Ops>
void sum_tied_embedding(GPT<Ops>& model, ZeroEngine<Ops>& engine, Comm& pipe) {
  const GPTConfig& cfg = model.config();
  const int P = pipe.world();
  if (P == 1 || !cfg.has_embedding()) return;
  ZT_ASSERT(model.layout().embedding_units() == 1);
  const int peer = cfg.first_stage ? P - 1 : 0;
  ShardedOptimizer<Ops>& opt = engine.optimizer();
  float* mine = opt.reduced_grads(0);
  const size_t n = opt.reduced_grads_numel(0);
  // In pieces of kPiece floats (1 MiB): a whole embedding's receive buffer would be an untracked
  // copy of it on both stages. Each piece is added only once its send has completed.
  constexpr size_t kPiece = size_t(1) << 18;
  std::vector<float> theirs(std::min(n, kPiece));
  for (size_t at = 0; at < n; at += kPiece) {
    const size_t k = std::min(kPiece, n - at);
    CommHandle r = pipe.recv(theirs.data(), k * sizeof(float), peer);
    CommHandle s = pipe.send(mine + at, k * sizeof(float), peer);
    pipe.wait(r);
    pipe.wait(s);
    // a + b on one stage, b + a on the other: the same bits (float addition commutes).
    for (size_t i = 0; i < k; ++i) mine[at + i] += theirs[i];
  }
}

template <class Ops>
double pipeline_eval_sum(GPT<Ops>& model, ZeroEngine<Ops>& engine, Comm& pipe, DataLoader& val, int64_t n, int B,
                         int Tn, int V) {
  const GPTConfig& cfg = model.config();
  const int stage = pipe.rank(), P = pipe.world();
  const size_t bytes = ModelStage<Ops>::boundary_floats(cfg, B, Tn) * sizeof(float);
  std::vector<int> inputs(size_t(B) * Tn), targets(size_t(B) * Tn);
  std::vector<float> boundary(bytes / sizeof(float));
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    val.eval_batch(i, inputs.data(), targets.data());
    check_tokens(inputs, targets, V);
    engine.begin_pass(0, false);
    if (stage > 0) {
      pipe.wait(pipe.recv(boundary.data(), bytes, stage - 1));
      Ops::h2d(model.stage_input(), boundary.data(), bytes);
    }
    sum += model.forward(inputs.data(), targets.data(), B, Tn);
    if (stage < P - 1) {
      Ops::d2h(boundary.data(), model.stage_output(), bytes);
      pipe.wait(pipe.send(boundary.data(), bytes, stage + 1));
    }
  }
  return sum;
}

template <class Ops>
std::string describe_pipeline(const Plan& plan, const GPTConfig& whole) {
  const int P = plan.mesh.pipeline, m = plan.batch.grad_accum;
  const PipeSchedule s = parse_pipe_schedule("mesh.schedule", plan.mesh.schedule);
  const PipeShape shape{P, m, 1};
  const std::vector<int> held = simulate_pipe(s, shape, 1.0, 2.0).peak_alive;
  std::ostringstream layers, slots;
  for (int st = 0; st < P; ++st) {
    const auto [first, n] = stage_blocks<Ops>(whole, plan.batch.micro_batch, plan.model.seq_len, P, st);
    layers << (st ? " | " : "") << first;
    if (n > 1) layers << "-" << first + n - 1;
    slots << (st ? " | " : "") << held[size_t(st)];
  }
  std::ostringstream os;
  os << "pipeline of " << P << " stages (layers " << layers.str() << ", cut by forward FLOPs), schedule "
     << pipe_schedule_name(s) << ", " << m << " micro-batch" << (m == 1 ? "" : "es") << ": bubble (P-1)/(m+P-1) = "
     << std::fixed << std::setprecision(3) << pipe_bubble(s, shape) << ", activations of " << slots.str()
     << " micro-batches held per stage";
  return os.str();
}

template std::string describe_pipeline<CpuOps<float>>(const Plan&, const GPTConfig&);
#if ZT_HAVE_CUDA
template std::string describe_pipeline<CudaOps<float>>(const Plan&, const GPTConfig&);
template std::string describe_pipeline<CudaOps<bf16>>(const Plan&, const GPTConfig&);
#endif
template double pipeline_train_step<CpuOps<float>>(GPT<CpuOps<float>>&, ZeroEngine<CpuOps<float>>&, Comm&,
                                                    PipeSchedule, const StepBatches&, int, int, float, int,
                                                    Tracer*, PipeStepStats*);
template void sum_tied_embedding<CpuOps<float>>(GPT<CpuOps<float>>&, ZeroEngine<CpuOps<float>>&, Comm&);
template double pipeline_eval_sum<CpuOps<float>>(GPT<CpuOps<float>>&, ZeroEngine<CpuOps<float>>&, Comm&, DataLoader&,
                                                  int64_t, int, int, int);

}  // namespace zt
