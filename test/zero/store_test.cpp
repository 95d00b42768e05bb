// The model-state store's list (src/zero/store.h): what each stage keeps, and the global ranges
// each buffer holds.
#include <gtest/gtest.h>

#include <map>
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
    size_t staged = 0, mirror = 0;
    for (const StateBuffer& b : mixed) {
      if (b.id == S::master) master = true;
      for (StateId id : host_mirrored(stage)) staged += b.id == id ? b.numel : 0;
      if (b.id == S::host_mirrors) {  // the CUDA backend's pinned fp32 mirrors of what collectives touch
        EXPECT_EQ(b.tier, Tier::pinned);
        EXPECT_EQ(b.dtype, DType::f32);
        mirror = b.numel;
        continue;
      }
      EXPECT_EQ(b.dtype, b.cat == Category::optimizer || b.cat == Category::master ? DType::f32 : DType::bf16);
    }
    EXPECT_TRUE(master);
    EXPECT_GT(staged, 0u);
    EXPECT_EQ(mirror, staged) << "stage " << stage;
    // One rank sends nothing: no mirror.
    ZeroConfig one = zc;
    one.world = 1, one.rank = 0;
    const ParamLayout layout1(cfg, zero_pad_multiple(1));
    for (const StateBuffer& b : list_model_state(layout1, Partition(layout1, one), StateTypes{DType::bf16, DType::f32, Tier::device}))
      EXPECT_NE(b.id, S::host_mirrors);
    // The CUDA backend's AdamW on the host (offload.optimizer "cpu"): moments and master pinned, plus
    // pinned host copies of my parameter and gradient shard.
    if (stage == 0) continue;
    StateTypes host{DType::bf16, DType::f32, Tier::device};
    host.host_optimizer = true;
    int copies = 0;
    for (const StateBuffer& b : list_model_state(layout, part, host)) {
      if (b.cat == Category::optimizer || b.cat == Category::master) EXPECT_EQ(b.tier, Tier::pinned);
      if (b.id == S::host_params || b.id == S::host_grads) {
        ++copies;
        EXPECT_EQ(b.tier, Tier::pinned);
        EXPECT_EQ(b.numel, part.shard_total());
      }
    }
    EXPECT_EQ(copies, 2);
  }
}

// GPT-2 124M at stage 3 (docs/design.md §3.9): no buffer is embedding-sized. The tied embedding
// (50304 + 1024 rows of 768) is six units, none larger than a block (12 * 768^2 + 13 * 768 =
// 7,087,872 elements, a multiple of 128), so the gather slots are (prefetch + 1) blocks and the
// gradient staging two buckets of one block (zero.bucket_mb 25 MiB is less than a block), the
// largest with the final norm (2 * 768) in it.
TEST(StateStore, Gpt2Stage3HoldsOnlyBlockSizedSlots) {
  const GPTConfig cfg = GPTConfig::make(12, 12, 768, 1024, 50257);
  const size_t block = 7087872, embedding = size_t(50304 + 1024) * 768, bucket = block + 2 * 768;
  for (int world : {2, 8}) {
    const int rows = zero_embedding_rows(cfg, 3, world);
    EXPECT_EQ(rows, 9229);  // 7,087,872 / 768: a block's worth of rows
    EXPECT_EQ(zero_embedding_rows(cfg, 2, world), 0);
    EXPECT_EQ(zero_embedding_rows(cfg, 3, 1), 0);  // one rank shards nothing
    const ParamLayout layout(cfg, zero_pad_multiple(world), rows);
    EXPECT_EQ(layout.embedding_units(), 6);
    ZeroConfig zc;
    zc.stage = 3; zc.world = world; zc.prefetch_units = 1;
    const Partition part(layout, zc);
    for (int u = 0; u < layout.num_units(); ++u) EXPECT_LE(part.unit_padded(u), block) << layout.units()[size_t(u)].name;
    EXPECT_EQ(part.max_unit_padded(), block);
    EXPECT_EQ(part.gather_slots_numel(), 2 * block);
    EXPECT_EQ(part.staging_slot_numel(), bucket);
    EXPECT_EQ(part.embedding_staging_numel(), 0u);
    std::map<StateId, size_t> n;
    for (const StateBuffer& b : list_model_state(layout, part, StateTypes{})) n[b.id] = b.numel;
    EXPECT_EQ(n.count(StateId::embedding_staging), 0u);
    EXPECT_EQ(n[StateId::bucket_staging], 2 * bucket);
    EXPECT_EQ(n[StateId::rs_receive], 2 * bucket / size_t(world));
    EXPECT_EQ(n[StateId::gathered_units], 2 * block);
    // Per micro-step: gather 2Ψ, the LM head's first five chunks (5 blocks of rows) again, RS Ψ.
    const uint64_t psi = 124475904;
    EXPECT_EQ(part.bytes_per_step(), uint64_t(world - 1) * 4 * (3 * psi + 5 * block) / uint64_t(world));
    // Stage 2 keeps the embedding one unit, staged in a slot of its own.
    zc.stage = 2;
    const ParamLayout one(cfg, zero_pad_multiple(world));
    EXPECT_EQ(Partition(one, zc).embedding_staging_numel(), embedding);
  }
}

// Over all ranks, the parameter shards hold every element of every tensor exactly once, each at
// the place in its buffer where the partition puts it (the embedding one unit, or in chunks).
TEST(StateStore, ShardRangesCoverTheModelOnce) {
  const GPTConfig cfg = GPTConfig::make(2, 2, 34, 16, 3001);
  for (int world : {1, 3, 4})
  for (int rows : {0, ParamLayout::block_sized_rows(cfg, zero_pad_multiple(world))}) {
    const ParamLayout layout(cfg, zero_pad_multiple(world), rows);
    if (rows > 0) EXPECT_GT(layout.embedding_units(), 3);
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
            int u = s.unit;
            while (global >= layout.units()[size_t(u)].offset + layout.units()[size_t(u)].padded) ++u;
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
