// `train estimate` with comm.backend "nccl" (zero/estimate.h CommEstimate): no pinned mirrors where
// the host-staged path has them, NCCL's own buffers as a labelled approximation, the bytes per step
// of the NCCL path. Needs a CUDA build (the CUDA backend's sizes), not a GPU.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "plan/plan.h"
#include "train/backend_choice.h"
#include "zero/estimate.h"

namespace {

#if ZT_HAVE_CUDA
// As train.cu's estimate command resolves a plan: the backends a run would take, no GPU needed.
zt::Estimate estimate(const std::vector<std::string>& sets, int world) {
  zt::Plan p = zt::load_plan(std::string(ZT_SOURCE_DIR) + "/plans/default.json", sets, false);
  const std::string backend = zt::planned_backend(p, world);
  zt::record_backend(p, backend);
  zt::record_comm_backend(p, zt::planned_comm_backend(p, backend, world));
  return zt::estimate_plan(p, world);
}

bool has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

TEST(EstimateNccl, NoPinnedMirrorsWhereTheHostStagedPathPinsThem) {
  const zt::Estimate n = estimate({"device=cuda", "comm.backend=nccl", "zero.stage=2"}, 8);
  const zt::Estimate m = estimate({"device=cuda", "comm.backend=mpi", "zero.stage=2"}, 8);
  ASSERT_EQ(n.comm.backend, "nccl");
  ASSERT_EQ(m.comm.backend, "mpi");
  EXPECT_EQ(n.comm.pinned_staging, 0u);
  EXPECT_EQ(n.tier_total(zt::Tier::pinned), 0u);
  EXPECT_GT(m.comm.pinned_staging, 0u);
  EXPECT_EQ(n.comm.host_staged_pinned, m.comm.pinned_staging);  // the comparison line is the real mirror size
  EXPECT_EQ(m.comm.host_staged_pinned, m.comm.pinned_staging);
  // Everything else is the same store: only the pinned mirrors differ.
  EXPECT_EQ(n.tier_total(zt::Tier::device), m.tier_total(zt::Tier::device));
}

TEST(EstimateNccl, NcclsOwnBuffersAreALabelledApproximation) {
  const zt::Estimate e = estimate({"device=cuda", "comm.backend=nccl"}, 8);
  // 32 channels x 2 connections x (Simple 4 MiB + LL128 120*640*8*8 + LL 8*512*8*16).
  EXPECT_EQ(e.comm.nccl_conn_bytes, 4194304u + 4915200u + 524288u);
  EXPECT_EQ(e.comm.nccl_internal, 32u * 2u * 9633792u);
  const std::string t = zt::estimate_text(e);
  EXPECT_TRUE(has(t, "comm: nccl (device buffers, no host copies): pinned host staging 0 B")) << t;
  EXPECT_TRUE(has(t, "NCCL's own device buffers (not allocated or tracked by zerotrain")) << t;
  EXPECT_TRUE(has(t, "approximate, from NCCL's defaults, not measured on a GPU): ~588.00 MiB")) << t;
  EXPECT_TRUE(has(t, "= 32 channels x 2 connections x 9633792 bytes")) << t;
  const nlohmann::json j = zt::estimate_json(e);
  EXPECT_EQ(j["comm"]["backend"], "nccl");
  EXPECT_EQ(j["comm"]["pinned_staging_bytes"], 0);
  EXPECT_EQ(j["comm"]["nccl_internal_bytes_approx"], e.comm.nccl_internal);
  EXPECT_FALSE(j["memory"].contains("pinned"));  // the approximation stays out of the tracked table
  // One rank has no peer to connect.
  const zt::Estimate one = estimate({"device=cuda", "comm.backend=nccl"}, 1);
  EXPECT_EQ(one.comm.nccl_internal, 0u);
  EXPECT_TRUE(has(zt::estimate_text(one), "NCCL's own device buffers: none")) << zt::estimate_text(one);
}

TEST(EstimateNccl, BytesPerStepAreTheNcclPathsTheory) {
  // Stage 0, N = 8, bf16: an all-reduce of the padded parameters, 2 Ψ (N-1)/N x 2 bytes.
  const zt::Estimate e = estimate({"device=cuda", "comm.backend=nccl"}, 8);
  EXPECT_EQ(e.bytes_per_step, 2 * (e.padded_params / 8) * 7 * 2);
  EXPECT_TRUE(has(zt::estimate_text(e), "sent per rank per optimizer step (nccl): ")) << zt::estimate_text(e);
  // fp32: 4 bytes an element on the wire.
  const zt::Estimate f = estimate({"device=cuda", "comm.backend=nccl", "precision.compute=fp32"}, 8);
  EXPECT_EQ(f.bytes_per_step, 2 * (f.padded_params / 8) * 7 * 4);
}

TEST(EstimateNccl, TheHostStagedPathSaysSo) {
  const std::string t = zt::estimate_text(estimate({"device=cuda", "comm.backend=mpi"}, 2));
  EXPECT_TRUE(has(t, "comm: mpi (device buffers host-staged through pinned memory): pinned host staging ")) << t;
  EXPECT_FALSE(has(t, "NCCL's own")) << t;
  EXPECT_TRUE(has(t, "sent per rank per optimizer step (mpi): ")) << t;
}
#else
TEST(EstimateNccl, NeedsTheCudaBuild) { GTEST_SKIP() << "no CUDA toolchain: the estimate models the CPU backend"; }
#endif

}  // namespace
