// The out-of-memory advice: the next rung of the memory ladder names only options this build runs,
// and applying it gives a plan with the same tokens per step (or says why there is no such plan).
#include <gtest/gtest.h>

#include <regex>
#include <string>
#include <utility>
#include <vector>

#include "plan/plan.h"
#include "runtime/support.h"
#include "train/backend_choice.h"

namespace {
const std::string kBase = std::string(ZT_SOURCE_DIR) + "/plans/base.json";

// The numbers the advice proposes for `field`, read from its "field (a -> b)"; {-1, -1} if absent.
std::pair<int, int> proposed(const std::string& advice, const std::string& field) {
  std::smatch m;
  const std::regex re(std::regex_replace(field, std::regex("\\."), "\\.") + " \\((\\d+) -> (\\d+)\\)");
  if (!std::regex_search(advice, m, re)) return {-1, -1};
  return {std::stoi(m[1]), std::stoi(m[2])};
}

// Applies the advice to the plan (through the plan loader, so it must be a valid plan) and checks
// that it shrinks the micro-batch and keeps tokens per step exactly.
void expect_same_tokens_per_step(int micro_batch, int grad_accum) {
  SCOPED_TRACE("micro_batch " + std::to_string(micro_batch) + ", grad_accum " + std::to_string(grad_accum));
  const zt::Plan p = zt::load_plan(kBase, {"batch.micro_batch=" + std::to_string(micro_batch),
                                           "batch.grad_accum=" + std::to_string(grad_accum)}, false);
  const std::string advice = zt::next_memory_step(p, 1);
  const auto [mb_from, mb_to] = proposed(advice, "batch.micro_batch");
  const auto [ga_from, ga_to] = proposed(advice, "batch.grad_accum");
  ASSERT_EQ(mb_from, micro_batch) << advice;
  ASSERT_EQ(ga_from, grad_accum) << advice;
  EXPECT_LT(mb_to, mb_from) << advice;
  const zt::Plan q = zt::load_plan(kBase, {"batch.micro_batch=" + std::to_string(mb_to),
                                           "batch.grad_accum=" + std::to_string(ga_to)}, false);
  const int64_t Tn = p.model.seq_len;
  EXPECT_EQ(int64_t(q.batch.micro_batch) * Tn * q.batch.grad_accum, int64_t(p.batch.micro_batch) * Tn * p.batch.grad_accum)
      << advice;
}

TEST(MemoryLadder, EvenMicroBatchHalves) {
  expect_same_tokens_per_step(16, 2);
  const zt::Plan p = zt::load_plan(kBase, {"batch.micro_batch=16", "batch.grad_accum=2"}, false);
  const std::string s = zt::next_memory_step(p, 1);
  EXPECT_EQ(proposed(s, "batch.micro_batch"), std::make_pair(16, 8)) << s;
  EXPECT_EQ(proposed(s, "batch.grad_accum"), std::make_pair(2, 4)) << s;
}

// 3 -> 1 with grad_accum x2 would drop a third of the tokens per step: the factor must divide.
TEST(MemoryLadder, OddMicroBatchKeepsTokensPerStepExact) {
  const zt::Plan p = zt::load_plan(kBase, {"batch.micro_batch=3", "batch.grad_accum=1"}, false);
  const std::string s = zt::next_memory_step(p, 1);
  EXPECT_EQ(proposed(s, "batch.micro_batch"), std::make_pair(3, 1)) << s;
  EXPECT_EQ(proposed(s, "batch.grad_accum"), std::make_pair(1, 3)) << s;
  expect_same_tokens_per_step(3, 1);
  expect_same_tokens_per_step(9, 2);
  expect_same_tokens_per_step(7, 3);  // prime: all the way to 1
}

TEST(MemoryLadder, EveryMicroBatchKeepsTokensPerStep) {
  for (int mb = 2; mb <= 64; ++mb)
    for (int ga = 1; ga <= 3; ++ga) expect_same_tokens_per_step(mb, ga);
}

// docs/design.md §3.11: after the micro-batch, recompute more (selective, then block every block).
TEST(MemoryLadder, AtMicroBatchOneRecomputesMore) {
  const std::vector<std::pair<std::vector<std::string>, std::string>> rungs = {
      {{}, "recompute.policy to \"selective\""},
      {{"recompute.policy=selective"}, "recompute.policy to \"block\""},
      {{"recompute.policy=block", "recompute.every=2"}, "recompute.policy to \"block\" (recompute.every 1)"},
  };
  for (const auto& [sets, want] : rungs) {
    std::vector<std::string> all = {"batch.micro_batch=1"};
    all.insert(all.end(), sets.begin(), sets.end());
    const std::string s = zt::next_memory_step(zt::load_plan(kBase, all, false), 4);
    EXPECT_NE(s.find(want), std::string::npos) << s;
  }
}

TEST(MemoryLadder, AtMicroBatchOneShardsMoreOrShrinks) {
  const zt::Plan p = zt::load_plan(kBase, {"batch.micro_batch=1", "zero.stage=1", "recompute.policy=block"}, false);
  const std::string multi = zt::next_memory_step(p, 4);
  EXPECT_NE(multi.find("zero.stage to 2"), std::string::npos) << multi;
  const std::string single = zt::next_memory_step(p, 1);  // one rank: sharding saves nothing
  EXPECT_NE(single.find("offload.optimizer"), std::string::npos) << single;
}

// After sharding, the offload rungs (only what the backend runs, the stage raised where offload
// needs a shard); each advice, applied, is a plan the loader and the backend accept; then the model.
void expect_rungs(std::vector<std::string> sets, int world,
                  const std::vector<std::pair<std::string, std::vector<std::string>>>& rungs) {
  for (const auto& [want, apply] : rungs) {
    const zt::Plan p = zt::load_plan(kBase, sets, false);
    const std::string s = zt::next_memory_step(p, world);
    ASSERT_NE(s.find(want), std::string::npos) << s;
    if (p.device == "cpu")  // the CPU backend keeps everything in host memory already
      EXPECT_EQ(s.find("offload.params to \"cpu\""), std::string::npos) << s;
    sets.insert(sets.end(), apply.begin(), apply.end());
    const zt::Plan q = zt::load_plan(kBase, sets, false);  // throws if the advice made a bad plan
    if (zt::support::backend(q.device == "cuda" ? "cuda-bf16" : "cpu-fp32").built)
      EXPECT_NO_THROW(zt::planned_backend(q, world)) << s;
  }
  const std::string last = zt::next_memory_step(zt::load_plan(kBase, sets, false), world);
  EXPECT_NE(last.find("seq_len"), std::string::npos) << last;
}

TEST(MemoryLadder, OffloadRungsOnTheCpuBackend) {
  expect_rungs({"device=cpu", "batch.micro_batch=1", "recompute.policy=block"}, 1,
               {{"set zero.stage to 1 and offload.optimizer to \"nvme\"", {"zero.stage=1", "offload.optimizer=nvme"}},
                {"set zero.stage to 3 and offload.params to \"nvme\"", {"zero.stage=3", "offload.params=nvme"}}});
  expect_rungs({"device=cpu", "batch.micro_batch=1", "recompute.policy=block", "zero.stage=3"}, 4,
               {{"set offload.optimizer to \"nvme\"", {"offload.optimizer=nvme"}},
                {"set offload.params to \"nvme\"", {"offload.params=nvme"}}});
}

// The GPU's rungs move the optimizer state to pinned host memory, then the parameter and gradient
// shards (stage 3, beside the CPU AdamW: the only parameter offload the CUDA backend runs).
TEST(MemoryLadder, OffloadRungsOnTheCudaBackend) {
  expect_rungs({"device=cuda", "batch.micro_batch=1", "recompute.policy=block", "zero.stage=3"}, 4,
               {{"set offload.optimizer to \"cpu\"", {"offload.optimizer=cpu"}},
                {"set offload.params to \"cpu\"", {"offload.params=cpu"}}});
  expect_rungs({"device=cuda", "batch.micro_batch=1", "recompute.policy=block"}, 1,
               {{"set zero.stage to 1 and offload.optimizer to \"cpu\"", {"zero.stage=1", "offload.optimizer=cpu"}},
                {"set zero.stage to 3 and offload.params to \"cpu\"", {"zero.stage=3", "offload.params=cpu"}}});
}
}  // namespace
