// Which backend runs a plan, and what to try when a plan does not fit: the decisions made before a
// Trainer exists (backend_choice.cpp; docs/design.md §3.8; runtime/support.h is the one table of
// what each backend supports).
#pragma once
#include <string>

#include "plan/plan.h"

namespace zt {

class Comm;  // comm/comm.h

// The backend train() will use for this plan on `world` ranks: "cpu-fp32", "cpu-bf16" (bf16 on a
// CPU with AVX512-BF16, oneDNN), "cuda-fp32" or "cuda-bf16". Throws (one clear line) when this build or machine cannot run it, so the caller
// can check before writing anything.
std::string choose_backend(const Plan& plan, int world);
// The same choice and checks for planning (train estimate): device "cuda" needs no GPU here, so that
// a GPU run can be sized on a machine without one (device "auto" still means a GPU only if one is here).
std::string planned_backend(const Plan& plan, int world);

// The comm backend for compute backend `backend` ("cpu-fp32", "cuda-*") on a host running `local_world`
// ranks that sees `gpus` GPUs (local rank r takes GPU r % gpus): "nccl" or "mpi". comm.backend
// "auto" is NCCL when each rank of the host has a GPU of its own, the host-staged MPI path when ranks
// share one (comm/host_mirror_comm.h), MPI on the CPU backend. "nccl" where ranks share a GPU, or on the
// CPU backend, throws one line naming the ranks and the GPU.
std::string comm_backend_for(const Plan& plan, const std::string& backend, int local_world, int gpus);
// The same on every rank of `comm` (collective): a refusal is one line for all ranks, and "auto"
// is NCCL only if it is NCCL on every host (the ranks must all run the same collectives). A world
// of one communicates nothing, so "auto" keeps it on the path that has run on a GPU ("mpi", which
// then stages nothing); "nccl" asked for explicitly still runs NCCL there.
std::string choose_comm_backend(const Plan& plan, const std::string& backend, Comm& comm);
// For planning (train estimate) on `world` ranks: a GPU per rank is assumed, as on the machine the
// run is planned for.
std::string planned_comm_backend(const Plan& plan, const std::string& backend, int world);

// The line printed at start for comm backend `comm_backend` ("nccl" or "mpi"); device: the CUDA backend.
std::string describe_comm_backend(const std::string& comm_backend, bool device);

// The CUDA backend: the GPU this rank runs on. Ranks on one host take its GPUs in turn (local rank
// modulo the count): with fewer GPUs than ranks, several ranks share one (their collectives are
// host-staged, comm/host_mirror_comm.h).
void select_gpu(const Comm& comm);

// The CPU threads (OpenMP and OpenBLAS) this rank computes with, set and returned: run.threads, or
// the CPUs the launcher gave this rank (runtime/launcher.h), not the whole host.
int use_rank_threads(const Plan& plan, const Comm& comm);

// The next rung of the memory ladder (docs/plans.md) for a run that did not fit: what to change in
// the plan, using only options this build runs.
std::string next_memory_step(const Plan& plan, int world);

}  // namespace zt
