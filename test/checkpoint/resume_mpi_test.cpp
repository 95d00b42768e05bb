// In-memory resume (docs/design.md §3.9): for every ZeRO stage, running steps 0-9 in one go and
// running 0-4, rebuilding model, store, engine and loop from the step-5 TrainState and running
// 5-9 give bit-identical losses and model state (parameters or parameter shard, AdamW moments) on
// every rank. Run under mpirun at N = 1 and 3 (ctest: resume_in_memory_np1, resume_in_memory_np3). Stages 1-3 again
// with the optimizer state in swap files (offload.optimizer nvme, docs/design.md §3.6): the state
// is captured from and restored into the files; stage 3 once more with the parameter shard in a
// swap file too (offload.params nvme).
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "comm/comm.h"
#include "plan/plan.h"
#include "train/state.h"
#include "train/trainer.h"

namespace {

zt::Comm* g_comm = nullptr;

// nvme: 0 in memory, 1 offload.optimizer nvme, 2 and offload.params nvme.
zt::Plan tiny_plan(int stage, int nvme, const std::string& dir) {
  // A small model whose units divide by neither 3 nor 128; gradient accumulation 2, tiny buckets
  // (several per step) and a prefetch of 2 so every part of the engine carries state across steps.
  const std::vector<std::string> sets = {
      "model.n_layer=2", "model.n_head=2", "model.n_embd=34", "model.seq_len=16", "batch.micro_batch=2",
      "batch.grad_accum=2", "zero.stage=" + std::to_string(stage), "zero.bucket_mb=0.05", "zero.prefetch_units=2",
      "data.train=data/sample/train_000.bin", "data.val=data/sample/val.bin", "data.tokenizer=", "data.shuffle=true",
      "optim.warmup_steps=3", "run.steps=10", "run.eval_every=0", "run.sample_every=0", "run.eval_batches=1",
      "run.threads=1", "run.log=" + dir + "/metrics.jsonl", "device=cpu"};
  std::vector<std::string> ov;
  for (const std::string& s : sets) ov.push_back(s);
  // Sub-groups of 32 Ki elements (128 KiB of I/O per state): several per shard, more than the
  // pipeline's 3 buffer sets, so its every stage runs and every set is reused (~1.7 M elements per
  // shard at N = 1, 54 sub-groups; ~0.6 M at N = 3, 18). Smaller ones (0.008 MB, 2 Ki elements) only
  // multiplied the synchronous O_DIRECT transfers: 850 per state and pass, ~85% of the test's time.
  if (nvme) ov.insert(ov.end(), {"offload.optimizer=nvme", "offload.nvme_dir=" + dir + "/swap", "offload.subgroup_mb=0.125"});
  if (nvme == 2) ov.push_back("offload.params=nvme");
  return zt::load_plan("plans/default.json", ov);
}

std::string work_dir(const std::string& what) {
  // Same path on every rank (rank 0 writes the log); removed at the end.
  return (std::filesystem::temp_directory_path() / ("zt_resume_" + std::to_string(g_comm->world()) + "_" + what)).string();
}

class Resume : public ::testing::TestWithParam<std::pair<int, int>> {};  // stage, offload (tiny_plan)

TEST_P(Resume, FromStepFiveIsBitIdentical) {
  const auto [stage, nvme] = GetParam();
  zt::Comm& comm = *g_comm;
  const std::string tag = "_s" + std::to_string(stage) + (nvme ? "_nvme" : "") + (nvme == 2 ? "_params" : "");
  const std::string d1 = work_dir("whole" + tag), d2 = work_dir("half" + tag), d3 = work_dir("rest" + tag);
  const zt::Plan p1 = tiny_plan(stage, nvme, d1), p2 = tiny_plan(stage, nvme, d2), p3 = tiny_plan(stage, nvme, d3);

  zt::TrainState whole_end, half_end, rest_end;
  zt::RunControl whole;
  whole.end = &whole_end;
  const zt::TrainResult a = zt::train(p1, comm, whole);

  zt::RunControl first;
  first.stop_at = 5;
  first.end = &half_end;
  const zt::TrainResult b = zt::train(p2, comm, first);
  ASSERT_EQ(half_end.step, 5);
  ASSERT_FALSE(half_end.buffers.empty());

  zt::RunControl rest;  // a new model, store, engine and loop, built from the step-5 state
  rest.start = &half_end;
  rest.end = &rest_end;
  const zt::TrainResult c = zt::train(p3, comm, rest);

  ASSERT_EQ(a.losses.size(), 10u);
  ASSERT_EQ(b.losses.size(), 5u);
  ASSERT_EQ(c.losses.size(), 5u);
  for (size_t s = 0; s < 10; ++s) {
    const double other = s < 5 ? b.losses[s] : c.losses[s - 5];
    EXPECT_EQ(std::memcmp(&a.losses[s], &other, sizeof(double)), 0)
        << "stage " << stage << " step " << s << ": " << a.losses[s] << " vs " << other;
  }
  EXPECT_EQ(rest_end.step, 10);
  EXPECT_EQ(rest_end.next_sequence, whole_end.next_sequence);
  ASSERT_EQ(whole_end.buffers.size(), rest_end.buffers.size());
  for (size_t i = 0; i < whole_end.buffers.size(); ++i) {
    const auto& x = whole_end.buffers[i];
    const auto& y = rest_end.buffers[i];
    ASSERT_EQ(x.id, y.id);
    ASSERT_EQ(x.bytes.size(), y.bytes.size());
    EXPECT_TRUE(x.bytes == y.bytes) << "stage " << stage << ", rank " << comm.rank() << ": " << zt::state_name(x.id)
                                    << " differs after resuming at step 5";
  }
  // The stopped run kept something different from the finished one (the check can fail).
  EXPECT_FALSE(half_end.buffers[0].bytes == whole_end.buffers[0].bytes);
  comm.barrier();
  if (comm.rank() == 0)
    for (const std::string& d : {d1, d2, d3}) std::filesystem::remove_all(d);
}

INSTANTIATE_TEST_SUITE_P(Stages, Resume,
                         ::testing::Values(std::pair{0, 0}, std::pair{1, 0}, std::pair{2, 0}, std::pair{3, 0},
                                           std::pair{1, 1}, std::pair{2, 1}, std::pair{3, 1}, std::pair{3, 2}),
                         [](const ::testing::TestParamInfo<std::pair<int, int>>& i) {
                           return "stage" + std::to_string(i.param.first) + (i.param.second ? "_nvme" : "") +
                                  (i.param.second == 2 ? "_params" : "");
                         });

}  // namespace

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  zt::CommOptions opts;
  opts.timeout_s = 60;
  std::unique_ptr<zt::Comm> comm = zt::make_mpi_comm(opts);
  g_comm = comm.get();
  if (comm->rank() != 0) {  // one report, rank 0's; every rank's failures still count below
    ::testing::TestEventListeners& ls = ::testing::UnitTest::GetInstance()->listeners();
    delete ls.Release(ls.default_result_printer());
  }
  int rc = RUN_ALL_TESTS();
  double failed = rc != 0 ? 1 : 0;
  comm->all_reduce_sum(&failed, 1);
  if (comm->rank() == 0) std::printf("zt_test_resume: %d rank(s), %d failed\n", comm->world(), int(failed));
  return failed > 0 ? 1 : 0;
}
