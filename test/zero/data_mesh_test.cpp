// Hybrid sharding's mesh and traffic (src/zero/data_mesh.h, partition.h) against arithmetic written
// here: which ranks form a shard group and a replicate group, the one-line refusals of what does
// not run, and the bytes of the shard all-reduce across replicas, as the Comm byte model counts
// each all-reduce (comm.h: (2 e n) / R rounded down, per collective).
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "../plan/plan_testing.h"
#include "model/layout.h"
#include "zero/data_mesh.h"
#include "zero/partition.h"

namespace zt {
namespace {

using plan_test::error_of;
using plan_test::plan_with;

TEST(DataMesh, ConsecutiveShardGroupsReplicatedAcross) {
  const Plan p = plan_with({"zero.stage=3", "zero.shard_group=3"});
  for (int r = 0; r < 6; ++r) {
    const DataMesh m = DataMesh::of(p, 6, r, 0);
    EXPECT_EQ(m.shard, 3);
    EXPECT_EQ(m.replicas, 2);
    EXPECT_EQ(m.shard_rank(), r % 3) << r;  // {0,1,2} {3,4,5}
    EXPECT_EQ(m.replica(), r / 3) << r;     // replicate groups {0,3} {1,4} {2,5}
    EXPECT_TRUE(m.hybrid());
  }
  const DataMesh host = DataMesh::of(plan_with({"zero.stage=2", "zero.shard_group=host"}), 8, 5, 4);
  EXPECT_EQ(host.shard, 4);
  EXPECT_EQ(host.replicas, 2);
  const DataMesh world = DataMesh::of(plan_with({"zero.stage=1"}), 4, 2, 2);  // the default: "world"
  EXPECT_EQ(world.shard, 4);
  EXPECT_FALSE(world.hybrid());
  // S = W is plain ZeRO, as is stage 0 without replicas.
  EXPECT_FALSE(DataMesh::of(plan_with({"zero.shard_group=4"}), 4, 0, 0).hybrid());
}

TEST(DataMesh, RefusesInOneLine) {
  std::string e = error_of([] { DataMesh::of(plan_with({"zero.stage=3", "zero.shard_group=3"}), 4, 0, 0); });
  EXPECT_NE(e.find("zero.shard_group: 3 does not divide the world of 4 ranks"), std::string::npos) << e;
  e = error_of([] { DataMesh::of(plan_with({"zero.stage=3", "zero.shard_group=8"}), 4, 0, 0); });
  EXPECT_NE(e.find("8 does not divide the world of 4"), std::string::npos) << e;
  e = error_of([] { DataMesh::of(plan_with({"zero.stage=3", "zero.shard_group=host"}), 4, 0, 3); });
  EXPECT_NE(e.find("\"host\" (3 ranks per host) does not divide the world of 4"), std::string::npos) << e;
  e = error_of([] { DataMesh::of(plan_with({"zero.stage=3", "zero.shard_group=host"}), 4, 0, 0); });
  EXPECT_NE(e.find("--ranks-per-host"), std::string::npos) << e;
  e = error_of([] { DataMesh::of(plan_with({"zero.stage=0", "zero.shard_group=2"}), 4, 0, 0); });
  EXPECT_NE(e.find("needs zero.stage 1, 2 or 3"), std::string::npos) << e;
  e = error_of([] {
    DataMesh::of(plan_with({"zero.stage=3", "zero.shard_group=2", "offload.params=nvme", "offload.nvme_dir=/tmp"}), 4,
                 0, 0);
  });
  EXPECT_NE(e.find("offload.params \"nvme\" is not supported"), std::string::npos) << e;
  for (const char* bad : {"0", "-1", "banana", "", "1.5", "1234567"}) {
    e = error_of([&] { plan_with({std::string("zero.shard_group=") + bad}); });
    EXPECT_NE(e.find("zero.shard_group: must be \"world\", \"host\" or a number of ranks"), std::string::npos)
        << bad << ": " << e;
  }
  EXPECT_EQ(plan_with({"zero.shard_group=02"}).zero.shard_group, "2");
}

// A model whose shards (Ψ/S) are multiples of 128 but not of 3: the all-reduce's chunks differ by an
// element, and the count must be the byte model's, collective by collective.
TEST(DataMesh, ReplicaAllReduceBytes) {
  const GPTConfig cfg = GPTConfig::make(3, 5, 35, 31, 50257);
  for (int stage = 1; stage <= 3; ++stage)
    for (int S : {1, 2, 3}) {
      for (int R : {1, 2, 3}) {
        const ParamLayout layout(cfg, zero_pad_multiple(S), zero_embedding_rows(cfg, stage, S));
        ZeroConfig zc;
        zc.stage = stage, zc.world = S, zc.rank = 0, zc.replicas = R, zc.bucket_mb = 0.05, zc.grad_accum = 3;
        const Partition part(layout, zc);
        uint64_t want = 0;
        if (R > 1 && stage == 1) want = 2 * uint64_t(R - 1) * 4 * (layout.total() / S) / R;
        if (R > 1 && stage >= 2)
          for (const Bucket& b : part.buckets()) want += 2 * uint64_t(R - 1) * 4 * (b.numel / S) / R;
        EXPECT_EQ(part.bytes_per_step_replicas(), want) << stage << " " << S << " " << R;
        EXPECT_EQ(part.bytes_per_step(), part.bytes_per_step_shard_group() + want);
        // The all-reduces tile my shard: every element summed across replicas exactly once (in
        // backward's bucket order, so sorted first).
        std::vector<std::pair<size_t, size_t>> ars = part.replica_all_reduces();
        std::sort(ars.begin(), ars.end());
        size_t at = 0;
        for (const auto& [off, n] : ars) {
          EXPECT_EQ(off, at);
          at += n;
        }
        EXPECT_EQ(at, R > 1 ? part.shard_total() : 0);
        if (R > 1 && S == 1) EXPECT_NE(layout.total() % 3, 0u);  // the uneven case is exercised
      }
    }
}

}  // namespace
}  // namespace zt
