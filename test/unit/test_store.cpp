// The model-state store's list (src/zero/store.h): what each stage keeps, and the global ranges
// each buffer holds.
#include <gtest/gtest.h>

#include <vector>

#include "model/layout.h"
#include "zero/partition.h"
#include "zero/store.h"

namespace zt {
namespace {

std::vector<StateId> ids(const std::vector<StateBuffer>& list) {
  std::vector<StateId> out;
  for (const StateBuffer& b : list) out.push_back(b.id);
  return out;
}

TEST(StateStore, EachStageListsItsBuffersOnce) {
  const GPTConfig cfg = GPTConfig::make(2, 2, 34, 16, 301);
  const ParamLayout layout(cfg, zero_pad_multiple(3));
  using S = StateId;
  const std::vector<std::vector<StateId>> want = {
      {S::params, S::grads, S::adam_m, S::adam_v},
      {S::params, S::grads, S::grad_shard, S::adam_m, S::adam_v},
      {S::params, S::grad_shard, S::adam_m, S::adam_v, S::embedding_staging, S::bucket_staging, S::rs_receive},
      {S::param_shard, S::grad_shard, S::adam_m, S::adam_v, S::embedding_staging, S::bucket_staging, S::rs_receive,
       S::gathered_units}};
  for (int stage = 0; stage < 4; ++stage) {
    ZeroConfig zc;
    zc.stage = stage; zc.world = 3; zc.rank = 1;
    const Partition part(layout, zc);
    EXPECT_EQ(ids(list_model_state(layout, part, StateTypes{})), want[size_t(stage)]) << "stage " << stage;
    // Mixed precision adds master weights (fp32) beside bf16 parameters.
    const auto mixed = list_model_state(layout, part, StateTypes{DType::bf16, DType::f32, Tier::device});
    bool master = false;
    for (const StateBuffer& b : mixed) {
      if (b.id == S::master) master = true;
      EXPECT_EQ(b.dtype, b.cat == Category::optimizer || b.cat == Category::master ? DType::f32 : DType::bf16);
    }
    EXPECT_TRUE(master);
  }
}

// Over all ranks, the parameter shards hold every element of every tensor exactly once, each at
// the place in its buffer where the partition puts it.
TEST(StateStore, ShardRangesCoverTheModelOnce) {
  const GPTConfig cfg = GPTConfig::make(2, 2, 34, 16, 301);
  for (int world : {1, 3, 4}) {
    const ParamLayout layout(cfg, zero_pad_multiple(world));
    std::vector<int> seen(layout.total(), 0);
    for (int rank = 0; rank < world; ++rank) {
      ZeroConfig zc;
      zc.stage = 3; zc.world = world; zc.rank = rank;
      const Partition part(layout, zc);
      for (const StateBuffer& b : list_model_state(layout, part, StateTypes{})) {
        if (b.id != StateId::param_shard) {
          if (b.cat == Category::comm) EXPECT_TRUE(b.holds.empty());
          continue;
        }
        ASSERT_TRUE(b.persistent);
        for (const TensorRange& r : b.holds) {
          const TensorSlot& s = layout.tensors()[size_t(r.tensor)];
          ASSERT_LE(r.offset + r.count, s.numel);
          ASSERT_LE(r.at + r.count, b.numel);
          for (size_t i = 0; i < r.count; ++i) {
            const size_t global = s.offset + r.offset + i;
            ++seen[global];
            // Position in the flat shard buffer: the unit's shard offset + the place within my shard.
            const int u = s.unit;
            EXPECT_EQ(r.at + i, part.unit_shard_flat(u) + (global - layout.units()[size_t(u)].offset -
                                                          part.unit_shard_begin(u)));
          }
        }
      }
    }
    for (const Unit& u : layout.units())
      for (size_t i = 0; i < u.padded; ++i) EXPECT_EQ(seen[u.offset + i], i < u.numel ? 1 : 0) << u.name << " " << i;
  }
}

}  // namespace
}  // namespace zt
