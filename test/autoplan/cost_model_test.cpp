// The planner's cost model (docs/autoplan.md, "The cost model" and "Calibration"): the parameter
// offload term against arithmetic done by hand, and the engine run's transfers backed out by the
// inverse of that term's overlap.
#include <gtest/gtest.h>

#include <algorithm>

#include "autoplan/calibrate.h"
#include "autoplan/cost_model.h"
#include "backend/ops_cpu.h"
#include "model/gpt.h"
#include "model/tensor_parallel.h"

namespace zt::autoplan {
namespace {

// Every micro-step's compute is fixed_s (no blocks, no gradient path), so compute_s / grad_accum
// is known exactly.
Prediction predict_passes(double first, double next, double flush, double share, int grad_accum, double fixed) {
  StepShape s;
  s.grad_accum = grad_accum;
  Rates r;
  r.fixed_s = fixed;
  r.pass_first_s = first, r.pass_next_s = next, r.pass_flush_s = flush;
  r.pass_exposed = share;
  r.adamw_s_per_param = 0;
  return predict(s, r);
}

TEST(CostModel, PassIoExposesEachMicroStepAndTheFlushOnce) {
  // 3 micro-steps of 0.1 s compute; half of the overlap hidden.
  // first: 0.2 - 0.5 * min(0.1, 0.2) = 0.15; each later: 0.05 - 0.5 * min(0.1, 0.05) = 0.025.
  const Prediction p = predict_passes(0.2, 0.05, 0.07, 0.5, 3, 0.1);
  EXPECT_DOUBLE_EQ(p.compute_s, 0.3);
  EXPECT_NEAR(p.pass_io_s, 0.15 + 2 * 0.025 + 0.07, 1e-15);
  EXPECT_NEAR(p.step_s, 0.3 + 0.27, 1e-15);
  EXPECT_EQ(p.bound, "compute");
  // Without parameter offload every pass rate is 0, and so is the term.
  EXPECT_EQ(predict_passes(0, 0, 0, 0.5, 3, 0.1).pass_io_s, 0);
}

TEST(CostModel, TransfersBehindInvertsTheOverlapTerm) {
  int checked = 0;
  for (double share : {0.0, 0.3, 0.88, 1.0})
    for (double compute : {0.03, 0.2})
      for (double io : {0.01, 0.05, 0.2, 0.5}) {
        const double exposed = io - (1 - share) * std::min(compute, io);
        if (exposed <= 0) {  // all hidden (share 0, io within compute): nothing to back out
          EXPECT_EQ(transfers_behind(exposed, compute, share), 0);
          continue;
        }
        EXPECT_NEAR(transfers_behind(exposed, compute, share), io, 1e-12)
            << "share " << share << " compute " << compute << " io " << io;
        ++checked;
      }
  EXPECT_EQ(checked, 28);  // of 32: at share 0, io 0.01 within 0.03 s and 0.01, 0.05, 0.2 within 0.2 s are all hidden
}

// Two stages of {2, 2} blocks, the last with the head: one micro-batch takes 0.02 s on the first,
// 0.04 s on the last.
StepShape two_stages(int chunks) {
  StepShape s;
  s.pipeline = 2, s.chunks = chunks, s.grad_accum = 4, s.layers = 4;
  s.stage_blocks = {2, 2}, s.stage_recomputed = {0, 0};
  s.p2p_bytes = 1000, s.tie_bytes = 2000, s.tie_pieces = 3;
  return s;
}

TEST(CostModel, PipelineWaitsForTheOtherStagesOverChunksAndItsBoundaries) {
  Rates r;
  r.block_s = 0.01, r.fixed_s = 0.02, r.adamw_s_per_param = 0;
  r.p2p_alpha_s = 1e-3, r.p2p_bytes_per_s = 1e6;
  const Prediction p = predict(two_stages(1), r);
  ASSERT_EQ(p.stage_s.size(), 2u);
  EXPECT_DOUBLE_EQ(p.stage_s[0], 0.02);
  EXPECT_DOUBLE_EQ(p.stage_s[1], 0.04);
  EXPECT_DOUBLE_EQ(p.compute_s, 4 * 0.04);  // the busiest stage's 4 micro-batches
  EXPECT_DOUBLE_EQ(p.bubble_s, 0.02);       // the first stage's work on one micro-batch
  // One boundary each way on the fill's and drain's path, 1 ms + 1 ms each, and the tied sum in 3
  // exchanges: 3 x 1 + 2 ms.
  EXPECT_NEAR(p.p2p_s, 2 * (1e-3 + 1e-3) + 3e-3 + 2e-3, 1e-15);
  EXPECT_NEAR(p.step_s, 0.16 + 0.02 + 0.009, 1e-15);
  // Two chunks per rank: each wait is half as long.
  EXPECT_DOUBLE_EQ(predict(two_stages(2), r).bubble_s, 0.01);
  // One stage: no bubble, no boundaries.
  StepShape one = two_stages(1);
  one.pipeline = 1, one.stage_blocks = {4}, one.stage_recomputed = {0};
  const Prediction q = predict(one, r);
  EXPECT_EQ(q.bubble_s, 0);
  EXPECT_EQ(q.p2p_s, 0);
  EXPECT_DOUBLE_EQ(q.compute_s, 4 * 0.06);
}

TEST(CostModel, StagesOnOneHostShareWhatTheWaitingRanksLeave) {
  Rates r;
  r.block_s = 0.01, r.fixed_s = 0.02, r.adamw_s_per_param = 0;
  r.idle_share = 0.6;  // the busiest stage alone computes in 0.6 of the time every rank at once takes
  // 4 ranks on one host, stages of 0.02 s and 0.04 s a micro-batch: the first waits half of the
  // busiest's time, so the busiest gets half of what the probe found: 1 - 0.4 x 0.5.
  StepShape s = two_stages(1);
  s.ranks = 4, s.ranks_per_host = 4;
  const Prediction p = predict(s, r);
  EXPECT_DOUBLE_EQ(p.core_share, 0.8);
  EXPECT_DOUBLE_EQ(p.compute_s, 4 * 0.04 * 0.8);
  EXPECT_DOUBLE_EQ(p.bubble_s, 0.02 * 0.8);
  // Balanced stages never wait (the probes' case); ranks on other hosts share no cores.
  s.stage_blocks = {2, 2}, s.stage_recomputed = {0, 0};
  r.fixed_s = 0;
  EXPECT_DOUBLE_EQ(predict(s, r).core_share, 1);
  s = two_stages(1), r.fixed_s = 0.02;
  s.ranks = 8, s.ranks_per_host = 4;
  EXPECT_EQ(predict(s, r).core_share, 1);
}

// The data axis's collectives hide behind the blocks of the micro-steps that have them, never
// behind the head: 4 blocks of 10 ms and a 100 ms head, 2 micro-steps, 200 ms of collectives none
// of which is the last unit's. Stages 0-1 sum the gradients in the last micro-step only (40 ms of
// blocks beside them); stage 2 in every one (80 ms).
TEST(CostModel, CollectivesHideBehindTheBlocksOfTheMicroStepsThatHaveThem) {
  for (int stage : {0, 1, 2}) {
    StepShape s;
    s.world = 2, s.stage = stage, s.grad_accum = 2, s.stage_blocks = {4}, s.stage_recomputed = {0};
    s.collectives = 1, s.comm_bytes = 0.2e9, s.overlap = true;
    Rates r;
    r.block_s = 0.01, r.fixed_s = 0.1, r.adamw_s_per_param = 0, r.overlap_exposed = 0;
    r.reduce_bytes_per_s = r.gather_bytes_per_s = 1e9;
    const Prediction p = predict(s, r);
    EXPECT_DOUBLE_EQ(p.compute_s, 2 * (0.04 + 0.1));
    EXPECT_NEAR(p.comm_s, 0.2, 1e-12);
    EXPECT_NEAR(p.overlap_window_s, stage == 2 ? 0.08 : 0.04, 1e-12) << "stage " << stage;
    EXPECT_NEAR(p.exposed_comm_s, stage == 2 ? 0.12 : 0.16, 1e-12) << "stage " << stage;
  }
}

// Hybrid sharding: the replicas' all-reduce of the shard, 1 ms + 1 MB at 1 GB/s. At stage 1 it
// follows the last bucket, so nothing hides it; at stages 2-3 it goes bucket by bucket beside backward.
TEST(CostModel, ReplicaSumsAreExposedAtStage1AndOverlappedAbove) {
  for (int stage : {1, 2}) {
    StepShape s;
    s.world = 2, s.stage = stage, s.replicas = 2, s.replica_collectives = 1, s.replica_bytes = 1e6;
    s.stage_blocks = {4}, s.stage_recomputed = {0};  // 40 ms of blocks to hide behind
    Rates r;
    r.block_s = 0.01, r.fixed_s = 0.1, r.adamw_s_per_param = 0, r.overlap_exposed = 0;
    r.replica_alpha_s = 1e-3, r.replica_bytes_per_s = 1e9;
    const Prediction p = predict(s, r);
    EXPECT_DOUBLE_EQ(p.replica_s, 2e-3);
    EXPECT_DOUBLE_EQ(p.comm_s, 2e-3);
    EXPECT_DOUBLE_EQ(p.exposed_comm_s, stage == 1 ? 2e-3 : 0.0) << "stage " << stage;
  }
}

TEST(CostModel, TensorCollectivesPayEachMicroStepsLatenciesAndTheBytes) {
  StepShape s;
  s.grad_accum = 3, s.tensor = 2, s.tensor_collectives = 10, s.tensor_bytes = 3e6;
  Rates r;
  r.adamw_s_per_param = 0, r.tensor_alpha_s = 1e-4, r.tensor_bytes_per_s = 1e9;
  const Prediction p = predict(s, r);
  EXPECT_NEAR(p.tensor_comm_s, 3 * 10 * 1e-4 + 3e-3, 1e-15);
  EXPECT_NEAR(p.step_s, p.tensor_comm_s, 1e-15);  // nothing else in this step
  EXPECT_EQ(p.bound, "tensor comm");
}

// Counts what the model asks of its tensor group, each rank alone (copies stand in for the sums).
struct CountingTensorGroup final : TensorGroupOps {
  int tp, calls = 0;
  explicit CountingTensorGroup(int t) : tp(t) {}
  int elem_bytes() const override { return 4; }
  void all_reduce(void*, size_t) override { ++calls; }
  void all_gather(const void* send, void* recv, size_t n) override { all_gather_bytes(send, recv, n * 4); }
  void reduce_scatter(const void* send, void* recv, size_t n) override {
    ++calls;
    std::copy_n(static_cast<const char*>(send), n * 4, static_cast<char*>(recv));
  }
  void all_gather_bytes(const void* send, void* recv, size_t bytes) override {
    ++calls;
    for (int i = 0; i < tp; ++i) std::copy_n(static_cast<const char*>(send), bytes, static_cast<char*>(recv) + i * bytes);
  }
  void broadcast_host(void*, size_t, int) override {}
};

// The planner's latency count (tensor_collectives_per_micro_step) against what one micro-step of a
// tensor rank's model calls, with and without sequence parallelism and recomputation.
TEST(TensorCollectives, CountIsWhatAMicroStepCalls) {
  for (bool sp : {false, true})
    for (const char* policy : {"none", "block"}) {
      GPTConfig cfg = GPTConfig::make(3, 4, 32, 8, 300).split(2, 0, sp);
      const Recompute rc = Recompute::from(policy, 2, 0);
      MemoryTracker mem;
      GPT<CpuOps<float>> model(cfg, 2, 8, mem, 128, true, true, rc);
      CountingTensorGroup group(2);
      model.set_tensor_group(&group);
      model.init_gpt2(1);
      std::vector<int> in(16), tg(16);
      for (int i = 0; i < 16; ++i) in[size_t(i)] = (i * 37) % 300, tg[size_t(i)] = (i * 53 + 1) % 300;
      group.calls = 0;
      model.zero_grad();
      model.forward(in.data(), tg.data(), 2, 8, true, 1.0f / 16);
      model.backward();
      EXPECT_EQ(uint64_t(group.calls), tensor_collectives_per_micro_step(cfg, rc)) << "sp " << sp << " " << policy;
    }
}

// A link's latency and bandwidth from every size probed (a tensor group's micro-batches): the line
// through timings that lie on one, and all bandwidth where they show no slope.
TEST(LinkFit, LeastSquaresOverEverySize) {
  std::vector<LinkPoint> on_line;
  for (double bytes : {1e4, 1e5, 1e6, 4e6}) on_line.push_back({bytes, 1e-3 + bytes / 125e6});
  const LinkCost c = fit_link(on_line);
  EXPECT_NEAR(c.alpha_s, 1e-3, 1e-12);
  EXPECT_NEAR(c.bytes_per_s, 125e6, 1e-3);
  // Two sizes scattered either way of the line: the fit splits the difference, not one pair's.
  const LinkCost d = fit_link({{1e5, 1e-3 + 1e5 / 125e6 + 2e-4}, {1e6, 1e-3 + 1e6 / 125e6 - 2e-4},
                               {2e5, 1e-3 + 2e5 / 125e6 - 2e-4}, {2e6, 1e-3 + 2e6 / 125e6 + 2e-4}});
  EXPECT_NEAR(d.bytes_per_s, 125e6, 125e6 * 0.05);
  const LinkCost flat = fit_link({{1e5, 2e-3}, {1e6, 2e-3}});
  EXPECT_EQ(flat.alpha_s, 0);
  EXPECT_DOUBLE_EQ(flat.bytes_per_s, 1e6 / 2e-3);
}

}  // namespace
}  // namespace zt::autoplan
