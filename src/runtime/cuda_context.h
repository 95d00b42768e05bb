// What every CUDA op needs besides its arguments: the stream the backend runs on, the cuBLASLt
// handle and workspace, and a few bytes for reductions that end on the host (global norm).
// One per process, created on first use, on the device chosen by select() (default 0); reset()
// destroys it (tests). Host code; built only with the CUDA backend.
#pragma once
#include <cstddef>

#include "kernels/matmul.h"
#include "runtime/cuda_check.h"

namespace zt::cuda {

class Context {
 public:
  static constexpr size_t kWorkspaceBytes = size_t(32) << 20;  // cuBLASLt: 32 MiB is what Hopper kernels want

  // The context, created on first use.
  static Context& get();
  // Device for the context (before first use; e.g. local rank % GPUs).
  static void select(int device);
  static void reset();

  ~Context();
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;

  int device = 0;
  int sm_count = 0;
  cudaStream_t stream = nullptr;
  Blas blas;                    // handle, workspace, stream for matmul
  float* norm_acc = nullptr;    // one float: sum of squares being accumulated
  void* norm_scratch = nullptr; // global_norm_scratch_bytes()

 private:
  explicit Context(int device);
};

}  // namespace zt::cuda
