// The cuBLASLt handle, workspace and stream a GEMM runs with. Owned by cuda::Context (the runtime),
// passed to the matmul kernels by the caller (kernels know no global state). Host code; built only with
// the CUDA backend.
#pragma once
#include <cstddef>

#include "runtime/cuda_check.h"

namespace zt::cuda {
struct Blas {
  cublasLtHandle_t lt = nullptr;
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
  cudaStream_t stream = nullptr;
};
}  // namespace zt::cuda
