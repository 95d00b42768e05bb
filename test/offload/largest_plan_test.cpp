// plans/largest_gpu80.json: the largest GPT one machine with an 80 GB GPU, 128 GB of RAM and 64 GB of
// free disk trains by the estimate (docs/offload.md): the plan fits those numbers with room for what
// the estimate does not count, and the next size up (4 more layers) does not fit the host.
#include <gtest/gtest.h>

#include <string>

#include "plan/plan.h"
#include "zero/estimate.h"

namespace {
const std::string kPlan = std::string(ZT_SOURCE_DIR) + "/plans/largest_gpu80.json";
constexpr double GB = 1e9, GiB = double(1 << 30);

// The machine: 80 GB of GPU memory less the CUDA context and cuBLASLt workspace (563 MiB measured
// on an H100 and an H200, scripts/device/RESULTS.md) and 2 GiB for what the estimate leaves out
// (allocation rounding: 6-14 MiB measured); 128 GB of RAM less 12 GiB for the OS, the data loader
// and the page cache; 64 GB of disk.
constexpr double kDevice = 80 * GB - 563 * double(1 << 20) - 2 * GiB;
constexpr double kHost = 128 * GB - 12 * GiB;
constexpr double kDisk = 64 * GB;

struct Use {
  double device, host, disk;
};
Use use_of(const zt::Plan& p) {
  const zt::Estimate e = zt::estimate_plan(p, 1);
  return {double(e.tier_total(zt::Tier::device)),
          double(e.tier_total(zt::Tier::pinned) + e.tier_total(zt::Tier::host)),
          double(e.tier_total(zt::Tier::nvme))};
}

TEST(LargestPlan, Gpu80FitsTheMachine) {
  const zt::Plan p = zt::load_plan(kPlan, {}, false);
  const zt::Estimate e = zt::estimate_plan(p, 1);
  EXPECT_GT(e.num_params, size_t(6.5e9));
  const Use u = use_of(p);
  EXPECT_LE(u.device, kDevice) << u.device / GiB << " GiB";
  EXPECT_LE(u.host, kHost) << u.host / GiB << " GiB";
  EXPECT_LE(u.disk, kDisk);
  // The optimizer state is what the host holds; the device keeps no optimizer state.
  EXPECT_EQ(e.by_tier_category.count({zt::Tier::device, zt::Category::optimizer}), 0u);
}

// plans/largest_gpu80_nvme.json: the parameter and gradient shards on disk (offload.params "nvme"),
// so the host holds 12 bytes per parameter instead of 16: 44 layers, and 48 do not fit the host.
TEST(LargestPlan, Gpu80NvmeFitsTheMachine) {
  const std::string plan = std::string(ZT_SOURCE_DIR) + "/plans/largest_gpu80_nvme.json";
  const zt::Plan p = zt::load_plan(plan, {}, false);
  const zt::Estimate e = zt::estimate_plan(p, 1);
  EXPECT_GT(e.num_params, size_t(9e9));
  const Use u = use_of(p);
  EXPECT_LE(u.device, kDevice) << u.device / GiB << " GiB";
  EXPECT_LE(u.host, kHost) << u.host / GiB << " GiB";
  EXPECT_LE(u.disk, kDisk) << u.disk / GiB << " GiB";
  EXPECT_EQ(e.by_tier_category.count({zt::Tier::device, zt::Category::params}), 0u);
  EXPECT_GT(use_of(zt::load_plan(plan, {"model.n_layer=48"}, false)).host, kHost);
}

TEST(LargestPlan, Gpu80NextSizeDoesNotFit) {
  const zt::Plan p = zt::load_plan(kPlan, {"model.n_layer=36"}, false);
  EXPECT_GT(use_of(p).host, kHost);
  // Without offload the plan's own size does not fit the GPU.
  const zt::Plan none = zt::load_plan(kPlan, {"offload.optimizer=none"}, false);
  EXPECT_GT(use_of(none).device, kDevice);
}
}  // namespace
