// What every CUDA op needs besides its arguments: the stream the backend runs on, the cuBLASLt
// handle and workspace, and scratch for reductions that end on the host (the global norm: the
// op table checks that kReduceScratchBytes covers what its kernel asks for).
// One per process, created on first use, on the device chosen by select() (default 0); reset()
// destroys it (tests). Host code; built only with the CUDA backend.
#pragma once
#include <cstddef>

#include "runtime/cuda_blas.h"
#include "runtime/cuda_check.h"

namespace zt::cuda {

class Context {
 public:
  static constexpr size_t kWorkspaceBytes = size_t(32) << 20;  // cuBLASLt: 32 MiB is what Hopper kernels want
  static constexpr size_t kReduceScratchBytes = size_t(64) << 10;

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
  float* reduce_out = nullptr;    // one float: a reduction being accumulated for the host
  void* reduce_scratch = nullptr; // kReduceScratchBytes of per-block partials

 private:
  explicit Context(int device);
};

}  // namespace zt::cuda
