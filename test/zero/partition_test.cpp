// Partition and bucket formation (src/zero/partition.h) against arithmetic written here, for every
// stage at N = 1..5 and 8, on a model whose embedding stage 3 splits into chunks:
//   - each unit is padded by less than lcm(N, 128) to a multiple of it, and the ranks' shards tile
//     it: every element in exactly one shard, real elements per rank differing by at most the padding;
//   - the flat shard buffers concatenate the units' shards in unit order, Ψ/N in all;
//   - buckets cover the units once, in backward order (U-1 .. 0), each a contiguous range of the
//     flat buffer; a bucket of blocks closes as soon as it reaches bucket_mb (only the last may be
//     smaller), each embedding unit is a bucket of its own, and without overlap every unit is.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <vector>

#include "model/layout.h"
#include "zero/partition.h"

namespace zt {
namespace {

// 5 blocks of 12C² + 13C = 14314 elements (C = 34) and a vocabulary (3001, padded 3072) larger
// than a block's worth of rows, so stage 3 at N > 1 splits the embedding.
const GPTConfig kCfg = GPTConfig::make(5, 2, 34, 16, 3001);
const int kWorlds[] = {1, 2, 3, 4, 5, 8};

ParamLayout layout_for(int stage, int world) {
  return ParamLayout(kCfg, zero_pad_multiple(world), zero_embedding_rows(kCfg, stage, world));
}

Partition partition(const ParamLayout& layout, int stage, int world, int rank, double bucket_mb = 25,
                    bool overlap = true) {
  ZeroConfig zc;
  zc.stage = stage, zc.world = world, zc.rank = rank, zc.bucket_mb = bucket_mb, zc.overlap = overlap;
  return Partition(layout, zc);
}

TEST(Partition, EveryElementInExactlyOneShard) {
  for (int stage = 0; stage < 4; ++stage)
    for (int N : kWorlds) {
      const ParamLayout layout = layout_for(stage, N);
      const size_t pad = std::lcm(size_t(N), size_t(128));
      if (stage == 3 && N > 1) EXPECT_GT(layout.embedding_units(), 1) << "the model must split at stage 3";
      std::vector<Partition> ranks;
      for (int r = 0; r < N; ++r) ranks.push_back(partition(layout, stage, N, r));
      size_t flat = 0, total = 0;
      for (int u = 0; u < layout.num_units(); ++u) {
        const Unit& unit = layout.units()[size_t(u)];
        const size_t padded = ranks[0].unit_padded(u);
        EXPECT_EQ(padded % pad, 0u);
        EXPECT_GE(padded, unit.numel);
        EXPECT_LT(padded - unit.numel, pad) << "unit " << unit.name;
        // The ranks' shards, in rank order, tile [0, padded): each element in exactly one.
        size_t next = 0, real_lo = padded, real_hi = 0;
        for (int r = 0; r < N; ++r) {
          const Partition& p = ranks[size_t(r)];
          const size_t b = p.unit_shard_begin(u), n = p.unit_shard_numel(u);
          EXPECT_EQ(b, next) << "stage " << stage << " N " << N << " rank " << r << " unit " << unit.name;
          next = b + n;
          const size_t real = unit.numel > b ? std::min(n, unit.numel - b) : 0;
          real_lo = std::min(real_lo, real), real_hi = std::max(real_hi, real);
          EXPECT_EQ(p.unit_shard_flat(u), flat) << "rank " << r << " unit " << unit.name;
        }
        EXPECT_EQ(next, padded) << "stage " << stage << " N " << N << " unit " << unit.name;
        EXPECT_LE(real_hi - real_lo, padded - unit.numel) << "unit " << unit.name;
        flat += padded / size_t(N), total += padded;
      }
      EXPECT_EQ(ranks[0].total(), total);
      EXPECT_EQ(ranks[0].shard_total(), flat);
      EXPECT_EQ(flat * size_t(N), total);
    }
}

// Checks the buckets of one partition; bucket_elems = bucket_mb in fp32 elements.
void expect_buckets(const ParamLayout& layout, const Partition& p, size_t bucket_elems, bool overlap) {
  const int U = layout.num_units(), E = layout.embedding_units(), N = p.config().world;
  std::vector<int> order;
  size_t blocks_closed_under = 0;  // buckets of blocks smaller than bucket_elems (only the last may be)
  const std::vector<Bucket>& buckets = p.buckets();
  for (size_t i = 0; i < buckets.size(); ++i) {
    const Bucket& b = buckets[i];
    ASSERT_FALSE(b.units.empty());
    size_t numel = 0;
    for (size_t k = 0; k < b.units.size(); ++k) {
      const int u = b.units[k];
      if (k > 0) EXPECT_EQ(u, b.units[k - 1] - 1) << "bucket " << i << ": consecutive units, descending";
      EXPECT_EQ(p.bucket_of(u), int(i));
      order.push_back(u);
      numel += p.unit_padded(u);
    }
    const int lowest = b.units.back();
    EXPECT_EQ(b.numel, numel) << "bucket " << i;
    EXPECT_EQ(b.shard_numel * size_t(N), b.numel);
    EXPECT_EQ(b.offset, layout.units()[size_t(lowest)].offset);
    EXPECT_EQ(b.offset + b.numel, layout.units()[size_t(b.units.front())].offset + p.unit_padded(b.units.front()))
        << "bucket " << i << " is one range of the flat buffer";
    if (lowest < E || !overlap) {
      EXPECT_EQ(b.units.size(), 1u) << "bucket " << i << ": an embedding unit, or no overlap, is a bucket alone";
      continue;
    }
    // A bucket of blocks closes on the unit that makes it reach bucket_elems.
    EXPECT_LT(b.numel - p.unit_padded(lowest), bucket_elems) << "bucket " << i << " closed late";
    if (b.numel < bucket_elems) ++blocks_closed_under;
    if (b.numel < bucket_elems) EXPECT_TRUE(i + 1 == buckets.size() || buckets[i + 1].units.front() < E)
        << "bucket " << i << " is under bucket_mb but not the last of the blocks";
  }
  EXPECT_LE(blocks_closed_under, 1u);
  std::vector<int> want(static_cast<size_t>(U));
  for (int u = 0; u < U; ++u) want[size_t(u)] = U - 1 - u;
  EXPECT_EQ(order, want) << "every unit once, in backward order";
}

TEST(Partition, BucketsCoverUnitsInBackwardOrderAndRespectBucketMb) {
  // A block is 14336 padded elements (57 KB): 0.1 MiB buckets hold two or three units, 1e-9 MiB one
  // (every unit reaches it), 1e6 MiB every block and the final norm.
  for (double mb : {1e-9, 0.05, 0.1, 0.3, 1e6})
    for (int stage = 0; stage < 4; ++stage)
      for (int N : kWorlds)
        for (bool overlap : {true, false}) {
          SCOPED_TRACE(testing::Message() << "bucket_mb " << mb << " stage " << stage << " N " << N
                                          << " overlap " << overlap);
          const ParamLayout layout = layout_for(stage, N);
          const Partition p = partition(layout, stage, N, N - 1, mb, overlap);
          const size_t bucket_elems = std::max<size_t>(1, size_t(mb * 1024 * 1024) / 4);
          expect_buckets(layout, p, bucket_elems, overlap);
          const size_t E = size_t(layout.embedding_units()), blocks = size_t(layout.num_units()) - E;
          if (!overlap || mb < 1e-6) EXPECT_EQ(p.buckets().size(), E + blocks);  // one unit each
          if (overlap && mb >= 1e6) EXPECT_EQ(p.buckets().size(), E + 1);        // all blocks in one
        }
}

}  // namespace
}  // namespace zt
