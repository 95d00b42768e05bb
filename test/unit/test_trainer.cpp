// The out-of-memory advice: the next rung of the memory ladder names only options this build runs,
// and applying it gives a plan with the same tokens per step (or says why there is no such plan).
#include <gtest/gtest.h>

#include <string>

#include "plan/plan.h"
#include "train/trainer.h"

namespace {
const std::string kBase = std::string(ZT_SOURCE_DIR) + "/plans/base.json";

TEST(MemoryLadder, HalvesMicroBatchKeepingTokensPerStep) {
  const zt::Plan p = zt::load_plan(kBase, {"batch.micro_batch=16", "batch.grad_accum=2"}, false);
  const std::string s = zt::next_memory_step(p, 1);
  EXPECT_NE(s.find("batch.micro_batch (16 -> 8)"), std::string::npos) << s;
  EXPECT_NE(s.find("batch.grad_accum (2 -> 4)"), std::string::npos) << s;
  // The advice is a valid plan with the same tokens per step.
  const zt::Plan q = zt::load_plan(kBase, {"batch.micro_batch=8", "batch.grad_accum=4"}, false);
  EXPECT_EQ(q.batch.micro_batch * q.batch.grad_accum, p.batch.micro_batch * p.batch.grad_accum);
}

TEST(MemoryLadder, AtMicroBatchOneShardsMoreOrShrinks) {
  const zt::Plan p = zt::load_plan(kBase, {"batch.micro_batch=1", "zero.stage=1"}, false);
  const std::string multi = zt::next_memory_step(p, 4);
  EXPECT_NE(multi.find("zero.stage to 2"), std::string::npos) << multi;
  const std::string single = zt::next_memory_step(p, 1);  // one rank: sharding saves nothing
  EXPECT_NE(single.find("seq_len"), std::string::npos) << single;
  const zt::Plan s3 = zt::load_plan(kBase, {"batch.micro_batch=1", "zero.stage=3"}, false);
  EXPECT_NE(zt::next_memory_step(s3, 4).find("seq_len"), std::string::npos);
}
}  // namespace
