// The pipeline runner (src/pipeline/runner.h) on real point-to-point messages, against one process:
//   mpirun --oversubscribe -np P ./zt_test_pipe_runner      (ctest: P = 2, 3, 4)
// The stages are a toy stack of P v linear layers (virtual stage j: y = W_j x + b_j, the loss half
// the squared norm of the last output), so what is checked is the runner alone: every schedule, with
// fewer micro-batches than stages, as many and more, and interleaved with 2 chunks per rank, gives
// each rank's layers the gradients one process computes running the same micro-batches through the
// whole stack, bit for bit (the same arithmetic in the same order: each chunk's backwards run its
// micro-batches in order in every table), the last stage the same losses, and the group's byte count
// the messages the table sends. A group of one runs its chunks with the hand-over in memory.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "comm/comm.h"
#include "pipeline/runner.h"
#include "pipeline/schedule.h"

namespace {

zt::Comm* g_world = nullptr;
constexpr int kN = 6;  // floats per activation

// The toy model: V layers of (kN, kN) weights and kN biases, gradients beside them.
struct Layer {
  std::vector<float> w, b, dw, db;
};
Layer make_layer(int j) {
  Layer l{std::vector<float>(kN * kN), std::vector<float>(kN), std::vector<float>(kN * kN, 0.f), std::vector<float>(kN, 0.f)};
  for (int i = 0; i < kN * kN; ++i) l.w[size_t(i)] = std::sin(float(j * 97 + i)) * 0.5f;
  for (int i = 0; i < kN; ++i) l.b[size_t(i)] = std::cos(float(j * 13 + i)) * 0.1f;
  return l;
}
std::vector<float> tokens(int micro) {  // virtual stage 0's input
  std::vector<float> x(kN);
  for (int i = 0; i < kN; ++i) x[size_t(i)] = std::sin(float(micro * 7 + i + 1));
  return x;
}
// Not inlined: one machine code for the reference and the stages (GCC contracts a * b + c into an
// FMA differently in different inlined contexts, which would change last bits, not the runner).
[[gnu::noinline]] void layer_forward(const Layer& l, const float* x, float* y) {
  for (int o = 0; o < kN; ++o) {
    float s = l.b[size_t(o)];
    for (int i = 0; i < kN; ++i) s += l.w[size_t(o * kN + i)] * x[i];
    y[o] = s;
  }
}
[[gnu::noinline]] void layer_backward(Layer& l, const float* x, const float* dy, float* dx) {
  for (int o = 0; o < kN; ++o) {
    l.db[size_t(o)] += dy[o];
    for (int i = 0; i < kN; ++i) l.dw[size_t(o * kN + i)] += dy[o] * x[i];
  }
  if (!dx) return;
  for (int i = 0; i < kN; ++i) {
    float s = 0;
    for (int o = 0; o < kN; ++o) s += l.w[size_t(o * kN + i)] * dy[o];
    dx[i] = s;
  }
}
[[gnu::noinline]] float loss_of(const std::vector<float>& y) {
  float s = 0;
  for (float v : y) s += 0.5f * v * v;
  return s;
}

// One process: every micro-batch forward through all V layers, then backward; micro-batches in order.
std::vector<Layer> reference(int V, int m, std::vector<float>& losses) {
  std::vector<Layer> layers;
  for (int j = 0; j < V; ++j) layers.push_back(make_layer(j));
  for (int mb = 0; mb < m; ++mb) {
    std::vector<std::vector<float>> acts{tokens(mb)};
    for (int j = 0; j < V; ++j) {
      std::vector<float> y(kN);
      layer_forward(layers[size_t(j)], acts.back().data(), y.data());
      acts.push_back(y);
    }
    losses.push_back(loss_of(acts.back()));
    std::vector<float> dy = acts.back(), dx(kN);  // d(loss)/dy = y
    for (int j = V - 1; j >= 0; --j) {
      layer_backward(layers[size_t(j)], acts[size_t(j)].data(), dy.data(), j > 0 ? dx.data() : nullptr);
      dy = dx;
    }
  }
  return layers;
}

// This rank's chunks of the same stack, driven by the runner.
struct ToyStages : zt::PipeStageWork {
  ToyStages(const zt::PipeShape& sh, int rank) : sh(sh), rank(rank) {
    for (int c = 0; c < sh.v; ++c) layers.push_back(make_layer(c * sh.P + rank));
  }
  int vstage(int chunk) const { return chunk * sh.P + rank; }
  void forward(int chunk, int micro, const float* input, float* output) override {
    std::vector<float> x = input ? std::vector<float>(input, input + kN) : tokens(micro);
    EXPECT_EQ(input == nullptr, vstage(chunk) == 0);
    std::vector<float> y(kN);
    layer_forward(layers[size_t(chunk)], x.data(), y.data());
    inputs[{chunk, micro}] = x;
    if (output) {
      std::copy(y.begin(), y.end(), output);
    } else {
      EXPECT_EQ(vstage(chunk), sh.virtual_stages() - 1);
      last_out[micro] = y;
      losses[micro] = loss_of(y);
    }
  }
  void backward(int chunk, int micro, const float* output_grad, float* input_grad) override {
    std::vector<float> dy = output_grad ? std::vector<float>(output_grad, output_grad + kN) : last_out.at(micro);
    EXPECT_EQ(output_grad == nullptr, vstage(chunk) == sh.virtual_stages() - 1);
    EXPECT_EQ(input_grad == nullptr, vstage(chunk) == 0);
    layer_backward(layers[size_t(chunk)], inputs.at({chunk, micro}).data(), dy.data(), input_grad);
    inputs.erase({chunk, micro});
  }
  zt::PipeShape sh;
  int rank;
  std::vector<Layer> layers;
  std::map<std::pair<int, int>, std::vector<float>> inputs;
  std::map<int, std::vector<float>> last_out;
  std::map<int, float> losses;
};

// given_buffers: the runner's messages in buffers given to it (PipeBuffers, here host memory over
// MPI), each send its own, receives alternating between two, posted with the pass before's send.
void check(zt::Comm& pipe, zt::PipeSchedule s, const zt::PipeShape& sh, bool given_buffers = false) {
  const int me = pipe.rank();
  const std::string what = std::string(zt::pipe_schedule_name(s)) + " P " + std::to_string(sh.P) + " m " +
                           std::to_string(sh.m) + " v " + std::to_string(sh.v) + (given_buffers ? " given" : "");
  ToyStages stages(sh, me);
  std::vector<std::vector<float>> memory(2 + zt::pipe_message_sends(s, sh, me), std::vector<float>(kN));
  zt::PipeBuffers buffers;
  buffers.recv[0] = memory[0].data();
  buffers.recv[1] = memory[1].data();
  for (size_t i = 2; i < memory.size(); ++i) buffers.send.push_back(memory[i].data());
  pipe.begin_step(0);
  const zt::PipeStepStats st = zt::run_pipe_step(s, sh, pipe, stages, kN, given_buffers ? &buffers : nullptr);
  const uint64_t bytes = pipe.step_stats().bytes;
  std::vector<float> ref_losses;
  const std::vector<Layer> ref = reference(sh.virtual_stages(), sh.m, ref_losses);
  for (int c = 0; c < sh.v; ++c) {
    const Layer& got = stages.layers[size_t(c)];
    const Layer& want = ref[size_t(c * sh.P + me)];
    EXPECT_EQ(got.dw, want.dw) << what << ": rank " << me << " chunk " << c << " weight gradient";
    EXPECT_EQ(got.db, want.db) << what << ": rank " << me << " chunk " << c << " bias gradient";
  }
  if (me == (sh.virtual_stages() - 1) % sh.P) {
    ASSERT_EQ(stages.losses.size(), size_t(sh.m)) << what;
    for (int mb = 0; mb < sh.m; ++mb) EXPECT_EQ(stages.losses[mb], ref_losses[size_t(mb)]) << what << " micro " << mb;
  }
  EXPECT_TRUE(stages.inputs.empty()) << what << ": activations left after the step";
  uint64_t sends = 0, recvs = 0;
  for (int q = 0; q < sh.P; ++q)
    if (q != me) {
      sends += zt::pipe_sends(s, sh, me, q).size();
      recvs += zt::pipe_uses(s, sh, q, me).size();
    }
  EXPECT_EQ(st.sends, sends) << what;
  EXPECT_EQ(st.recvs, recvs) << what;
  EXPECT_EQ(bytes, sends * kN * sizeof(float)) << what << ": the group's byte count (a send counts its bytes)";
}

TEST(PipeRunner, EveryScheduleMatchesOneProcess) {
  const int P = g_world->world();
  for (zt::PipeSchedule s : {zt::PipeSchedule::gpipe, zt::PipeSchedule::one_f_one_b})
    for (int m : {1, P - 1, P, P + 1, 2 * P + 1})
      if (m >= 1) check(*g_world, s, {P, m, 1});
  for (int m : {P, 2 * P}) check(*g_world, zt::PipeSchedule::interleaved, {P, m, 2});
  check(*g_world, zt::PipeSchedule::interleaved, {P, P, 3});
}

// The same with the runner's messages in given buffers (the device messages' path, NCCL's order).
TEST(PipeRunner, GivenBuffersMatchOneProcess) {
  const int P = g_world->world();
  if (P < 2) GTEST_SKIP() << "given buffers need another stage";
  for (zt::PipeSchedule s : {zt::PipeSchedule::gpipe, zt::PipeSchedule::one_f_one_b})
    for (int m : {1, P, 2 * P + 1}) check(*g_world, s, {P, m, 1}, true);
  check(*g_world, zt::PipeSchedule::interleaved, {P, 2 * P, 2}, true);
}

// One rank holding every virtual stage (a group of one): the chunks hand their outputs over in memory.
TEST(PipeRunner, OneRankHandsOverInMemory) {
  std::unique_ptr<zt::Comm> solo = g_world->split(g_world->rank(), 0, "pipeline solo");
  check(*solo, zt::PipeSchedule::interleaved, {1, 3, 3});
  check(*solo, zt::PipeSchedule::one_f_one_b, {1, 2, 1});
}

}  // namespace

// One report: rank 0 prints gtest's, the others only their failures; the verdict is every rank's.
int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  zt::CommOptions opts;
  opts.timeout_s = 60;
  std::unique_ptr<zt::Comm> world = zt::make_mpi_comm(opts);
  g_world = world.get();
  if (world->rank() != 0) ::testing::GTEST_FLAG(brief) = true;
  double failed = RUN_ALL_TESTS() != 0 ? 1 : 0;
  world->all_reduce_sum(&failed, 1);
  if (world->rank() == 0) std::printf("pipe_runner_test: %d rank(s), %d failed\n", world->world(), int(failed));
  g_world = nullptr;
  return failed > 0 ? 1 : 0;
}
