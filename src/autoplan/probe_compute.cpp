// Compute probes (calibrate.h): a micro-step of the model at each micro-batch, and AdamW.
#include "autoplan/calibrate.h"
#include "autoplan/probe_timing.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <fstream>
#include <sstream>

#include <cblas.h>
#include <omp.h>

#include "backend/ops_cpu.h"
#include "kernels/adamw.h"
#include "model/gpt.h"
#include "model/tensor_parallel.h"
#include "offload/shard_source.h"
#include "offload/swap_file.h"
#include "offload/swap_pipeline.h"
#include "offload/uring.h"
#include "runtime/clock.h"
#include "runtime/error.h"
#include "plan/plan.h"
#include "runtime/output_path.h"

namespace zt::autoplan {
namespace {

// One forward + backward of a model of cfg.L blocks at micro-batch b <= the model's: what the
// trainer's micro-step runs. A first pipeline stage (no head) starts its backward from the gradient
// of its output, as the runner writes it there: a small constant each call (the blocks' backward
// leaves the gradient of the stage's input in the same buffer; fed back, it would grow or vanish
// over the calls, and denormals run slower).
template <class Model>
class MicroStep {
 public:
  MicroStep(Model& model, int V, int b, int T)
      : model_(model), b_(b), T_(T), in_(size_t(b) * T), tg_(in_.size()),
        boundary_(Model::boundary_bytes(model.config(), b, T) / sizeof(typename Model::T)) {
    for (size_t i = 0; i < in_.size(); ++i)
      in_[i] = int((i * 7919) % size_t(V)), tg_[i] = int((i * 104729 + 1) % size_t(V));
  }
  void operator()() {
    model_.zero_grad();
    model_.forward(in_.data(), tg_.data(), b_, T_, true, typename Model::S(1.0 / (double(b_) * T_)));
    if (!model_.config().last_stage) std::fill_n(model_.stage_output_grad(), boundary_, typename Model::T(1e-3));
    model_.backward();
  }

 private:
  Model& model_;
  int b_, T_;
  std::vector<int> in_, tg_;
  size_t boundary_;
};

template <class Model>
double time_micro_step(Comm& comm, Model& model, int V, int b, int T, bool warm_up) {
  MicroStep<Model> step(model, V, b, T);
  return steady_best_time(comm, 3, 5, 0.02, warm_up, step);
}

// A tensor rank's model run without its group: the sums left partial (this rank's part stands for
// the whole), gathers and scatters copies of this rank's part. What the split products compute is
// measured; what their collectives cost is the tensor link's (docs/autoplan.md, "Calibration").
class AloneTensorGroup final : public TensorGroupOps {
 public:
  AloneTensorGroup(int tp, int rank) : tp_(tp), rank_(rank) {}
  int elem_bytes() const override { return 4; }
  void all_reduce(void*, size_t) override {}
  void all_gather(const void* send, void* recv, size_t send_n) override { all_gather_bytes(send, recv, send_n * 4); }
  void reduce_scatter(const void* send, void* recv, size_t recv_n) override {
    std::memcpy(recv, static_cast<const char*>(send) + size_t(rank_) * recv_n * 4, recv_n * 4);
  }
  void all_gather_bytes(const void* send, void* recv, size_t send_bytes) override {
    for (int i = 0; i < tp_; ++i) std::memcpy(static_cast<char*>(recv) + size_t(i) * send_bytes, send, send_bytes);
  }
  void broadcast_host(void*, size_t, int) override {}

 private:
  int tp_, rank_;
};

}  // namespace

std::map<int, MicroStepCost> Calibration::micro_steps(const GPTConfig& cfg, const std::set<int>& bs, int T,
                                                      Recompute::Policy policy, int classifier_chunk, int embedding_rows,
                                                      int tp, bool sp) {
  static const char* names[] = {"none", "selective", "block"};
  // Models of the base shape: `L` blocks with the lookup and the head ("L1"), or the first stage of
  // a pipeline holding L blocks, the lookup and no head ("stage L2").
  auto key = [&](Recompute::Policy p, int L, bool headless, int b) {
    std::ostringstream k;
    k << "micro_step C" << cfg.C << " NH" << cfg.NH << " V" << cfg.V << " T" << T << " B" << b << " " << names[int(p)]
      << " chunk" << classifier_chunk << " embedding_rows" << embedding_rows;
    if (tp > 1) k << " tp" << tp << (sp ? " sp" : "");
    k << " threads" << threads_ << " ranks/host" << comm_.local_world() << (headless ? " stage L" : " L") << L;
    return k.str();
  };
  // Seconds per micro-step of such a model under p, for every b: one model, built at the largest b
  // not yet cached (its build and initialisation cost more than a step), run at each b (a smaller
  // batch uses the first rows of its buffers, as the engine's last micro-batch would).
  auto timings = [&](Recompute::Policy p, int L, bool headless) {
    int largest = 0;
    for (int b : bs)
      if (!has(key(p, L, headless, b))) largest = b;  // bs is ascending
    MemoryTracker mem;  // before the model: destroyed after it, which releases into it
    std::unique_ptr<GPT<CpuOps<float>>> model;
    AloneTensorGroup alone(tp, comm_.rank() % tp);
    if (largest > 0) {
      GPTConfig c = cfg;
      c.L = headless ? L + 1 : L;
      if (tp > 1) c = c.split(tp, comm_.rank() % tp, sp);
      if (headless) c = c.stage(2, 0, 0, L);
      Recompute rc;
      rc.policy = p;
      rc.every = 1;
      rc.classifier_chunk = classifier_chunk;
      model = std::make_unique<GPT<CpuOps<float>>>(c, largest, T, mem, 128, true, true, rc, embedding_rows);
      if (tp > 1) model->set_tensor_group(&alone);
      model->init_gpt2(1);
    }
    // Largest first: its untimed first call touches every buffer, so the smaller ones need none.
    std::map<int, double> t;
    bool touched = false;
    for (auto b = bs.rbegin(); b != bs.rend(); ++b)
      t[*b] = cached(key(p, L, headless, *b), [&] {
        const double s = time_micro_step(comm_, *model, cfg.V, *b, T, /*warm_up=*/!touched);
        touched = true;
        return s;
      });
    return t;
  };
  // A block timed on its own: the first stage of a pipeline with kBlocks blocks (the lookup, a small
  // part of it, included), per block; the rest (the head and loss) what a 1-block model adds to one
  // block. Until 2026-12-03 the block was the difference of a 3- and a 1-block model, both with the
  // head: where the head is most of a micro-step (the small models of docs/autoplan.md, "Measured:
  // the mesh"), two timings' noise was larger than the blocks, and stage 0 of a pipeline came out
  // at next to nothing, tensor ranks' blocks at 0 or at twice their cost. A policy's block costs
  // what its stage model adds to that, per sequence of the micro-batch: the sum of what it adds at
  // every b over the sum of the b (recomputation is a forward again, its work per sequence), never
  // less than nothing (recomputing saves no time, and a difference of two timings can come out
  // negative). One probe disturbed then moves it by its share, not whole: scenario 1's selective
  // 3-block model at B 2 added 1.9 ms a block where B 1, 4 and 8 added 0 to 0.2 ms, and its B 2 x 4
  // candidate came out +21% (docs/autoplan.md, "Measured").
  constexpr int kBlocks = 2;
  const std::map<int, double> t1 = timings(Recompute::Policy::none, 1, false),
                              blocks = timings(Recompute::Policy::none, kBlocks, true);
  double recompute_per_sequence_s = 0;
  if (policy != Recompute::Policy::none) {
    const std::map<int, double> tp = timings(policy, kBlocks, true);
    double added = 0, sequences = 0;
    for (int b : bs) added += (tp.at(b) - blocks.at(b)) / kBlocks, sequences += b;
    recompute_per_sequence_s = std::max(0.0, added / sequences);
  }
  std::map<int, MicroStepCost> out;
  for (int b : bs) {
    MicroStepCost& m = out[b];
    m.block_s = blocks.at(b) / kBlocks;
    m.fixed_s = std::max(0.0, t1.at(b) - m.block_s);
    m.block_s += recompute_per_sequence_s * b;
  }
  return out;
}

double Calibration::stage_idle_share(const GPTConfig& cfg, int P, int b, int T) {
  const int N = comm_.world(), rank = comm_.rank(), per_stage = N / P;
  if (P < 2 || per_stage < 1) return 1;
  std::ostringstream k;
  k << "stage_idle_share P" << P << " N" << N << " C" << cfg.C << " NH" << cfg.NH << " V" << cfg.V << " T" << T << " B"
    << b << " threads" << threads_ << " ranks/host" << comm_.local_world() << " " << comm_settings_;
  return cached(k.str(), [&] {
    GPTConfig c = cfg;
    c.L = 1;
    MemoryTracker mem;
    GPT<CpuOps<float>> model(c, b, T, mem, 128, true, true, Recompute{});
    model.init_gpt2(1);
    MicroStep<GPT<CpuOps<float>>> step(model, c.V, b, T);
    // The last stage's ranks compute and then release the ranks of the other stages in their column
    // (the same rank within the stage), which wait in a receive meanwhile.
    const int first_busy = (P - 1) * per_stage;
    const bool busy = rank >= first_busy;
    char token = 0;
    auto partial = [&] {
      if (!busy) {
        comm_.wait(comm_.recv(&token, 1, first_busy + rank % per_stage));
        return;
      }
      step();
      for (int w = rank % per_stage; w < first_busy; w += per_stage) comm_.wait(comm_.send(&token, 1, w));
    };
    const double all = max_over_ranks(comm_, steady_best_time(comm_, 3, 5, 0.02, true, step));
    const double some = max_over_ranks(comm_, steady_best_time(comm_, 3, 5, 0.02, true, partial));
    return std::clamp(some / all, 0.05, 1.0);
  });
}

double Calibration::adamw_s_per_param() {
  const size_t n = size_t(1) << 22;  // 64 MiB of state: far past the caches, as any real shard
  std::ostringstream k;
  k << "adamw threads" << threads_ << " ranks/host" << comm_.local_world();
  return cached(k.str(), [&] {
    std::vector<float> p(n, 0.5f), g(n, 0.01f), m(n, 0.0f), v(n, 0.0f);
    cpu::AdamWArgs a{1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 1.0f, 1};
    return best_time(3, [&] {
      cpu::adamw_update(p.data(), g.data(), m.data(), v.data(), n, a);
      ++a.step;
    }) / double(n);
  });
}


}  // namespace zt::autoplan
