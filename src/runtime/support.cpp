#include "runtime/support.h"

#include <sstream>

#include "runtime/device.h"
#include "runtime/error.h"

namespace zt::support {

const std::vector<Backend>& backends() {
  static const std::vector<Backend> table = [] {
    const bool cuda = device::built_with_cuda();
    constexpr int64_t kInt32Max = 2147483647;  // the CUDA kernels index in 32 bits
    Backend cpu;
    cpu.name = "cpu-fp32", cpu.device = "cpu", cpu.precision = "fp32", cpu.library = "CPU", cpu.built = true;
    cpu.max_world = 0, cpu.world_note = "any number of ranks under mpirun";
    cpu.zero_stages = {0, 1, 2, 3};
    Backend gpu;
    gpu.device = "cuda", gpu.library = "CUDA", gpu.built = cuda;
    // Several ranks (sharing a GPU or not): collectives host-staged through MPI (comm/host_mirror_comm.h),
    // tested under emulation only (test/emu).
    gpu.max_world = 0, gpu.world_note = "any number of ranks under mpirun, collectives host-staged through MPI";
    gpu.zero_stages = {0, 1, 2, 3};
    gpu.head_sizes = {16, 32, 64, 128};  // the attention kernels' template instances (kernels/attention_*.cu)
    gpu.n_embd_multiple = 8, gpu.n_embd_note = "128-bit loads";
    gpu.max_seq_x_embd = kInt32Max, gpu.max_batch_x_heads = kInt32Max;
    Backend bf16 = gpu, fp32 = gpu;
    bf16.name = "cuda-bf16", bf16.precision = "bf16";
    fp32.name = "cuda-fp32", fp32.precision = "fp32";
    // The CPU backend with its linear layers multiplied in bf16 by oneDNN (kernels/matmul_bf16.h);
    // whether this CPU can is asked where the backend is chosen (train/backend_choice.cpp).
    Backend cpu_bf16 = cpu;
    cpu_bf16.name = "cpu-bf16", cpu_bf16.precision = "bf16", cpu_bf16.library = "oneDNN";
    cpu_bf16.note = "the linear layers multiply bf16 operands with fp32 accumulation (oneDNN), the rest as "
                    "cpu-fp32; needs a CPU with AVX512-BF16 or AMX-BF16";
#if ZT_HAVE_DNNL
    cpu_bf16.built = true;
#else
    cpu_bf16.built = false;
#endif
    return std::vector<Backend>{cpu, cpu_bf16, bf16, fp32};
  }();
  return table;
}

const Backend& backend(const std::string& name) {
  for (const Backend& b : backends())
    if (b.name == name) return b;
  fail_at(__FILE__, __LINE__, "internal error: support: no backend called '" + name + "'");
}

bool device_built(const std::string& device) {
  for (const Backend& b : backends())
    if (b.built && b.device == device) return true;
  return false;
}

bool precision_built(const std::string& precision) {
  for (const Backend& b : backends())
    if (b.built && b.precision == precision) return true;
  return false;
}

const Features& features() {
  static const Features f = [] {
    Features x;
    x.offload_params = device::built_with_cuda() ? std::vector<std::string>{"none", "cpu", "nvme"}
                                                 : std::vector<std::string>{"none", "nvme"};
    x.checkpoint_saving = true;
    x.checkpoint_resume = true;
    x.master_weights_off = false;
    // "cpu": the CUDA backend's AdamW on the host (the CPU backend has nothing to move; plan.cpp says so).
    x.offload_optimizer = device::built_with_cuda() ? std::vector<std::string>{"none", "cpu", "nvme"}
                                                    : std::vector<std::string>{"none", "nvme"};
    return x;
  }();
  return f;
}

std::string join(const std::vector<int>& v) {
  std::ostringstream os;
  for (size_t i = 0; i < v.size(); ++i) os << (i ? ", " : "") << v[i];
  return os.str();
}

std::string help() {
  std::ostringstream os;
  os << "Backends (device \"auto\": the GPU when the CUDA backend is built and one is visible, else the CPU):\n";
  for (const Backend& b : backends()) {
    const std::string missing = b.library == "oneDNN" ? "oneDNN (libdnnl-dev)" : "nvcc";
    os << "  " << b.name << (b.built ? "" : " (not in this build: " + missing + " was not found at configure time)")
       << ": " << b.world_note << ", zero.stage " << join(b.zero_stages);
    if (!b.head_sizes.empty()) os << ", head size " << join(b.head_sizes);
    if (b.n_embd_multiple > 1) os << ", n_embd a multiple of " << b.n_embd_multiple;
    if (!b.note.empty()) os << "; " << b.note;
    os << "\n";
  }
  os << "Offload: offload.optimizer \"nvme\" (zero.stage 1-3, both backends) and \"cpu\" (zero.stage 1-3, CUDA backend:\n"
        "AdamW on the CPU from pinned host memory); offload.params \"nvme\" (zero.stage 3, CPU\n"
        "backend: the parameter and gradient shards in swap files) and \"cpu\" (zero.stage 3, CUDA backend: the\n"
        "parameter shard in pinned host memory, the gradient shard too where AdamW runs on the CPU); \"nvme\" on\n"
        "the CUDA backend too (with offload.optimizer \"none\": the parameter shard alone). On the CUDA backend the\n"
        "host-staged multi-rank path, optimizer and parameter offload (the CPU AdamW overlapped with backward too) and\n"
        "checkpoints with offload ran on an H200 and H100s at test sizes; NCCL across several GPUs is tested under\n"
        "emulation only.";
  return os.str();
}

}  // namespace zt::support
