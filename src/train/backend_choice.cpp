// Which backend runs a plan, and what to try when a plan does not fit (declared in backend_choice.h).
#include "train/backend_choice.h"

#include <algorithm>
#include <cstdint>
#include <sstream>
#include <string>

#include <cblas.h>
#include <omp.h>

#include "comm/comm.h"
#include "kernels/matmul_bf16.h"
#include "runtime/device.h"
#include "runtime/error.h"
#include "runtime/launcher.h"
#include "runtime/support.h"
#if ZT_HAVE_CUDA
#include "runtime/cuda_context.h"
#endif

namespace zt {

namespace {
// device "auto" is the GPU when this build has the CUDA backend and one is visible.
std::string resolve_device(const Plan& plan) {
  if (plan.device != "auto") return plan.device;
  return device::available() ? "cuda" : "cpu";
}

// The offload rungs (docs/offload.md), after sharding: the optimizer state off the device (CUDA:
// pinned host memory, the CPU runs AdamW) or out of host memory (CPU backend: swap files), then the
// parameter and gradient shards too (CUDA: pinned, beside the CPU AdamW; CPU backend: swap files). Offload needs a shard (zero.stage >= 1;
// parameters: 3), so the rung raises the stage where it must. "" when no offload this build runs is left.
std::string next_offload_step(const Plan& plan) {
  const bool gpu = resolve_device(plan) == "cuda";
  std::ostringstream os;
  if (plan.offload.optimizer == "none") {
    if (plan.zero.stage == 0) os << "set zero.stage to 1 and ";
    else os << "set ";
    if (gpu)
      os << "offload.optimizer to \"cpu\": the AdamW moments and master weights in pinned host memory, "
            "updated by the CPU, not on the GPU";
    else
      os << "offload.optimizer to \"nvme\": the AdamW moments in swap files under offload.nvme_dir ("
         << plan.offload.nvme_dir << ")";
  } else if (gpu && plan.offload.optimizer == "cpu" && plan.offload.params == "none") {
    // The CUDA backend's parameter offload needs the CPU AdamW (train/offload_setup.cpp).
    if (plan.zero.stage < 3) os << "set zero.stage to 3 and ";
    else os << "set ";
    os << "offload.params to \"cpu\": the parameter and gradient shards in pinned host memory too";
  } else if (!gpu && plan.offload.params == "none") {
    if (plan.zero.stage < 3) os << "set zero.stage to 3 and ";
    else os << "set ";
    os << "offload.params to \"nvme\": the parameter and gradient shards in swap files too";
  }
  return os.str();
}
}  // namespace

int use_rank_threads(const Plan& plan, const Comm& comm) {
  const int threads =
      plan.run.threads > 0 ? plan.run.threads : threads_per_rank(this_launch(), affinity_cpus(), comm.local_world());
  omp_set_num_threads(threads);
  openblas_set_num_threads(threads);
  return threads;
}

void select_gpu(const Comm& comm) {
#if ZT_HAVE_CUDA
  int gpus = 0;
  ZT_CHECK_CUDA(cudaGetDeviceCount(&gpus));
  cuda::Context::select(comm.local_rank() % std::max(1, gpus));
#else
  (void)comm;
#endif
}

std::string next_memory_step(const Plan& plan, int world) {
  std::ostringstream os;
  const int mb = plan.batch.micro_batch, ga = plan.batch.grad_accum;
  // The smallest factor f of micro_batch: the smallest step down that keeps micro_batch x
  // grad_accum, and so tokens per step, exact (3 -> 1 needs grad_accum x 3, not x 2).
  int f = 2;
  while (mb > 1 && mb % f != 0) ++f;
  if (mb > 1 && f == 2)
    os << "halve batch.micro_batch (" << mb << " -> " << mb / 2 << ") and double batch.grad_accum (" << ga << " -> "
       << ga * 2 << "): same tokens per step, half the activations";
  else if (mb > 1)
    os << "lower batch.micro_batch (" << mb << " -> " << mb / f << ") and raise batch.grad_accum (" << ga << " -> "
       << ga * f << ") by the same factor " << f << ": same tokens per step, 1/" << f << " of the activations";
  else if (plan.recompute.policy == "none")
    os << "set recompute.policy to \"selective\": LayerNorm and GELU outputs recomputed in backward, fewer activations";
  else if (plan.recompute.policy != "block" || plan.recompute.every > 1)
    os << "set recompute.policy to \"block\" (recompute.every 1): only each block's input kept, its forward rerun "
          "in backward";
  else if (world > 1 && plan.zero.stage < 3)
    os << "raise zero.stage to " << plan.zero.stage + 1 << " to shard more model state across the " << world << " ranks";
  else if (const std::string off = next_offload_step(plan); !off.empty())
    os << off;
  else
    os << "shorten model.seq_len or use a smaller model: micro_batch 1 does not fit";
  return os.str();
}

namespace {

// What backend b cannot run (runtime/support.h) is refused here, on any machine.
void check_backend_limits(const support::Backend& b, const Plan& plan, int world) {
  const std::string on = " on device \"" + b.device + "\"";
  ZT_REQUIRE(b.built, "device: \"" << b.device << "\" but this build has no " << b.library << " backend");
  ZT_REQUIRE(b.max_world == 0 || world <= b.max_world,
             "device: \"" << b.device << "\" with " << world << " ranks is not supported by this build yet (supported: "
                          << b.world_note << ")");
  ZT_REQUIRE(std::find(b.zero_stages.begin(), b.zero_stages.end(), plan.zero.stage) != b.zero_stages.end(),
             "zero.stage: " << plan.zero.stage << on << " is not supported by this build yet (supported: "
                            << support::join(b.zero_stages) << b.stage_note << ")");
  const int C = plan.model.n_embd, hs = C / plan.model.n_head;
  ZT_REQUIRE(C % b.n_embd_multiple == 0,
             "model.n_embd: " << C << " must be a multiple of " << b.n_embd_multiple << on << " (" << b.n_embd_note << ")");
  ZT_REQUIRE(b.head_sizes.empty() || std::find(b.head_sizes.begin(), b.head_sizes.end(), hs) != b.head_sizes.end(),
             "model: head size n_embd/n_head = " << hs << " is not supported by the " << b.library
                                                 << " attention kernels (supported: " << support::join(b.head_sizes) << ")");
  const int64_t TC = int64_t(plan.model.seq_len) * C, BNH = int64_t(plan.batch.micro_batch) * plan.model.n_head;
  ZT_REQUIRE(b.max_seq_x_embd == 0 || TC <= b.max_seq_x_embd,
             "model: seq_len x n_embd = " << TC << on << " is more than its kernels index in 32 bits (at most "
                                          << b.max_seq_x_embd << ")");
  ZT_REQUIRE(b.max_batch_x_heads == 0 || BNH <= b.max_batch_x_heads,
             "batch.micro_batch: micro_batch x model.n_head = " << BNH << on
                                                                << " is more than its kernels index in 32 bits (at most "
                                                                << b.max_batch_x_heads << ")");
}

// need_device: the run is here (choose_backend), not planned for another machine (planned_backend).
std::string pick_backend(const Plan& plan, int world, bool need_device) {
  const std::string dev = resolve_device(plan);
  if (dev == "cpu") {
    if (plan.precision.compute != "bf16") {
      check_backend_limits(support::backend("cpu-fp32"), plan, world);
      return "cpu-fp32";
    }
    // bf16 on the CPU (device "cpu", or "auto" without a GPU): oneDNN's bf16 products, on a CPU that
    // has them; training in fp32 instead would silently be another run than the one asked for.
    const std::string why = plan.device == "auto" ? "device \"auto\" found no GPU, and " : "";
    ZT_REQUIRE(cpu::bf16::built(), "precision.compute: \"bf16\": " << why << "this build's CPU backend has no bf16 "
               "products (oneDNN, libdnnl-dev, was not found at configure time); set precision.compute to \"fp32\"");
    ZT_REQUIRE(cpu::bf16::cpu_supported(), "precision.compute: \"bf16\": " << why << "this CPU has no "
               << cpu::bf16::required_isa() << " for the CPU backend's bf16 products; set precision.compute to \"fp32\"");
    check_backend_limits(support::backend("cpu-bf16"), plan, world);
    return "cpu-bf16";
  }
  // What the CUDA path cannot run is refused first, on any machine; then whether a GPU is there.
  const std::string name = plan.precision.compute == "fp32" ? "cuda-fp32" : "cuda-bf16";
  check_backend_limits(support::backend(name), plan, world);
  ZT_REQUIRE(!need_device || device::available(), "device: \"cuda\" but no CUDA device is visible (check nvidia-smi and "
                                                  "CUDA_VISIBLE_DEVICES), or set device to \"cpu\"");
  return name;
}

}  // namespace

std::string planned_backend(const Plan& plan, int world) { return pick_backend(plan, world, false); }

std::string comm_backend_for(const Plan& plan, const std::string& backend, int local_world, int gpus) {
  const std::string& want = plan.comm.backend;
  const bool cuda = backend.rfind("cuda-", 0) == 0;
  if (!cuda) {
    ZT_REQUIRE(want != "nccl", "comm.backend: \"nccl\" needs the CUDA backend, and this run is on " << backend
                                   << " (NCCL moves device buffers); set comm.backend to \"mpi\" or \"auto\"");
    return "mpi";
  }
  const bool shared = local_world > gpus;
  // Tensor parallelism moves activations on its group: NCCL takes any device buffer, the host-staged
  // comm only the ZeRO engine's (it mirrors them, comm/host_mirror_comm.h).
  if (const int T = plan.mesh.tensor; T > 1) {
    ZT_REQUIRE(want != "mpi", "comm.backend: \"mpi\" with mesh.tensor " << T << " on the CUDA backend: the tensor "
                              "group's collectives move activations, which only NCCL takes (the host-staged comm "
                              "mirrors the ZeRO engine's buffers); set comm.backend to \"nccl\" or \"auto\"");
    ZT_REQUIRE(!shared, "mesh.tensor " << T << " on the CUDA backend needs NCCL, a GPU per rank, but " << local_world
                                       << " ranks on this host share " << gpus << " GPU(s); start at most " << gpus
                                       << " rank(s) per host");
  }
  if (want == "mpi") return "mpi";
  if (want == "auto") return shared ? "mpi" : "nccl";
  // Local ranks 0 and `gpus` are the first two to take the same GPU (local rank r takes GPU r % gpus).
  ZT_REQUIRE(!shared, "comm.backend: \"nccl\" needs a GPU per rank, but " << local_world << " ranks on this host share "
                          << gpus << " GPU(s) (local ranks 0 and " << gpus << " on GPU 0); start at most " << gpus
                          << " rank(s) per host, or set comm.backend to \"mpi\" or \"auto\" (host-staged over MPI)");
  return "nccl";
}

std::string choose_comm_backend(const Plan& plan, const std::string& backend, Comm& comm) {
  std::string mine, refusal;
  try {
    mine = comm_backend_for(plan, backend, comm.local_world(), backend.rfind("cpu-", 0) == 0 ? 0 : device::count());
  } catch (const Error& e) {
    refusal = e.what();
  }
  agree_or_throw(comm, refusal, "refused comm.backend");
  if (comm.world() == 1 && plan.comm.backend == "auto") return "mpi";  // nothing to communicate
  double mpi_hosts = mine == "mpi" ? 1 : 0;
  if (comm.world() > 1) comm.all_reduce_sum(&mpi_hosts, 1);
  return mpi_hosts > 0 ? "mpi" : "nccl";
}

std::string describe_comm_backend(const std::string& comm_backend, bool device) {
  if (comm_backend == "nccl")
    return "nccl (collectives on device buffers, on a stream of their own; ran on one GPU, across several "
           "tested under emulation only)";
  return device ? "mpi (device buffers host-staged through pinned memory)" : "mpi";
}

std::string planned_comm_backend(const Plan& plan, const std::string& backend, int world) {
  const std::string b = comm_backend_for(plan, backend, 1, 1);
  return world == 1 && plan.comm.backend == "auto" ? "mpi" : b;
}

std::string choose_backend(const Plan& plan, int world) { return pick_backend(plan, world, true); }

}  // namespace zt

