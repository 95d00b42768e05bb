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
// slot (slot = micro mod slots: a stage's micro-batches in flight are consecutive, at most `slots`),
// in the model chunk the pass names (interleaved: every chunk of a micro-batch in its slot).
// The runner's messages: host memory (the CPU backend's; on the CUDA backend over MPI each boundary
// crosses through it: d2h, MPI, h2d, as the host-staged collectives do), or with device buffers
// (PipeBuffers: the pipeline group on NCCL) device memory, copied on the device. Their elements are
// the backend's (bf16: 2 bytes).
template <class Ops>
class ModelStage final : public PipeStageWork {
 public:
  using S = typename Ops::S;
  using T = typename Ops::T;
  ModelStage(GPT<Ops>& model, ZeroEngine<Ops>& engine, const StepBatches& b, int B, int Tn, S dloss, int slots,
             Tracer* tr, bool device_messages)
      : model_(model), engine_(engine), b_(b), B_(B), Tn_(Tn), dloss_(dloss), slots_(slots),
        bytes_(GPT<Ops>::boundary_bytes(model.config(), B, Tn)), tr_(tr), device_(device_messages) {}

  void forward(int chunk, int micro, const float* input, float* output) override {
    const PassSpan span(tr_, pass_name('F', chunk, micro));
    model_.use_activation_slot(micro % slots_);
    model_.use_chunk(chunk);
    engine_.begin_pass(micro, true);
    if (input) take(model_.stage_input(), input);
    const size_t i = size_t(micro);
    loss_ += model_.forward(b_.inputs[i].data(), b_.targets[i].data(), B_, Tn_, true, dloss_);
    if (output) give(output, model_.stage_output());
  }
  void backward(int chunk, int micro, const float* output_grad, float* input_grad) override {
    const PassSpan span(tr_, pass_name('B', chunk, micro));
    model_.use_activation_slot(micro % slots_);
    model_.use_chunk(chunk);
    engine_.begin_pass(micro, true);
    if (output_grad) take(model_.stage_output_grad(), output_grad);
    model_.backward();
    if (input_grad) give(input_grad, model_.stage_input_grad());
  }
  double loss_sum() const { return loss_; }

 private:
  // A message into the model, and the model's boundary into a message.
  void take(T* dst, const float* message) {
    if (device_) Ops::copy(dst, reinterpret_cast<const T*>(message), bytes_ / sizeof(T));
    else Ops::h2d(dst, message, bytes_);
  }
  void give(float* message, const T* src) {
    if (device_) Ops::copy(reinterpret_cast<T*>(message), src, bytes_ / sizeof(T));
    else Ops::d2h(message, src, bytes_);
  }
  // "F3", or with chunks "F3b" (chunk 1), as pipeline/schedule.h's render_pipe writes it.
  std::string pass_name(char kind, int chunk, int micro) const {
    std::string n = kind + std::to_string(micro);
    if (model_.config().chunks() > 1) n += char('a' + chunk);
    return n;
  }

  GPT<Ops>& model_;
  ZeroEngine<Ops>& engine_;
  const StepBatches& b_;
  const int B_, Tn_;
  const S dloss_;
  const int slots_;
  const size_t bytes_;
  Tracer* tr_;
  const bool device_;
  double loss_ = 0.0;
};

}  // namespace

template <class Ops>
double pipeline_train_step(GPT<Ops>& model, ZeroEngine<Ops>& engine, Comm& pipe, PipeSchedule schedule,
                           const StepBatches& batches, int B, int Tn, typename Ops::S dloss, int slots,
                           const PipeBuffers* device_messages, Tracer* tracer, PipeStepStats* stats) {
  const int m = int(batches.inputs.size());
  ModelStage<Ops> work(model, engine, batches, B, Tn, dloss, slots, tracer, device_messages != nullptr);
  const PipeStepStats s = run_pipe_step(schedule, PipeShape{pipe.world(), m, model.config().chunks()}, pipe, work,
                                        pipe_message_floats<Ops>(model.config(), B, Tn), device_messages);
  if (stats) *stats = s;
  model.use_activation_slot(0);
  model.use_chunk(0);
  return work.loss_sum() / m;
}

template <class Ops>
void sum_tied_embedding(GPT<Ops>& model, ZeroEngine<Ops>& engine, Comm& pipe) {
  const GPTConfig& cfg = model.config();
  const int P = pipe.world();
  if (P == 1 || !cfg.has_embedding()) return;
  ZT_ASSERT(model.layout().embedding_units() == 1);
  const int peer = cfg.first_stage ? P - 1 : 0;
  using T = typename Ops::T;
  ShardedOptimizer<Ops>& opt = engine.optimizer();
  T* grads = opt.reduced_grads(0);  // the backend's memory
  const size_t n = opt.reduced_grads_numel(0);
  // In pieces of kPiece elements (1 MiB in fp32), through host memory on the CUDA backend (the
  // pipeline group is the host comm), in place on the CPU backend's: a whole embedding's buffers
  // would be untracked copies of it on both stages. Each piece is added only once its send has
  // completed.
  constexpr bool on_host = Ops::tier == Tier::host;
  constexpr size_t kPiece = kTiePieceNumel;
  std::vector<T> staged(on_host ? 0 : std::min(n, kPiece)), theirs(std::min(n, kPiece));
  for (size_t at = 0; at < n; at += kPiece) {
    const size_t k = std::min(kPiece, n - at);
    T* mine = on_host ? grads + at : staged.data();
    if (!on_host) Ops::d2h(mine, grads + at, k * sizeof(T));
    CommHandle r = pipe.recv(theirs.data(), k * sizeof(T), peer);
    CommHandle s = pipe.send(mine, k * sizeof(T), peer);
    pipe.wait(r);
    pipe.wait(s);
    // a + b on one stage, b + a on the other: the same bits (addition commutes; bf16 is summed in
    // fp32 and rounded once, the same on both).
    for (size_t i = 0; i < k; ++i) mine[i] = T(float(mine[i]) + float(theirs[i]));
    if (!on_host) Ops::h2d(grads + at, mine, k * sizeof(T));
  }
}

template <class Ops>
double pipeline_forward(GPT<Ops>& model, Comm& pipe, const int* inputs, const int* targets, int B, int Tn,
                        size_t bytes, std::vector<float>& boundary) {
  const int P = pipe.world(), s = pipe.rank(), v = model.config().chunks(), last = P * v - 1;
  boundary.resize((bytes + sizeof(float) - 1) / sizeof(float));
  double loss = 0.0;
  for (int c = 0; c < v; ++c) {
    const int j = c * P + s;  // this chunk's virtual stage
    model.use_chunk(c);
    if (j > 0) {
      pipe.wait(pipe.recv(boundary.data(), bytes, (j - 1) % P));
      Ops::h2d(model.stage_input(), boundary.data(), bytes);
    }
    loss += model.forward(inputs, targets, B, Tn);
    if (j < last) {
      Ops::d2h(boundary.data(), model.stage_output(), bytes);
      pipe.wait(pipe.send(boundary.data(), bytes, (j + 1) % P));
    }
  }
  model.use_chunk(v - 1);  // the last stage's head: its logits stay readable (sampling)
  return loss;
}

template <class Ops>
double pipeline_eval_sum(GPT<Ops>& model, ZeroEngine<Ops>& engine, Comm& pipe, DataLoader& val, int64_t n, int B,
                         int Tn, int V) {
  const size_t bytes = GPT<Ops>::boundary_bytes(model.config(), B, Tn);
  std::vector<int> inputs(size_t(B) * Tn), targets(size_t(B) * Tn);
  std::vector<float> boundary;
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    val.eval_batch(i, inputs.data(), targets.data());
    check_tokens(inputs, targets, V);
    engine.begin_pass(0, false);
    sum += pipeline_forward(model, pipe, inputs.data(), targets.data(), B, Tn, bytes, boundary);
  }
  model.use_chunk(0);
  return sum;
}

template <class Ops>
std::string describe_pipeline(const Plan& plan, const GPTConfig& whole) {
  const int P = plan.mesh.pipeline, m = plan.batch.grad_accum, v = plan.mesh.chunks;
  const PipeSchedule s = parse_pipe_schedule("mesh.schedule", plan.mesh.schedule);
  const PipeShape shape{P, m, v};
  std::ostringstream layers, slots;
  for (int st = 0; st < P; ++st) {
    layers << (st ? " | " : "");
    const auto runs = stage_runs<Ops>(whole, plan.batch.micro_batch, plan.model.seq_len, P, v, st);
    for (size_t c = 0; c < runs.size(); ++c) {
      const auto [first, n] = runs[c];
      layers << (c ? "," : "") << first;
      if (n > 1) layers << "-" << first + n - 1;
    }
    slots << (st ? " | " : "") << pipe_activation_slots(s, shape, st);
  }
  std::ostringstream os;
  os << "pipeline of " << P << " stages (layers " << layers.str() << ", cut by forward FLOPs), schedule "
     << pipe_schedule_name(s);
  if (v > 1) os << " over " << v << " chunks per stage";
  os << ", " << m << " micro-batch" << (m == 1 ? "" : "es") << ": bubble " << (v > 1 ? "(P-1)/(v m+P-1)" : "(P-1)/(m+P-1)")
     << " = " << std::fixed << std::setprecision(3) << pipe_bubble(s, shape) << ", activations of " << slots.str()
     << " micro-batches held per stage";
  return os.str();
}

#define ZT_PIPELINE_STEP(Ops)                                                                                     \
  template std::string describe_pipeline<Ops>(const Plan&, const GPTConfig&);                                   \
  template double pipeline_train_step<Ops>(GPT<Ops>&, ZeroEngine<Ops>&, Comm&, PipeSchedule, const StepBatches&, \
                                           int, int, Ops::S, int, const PipeBuffers*, Tracer*, PipeStepStats*); \
  template void sum_tied_embedding<Ops>(GPT<Ops>&, ZeroEngine<Ops>&, Comm&);                                     \
  template double pipeline_eval_sum<Ops>(GPT<Ops>&, ZeroEngine<Ops>&, Comm&, DataLoader&, int64_t, int, int, int); \
  template double pipeline_forward<Ops>(GPT<Ops>&, Comm&, const int*, const int*, int, int, size_t, std::vector<float>&);
ZT_PIPELINE_STEP(CpuOps<float>)
#if ZT_HAVE_CUDA
ZT_PIPELINE_STEP(CudaOps<float>)
ZT_PIPELINE_STEP(CudaOps<bf16>)
#endif
#undef ZT_PIPELINE_STEP

}  // namespace zt
