// The device interface over the CUDA runtime (host code only). Copies go through the backend's
// stream (cuda_context.h) so they are ordered with the kernels.
#include <string>

#include "runtime/cuda_check.h"
#include "runtime/cuda_context.h"
#include "runtime/device.h"
#include "runtime/memory.h"

namespace zt::device {

bool built_with_cuda() { return true; }

int count() {
  int n = 0;
  // No driver, no device, or a broken installation all mean "no GPU here": the CPU path runs.
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();  // clear the sticky error so later checks do not report it
    return 0;
  }
  return n;
}

bool available() { return count() > 0; }

std::string describe() {
  if (!available()) return "";
  int dev = 0;
  ZT_CHECK_CUDA(cudaGetDevice(&dev));
  cudaDeviceProp p{};
  ZT_CHECK_CUDA(cudaGetDeviceProperties(&p, dev));
  return std::string(p.name) + " (sm_" + std::to_string(p.major) + std::to_string(p.minor) + ", " +
         std::to_string(p.multiProcessorCount) + " SMs, " + format_bytes(double(p.totalGlobalMem)) + ")";
}

size_t free_bytes() {
  size_t free_b = 0, total_b = 0;
  ZT_CHECK_CUDA(cudaMemGetInfo(&free_b, &total_b));
  return free_b;
}

size_t total_bytes() {
  size_t free_b = 0, total_b = 0;
  ZT_CHECK_CUDA(cudaMemGetInfo(&free_b, &total_b));
  return total_b;
}

void* alloc(size_t bytes) {
  void* p = nullptr;
  const cudaError_t rc = cudaMalloc(&p, bytes);
  if (rc == cudaErrorMemoryAllocation) {
    (void)cudaGetLastError();
    throw DeviceOutOfMemory("out of device memory: cudaMalloc of " + format_bytes(double(bytes)) + " failed with " +
                            format_bytes(double(free_bytes())) + " free");
  }
  ZT_CHECK_CUDA(rc);
  return p;
}

void free(void* p) {
  // Called from destructors: a failure here cannot be reported by throwing, and the error (if any)
  // is sticky, so the next checked call names it.
  if (p) (void)cudaFree(p);
}

void* alloc_pinned(size_t bytes) {
  void* p = nullptr;
  const cudaError_t rc = cudaMallocHost(&p, bytes);
  if (rc == cudaErrorMemoryAllocation) {
    (void)cudaGetLastError();
    throw OutOfMemory("out of pinned host memory: cudaMallocHost of " + format_bytes(double(bytes)) + " failed; ");
  }
  ZT_CHECK_CUDA(rc);
  return p;
}

void free_pinned(void* p) {
  if (p) (void)cudaFreeHost(p);  // from destructors, as free() above
}

void memset0(void* p, size_t bytes) {
  ZT_CHECK_CUDA(cudaMemsetAsync(p, 0, bytes, cuda::Context::get().stream));
  ZT_CHECK_CUDA(cudaStreamSynchronize(cuda::Context::get().stream));
}

void copy_to_device(void* dst, const void* src, size_t bytes) {
  cudaStream_t s = cuda::Context::get().stream;
  ZT_CHECK_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, s));
  ZT_CHECK_CUDA(cudaStreamSynchronize(s));  // the host buffer may be reused as soon as we return
}

void copy_to_host(void* dst, const void* src, size_t bytes) {
  cudaStream_t s = cuda::Context::get().stream;
  ZT_CHECK_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, s));
  ZT_CHECK_CUDA(cudaStreamSynchronize(s));
}

void synchronize() { ZT_CHECK_CUDA(cudaStreamSynchronize(cuda::Context::get().stream)); }

}  // namespace zt::device
