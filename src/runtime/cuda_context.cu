#include "runtime/cuda_context.h"

#include <memory>

namespace zt::cuda {
namespace {
std::unique_ptr<Context>& instance() {
  static std::unique_ptr<Context> ctx;
  return ctx;
}
int& selected_device() {
  static int d = 0;
  return d;
}
}  // namespace

Context& Context::get() {
  auto& ctx = instance();
  if (!ctx) ctx.reset(new Context(selected_device()));
  return *ctx;
}

void Context::select(int d) {
  ZT_REQUIRE(!instance() || instance()->device == d, "CUDA context already created on device " << instance()->device);
  selected_device() = d;
}

void Context::reset() { instance().reset(); }

Context::Context(int d) : device(d) {
  ZT_CHECK_CUDA(cudaSetDevice(device));
  ZT_CHECK_CUDA(cudaDeviceGetAttribute(&sm_count, cudaDevAttrMultiProcessorCount, device));
  ZT_CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  ZT_CHECK_CUBLAS(cublasLtCreate(&blas.lt));
  ZT_CHECK_CUDA(cudaMalloc(&blas.workspace, kWorkspaceBytes));
  blas.workspace_bytes = kWorkspaceBytes;
  blas.stream = stream;
  ZT_CHECK_CUDA(cudaMalloc(&reduce_out, sizeof(float)));
  ZT_CHECK_CUDA(cudaMalloc(&reduce_scratch, kReduceScratchBytes));
}

Context::~Context() {
  // Destructors must not throw: errors here are ignored (the process is usually ending).
  if (stream) (void)cudaStreamSynchronize(stream);
  (void)cudaFree(reduce_scratch);
  (void)cudaFree(reduce_out);
  (void)cudaFree(blas.workspace);
  if (blas.lt) (void)cublasLtDestroy(blas.lt);
  if (stream) (void)cudaStreamDestroy(stream);
}

}  // namespace zt::cuda
