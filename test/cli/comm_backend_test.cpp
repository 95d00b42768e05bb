// comm.backend (train/backend_choice.h): which comm runs, what is refused and how it is recorded.
// CPU-only: the choice is a function of the plan, the compute backend, the ranks on a host and the
// GPUs it sees, so no GPU is needed to test it.
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "plan/plan.h"
#include "runtime/error.h"
#include "train/backend_choice.h"
#include "zero/estimate.h"

namespace {

const std::string kSrc = ZT_SOURCE_DIR;

zt::Plan plan_with(const std::vector<std::string>& sets) {
  return zt::load_plan(kSrc + "/plans/base.json", sets, false);
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const zt::Error& e) {
    return e.what();
  }
  return "";
}

TEST(CommBackend, BaseIsAuto) { EXPECT_EQ(plan_with({}).comm.backend, "auto"); }

TEST(CommBackend, AutoIsNcclOnlyWithAGpuPerRank) {
  const zt::Plan p = plan_with({});
  EXPECT_EQ(zt::comm_backend_for(p, "cpu-fp32", 4, 0), "mpi");
  EXPECT_EQ(zt::comm_backend_for(p, "cpu-fp32", 1, 8), "mpi");      // GPUs do not matter on the CPU backend
  EXPECT_EQ(zt::comm_backend_for(p, "cuda-fp32", 8, 8), "nccl");    // one rank per GPU
  EXPECT_EQ(zt::comm_backend_for(p, "cuda-bf16", 1, 1), "nccl");
  EXPECT_EQ(zt::comm_backend_for(p, "cuda-bf16", 2, 8), "nccl");    // fewer ranks than GPUs
  EXPECT_EQ(zt::comm_backend_for(p, "cuda-fp32", 2, 1), "mpi");     // sharing one GPU: host-staged
  EXPECT_EQ(zt::comm_backend_for(p, "cuda-bf16", 9, 8), "mpi");
}

TEST(CommBackend, ExplicitChoicesRunWhereTheyCan) {
  EXPECT_EQ(zt::comm_backend_for(plan_with({"comm.backend=mpi"}), "cuda-fp32", 8, 8), "mpi");
  EXPECT_EQ(zt::comm_backend_for(plan_with({"comm.backend=mpi"}), "cpu-fp32", 2, 0), "mpi");
  EXPECT_EQ(zt::comm_backend_for(plan_with({"comm.backend=nccl", "device=cuda"}), "cuda-bf16", 4, 4), "nccl");
}

TEST(CommBackend, NcclWithRanksSharingAGpuIsRefusedNamingThem) {
  const zt::Plan p = plan_with({"comm.backend=nccl", "device=cuda"});
  EXPECT_EQ(error_of([&] { zt::comm_backend_for(p, "cuda-fp32", 2, 1); }),
            "comm.backend: \"nccl\" needs a GPU per rank, but 2 ranks on this host share 1 GPU(s) (local ranks 0 "
            "and 1 on GPU 0); start at most 1 rank(s) per host, or set comm.backend to \"mpi\" or \"auto\" "
            "(host-staged over MPI)");
  EXPECT_EQ(error_of([&] { zt::comm_backend_for(p, "cuda-bf16", 9, 8); }),
            "comm.backend: \"nccl\" needs a GPU per rank, but 9 ranks on this host share 8 GPU(s) (local ranks 0 "
            "and 8 on GPU 0); start at most 8 rank(s) per host, or set comm.backend to \"mpi\" or \"auto\" "
            "(host-staged over MPI)");
}

TEST(CommBackend, NcclOnTheCpuIsRefused) {
  // device "cpu": refused with the plan, before a comm exists.
  EXPECT_EQ(error_of([&] { plan_with({"comm.backend=nccl", "device=cpu"}); }),
            "plan: comm.backend: \"nccl\" needs device \"cuda\" (NCCL moves device buffers, one GPU per rank); the CPU "
            "backend's collectives run over MPI: set comm.backend to \"mpi\" or \"auto\"");
  // device "auto" that found no GPU: refused when the backend is chosen.
  EXPECT_EQ(error_of([&] { zt::comm_backend_for(plan_with({"comm.backend=nccl"}), "cpu-fp32", 1, 0); }),
            "comm.backend: \"nccl\" needs the CUDA backend, and this run is on cpu-fp32 (NCCL moves device "
            "buffers); set comm.backend to \"mpi\" or \"auto\"");
}

TEST(CommBackend, WrongValuesAreRefused) {
  EXPECT_NE(error_of([&] { plan_with({"comm.backend=gloo"}); }).find("comm.backend"), std::string::npos);
  EXPECT_NE(error_of([&] { plan_with({"comm.backend=NCCL"}); }).find("comm.backend"), std::string::npos);
  EXPECT_NE(error_of([&] { plan_with({"comm.backend=1"}); }).find("comm.backend"), std::string::npos);
}

TEST(CommBackend, ResolvedPlanRecordsWhatRuns) {
  zt::Plan p = plan_with({});
  zt::record_comm_backend(p, "nccl");
  EXPECT_EQ(p.comm.backend, "nccl");
  EXPECT_EQ(p.resolved["comm"]["backend"], "nccl");
  // The recorded plan is a valid plan that makes the same choice again.
  const zt::Plan again = zt::plan_from_json(p.resolved, false);
  EXPECT_EQ(zt::comm_backend_for(again, "cuda-fp32", 2, 2), "nccl");
  zt::record_comm_backend(p, "mpi");
  EXPECT_EQ(p.resolved["comm"]["backend"], "mpi");
}

TEST(CommBackend, PlanningAssumesAGpuPerRank) {
  EXPECT_EQ(zt::planned_comm_backend(plan_with({}), "cuda-bf16", 8), "nccl");
  EXPECT_EQ(zt::planned_comm_backend(plan_with({}), "cpu-fp32", 8), "mpi");
  EXPECT_EQ(zt::planned_comm_backend(plan_with({"comm.backend=mpi"}), "cuda-fp32", 8), "mpi");
  // One rank communicates nothing: "auto" keeps the path that has run on a GPU; "nccl" is honoured.
  EXPECT_EQ(zt::planned_comm_backend(plan_with({}), "cuda-bf16", 1), "mpi");
  EXPECT_EQ(zt::planned_comm_backend(plan_with({"comm.backend=nccl", "device=cuda"}), "cuda-bf16", 1), "nccl");
}

// NCCL moves the device buffers themselves: the host-staged path's pinned fp32 mirrors go.
TEST(CommBackend, NcclHasNoHostStaging) {
  zt::Plan p = plan_with({"device=cuda", "zero.stage=2", "model.n_layer=2", "model.n_embd=64", "model.n_head=2",
                          "model.seq_len=64"});
  zt::record_backend(p, "cuda-fp32");
  auto pinned_comm = [&](const std::string& comm) {
    zt::record_comm_backend(p, comm);
    const zt::Estimate e = zt::estimate_plan(p, 2);
    const auto it = e.by_tier_category.find({zt::Tier::pinned, zt::Category::comm});
    return it == e.by_tier_category.end() ? size_t(0) : it->second;
  };
  EXPECT_GT(pinned_comm("mpi"), 0u);
  EXPECT_EQ(pinned_comm("nccl"), 0u);
}

}  // namespace
