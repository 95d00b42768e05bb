// Error checks for CUDA runtime and cuBLASLt calls (host code; built only with the CUDA backend).
// Each names file:line and the call, and throws zt::Error like every other failing system call.
// Kernel launches are followed by ZT_CHECK_LAUNCH(), which catches bad launch configurations at
// the launch site (asynchronous faults surface at the next synchronising call, which is checked too).
#pragma once
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <string>

#include "runtime/error.h"

namespace zt {
using bf16 = __nv_bfloat16;
}

#define ZT_CHECK_CUDA(call)                                                                              \
  do {                                                                                                   \
    const cudaError_t zt_cuda_rc_ = (call);                                                              \
    if (zt_cuda_rc_ != cudaSuccess)                                                                      \
      ::zt::fail_at(__FILE__, __LINE__,                                                                  \
                    std::string("CUDA call failed: ") + #call + ": " + cudaGetErrorName(zt_cuda_rc_) + \
                        ": " + cudaGetErrorString(zt_cuda_rc_));                                         \
  } while (0)

#define ZT_CHECK_LAUNCH() ZT_CHECK_CUDA(cudaGetLastError())

#define ZT_CHECK_CUBLAS(call)                                                                             \
  do {                                                                                                    \
    const cublasStatus_t zt_blas_rc_ = (call);                                                            \
    if (zt_blas_rc_ != CUBLAS_STATUS_SUCCESS)                                                             \
      ::zt::fail_at(__FILE__, __LINE__, std::string("cuBLASLt call failed: ") + #call + ": status " +   \
                                            std::to_string(int(zt_blas_rc_)));                           \
  } while (0)
