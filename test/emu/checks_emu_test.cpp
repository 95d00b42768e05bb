// The emulator's own checks (label emu): each kind of bug it promises to catch is caught, and the
// correct version of the same code passes. Also the NCCL comm (one emulated rank) ordered against
// the compute stream. Built with cuda_emu.h force-included (kernels below use the launch helper).
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "backend/ops_cuda.h"
#include "comm/comm.h"
#include "comm/nccl_comm.h"
#include "kernels/residual.h"
#include "runtime/cuda_check.h"
#include "runtime/cuda_context.h"

namespace {

using zt_emu::Launch;

// out[i] = in[i] + 1 for i < n (n may run past the allocation: the out-of-bounds case).
void add_one(float* out, const float* in, int n) {
  const int i = int(blockIdx.x * blockDim.x + threadIdx.x);
  if (i < n) out[i] = in[i] + 1.0f;
}

// Every thread writes its index into shared memory, then reads its neighbour's: needs the barrier.
void neighbour(int* out, bool barrier) {
  __shared__ int s[64];
  const int t = int(threadIdx.x);
  s[t] = t;
  if (barrier) __syncthreads();
  out[t] = s[(t + 1) % 64];
}

float* dev_floats(size_t n, float v) {
  float* p = nullptr;
  ZT_CHECK_CUDA(cudaMalloc(&p, n * sizeof(float)));
  std::vector<float> h(n, v);
  ZT_CHECK_CUDA(cudaMemcpy(p, h.data(), n * sizeof(float), cudaMemcpyHostToDevice));
  return p;
}

std::vector<float> host_copy(const float* d, size_t n) {
  std::vector<float> h(n);
  ZT_CHECK_CUDA(cudaMemcpy(h.data(), d, n * sizeof(float), cudaMemcpyDeviceToHost));
  return h;
}

// ---- streams and events ----------------------------------------------------------------------------
// Producer on stream a, consumer on stream b (both non-blocking), with or without the event between.
void two_streams(bool with_event) {
  cudaStream_t a, b;
  ZT_CHECK_CUDA(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking));
  ZT_CHECK_CUDA(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking));
  cudaEvent_t ev;
  ZT_CHECK_CUDA(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
  float* x = dev_floats(256, 1.0f);
  float* y = dev_floats(256, 0.0f);
  ZT_CHECK_CUDA(cudaDeviceSynchronize());
  add_one | Launch("add_one", 1, 256, 0, a)(x, x, 256);  // x = 2 on stream a
  if (with_event) {
    ZT_CHECK_CUDA(cudaEventRecord(ev, a));
    ZT_CHECK_CUDA(cudaStreamWaitEvent(b, ev, 0));
  }
  add_one | Launch("add_one", 1, 256, 0, b)(y, x, 256);  // y = x + 1 on stream b
  ZT_CHECK_CUDA(cudaStreamSynchronize(b));
  EXPECT_EQ(host_copy(y, 256)[7], 3.0f);
}

// A kernel writes from x + at on stream a (to the end of x's allocation, as the emulator must
// assume); stream b then copies 64 floats from x + from to the host, unordered.
void kernel_then_copy(size_t at, size_t from) {
  cudaStream_t a, b;
  ZT_CHECK_CUDA(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking));
  ZT_CHECK_CUDA(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking));
  float* x = dev_floats(256, 1.0f);
  ZT_CHECK_CUDA(cudaDeviceSynchronize());
  add_one | Launch("add_one", 1, 64, 0, a)(x + at, x + at, 64);
  std::vector<float> h(64);
  ZT_CHECK_CUDA(cudaMemcpyAsync(h.data(), x + from, 64 * sizeof(float), cudaMemcpyDeviceToHost, b));
  ZT_CHECK_CUDA(cudaDeviceSynchronize());
}

TEST(EmuStreams, EventOrdersCrossStreamUse) { two_streams(true); }
// The copy's range holds the kernel's pointer: reported. A copy of a later part than the kernel's
// pointer (units k + 1.. of a shard while a kernel adds into unit k) is not: the kernel's extent is
// unknown, and the engine works on disjoint parts of one allocation (README).
TEST(EmuStreamsDeathTest, CopyOverAKernelsPointerIsReported) {
  EXPECT_DEATH(kernel_then_copy(64, 32), "unordered use of memory across streams");
}
TEST(EmuStreams, CopyPastAKernelsPointerIsNotReported) { kernel_then_copy(0, 128); }
TEST(EmuStreamsDeathTest, MissingEventWaitIsReported) {
  EXPECT_DEATH(two_streams(false), "unordered use of memory across streams");
}

TEST(EmuStreams, HostSyncOrdersCrossStreamUse) {
  cudaStream_t a, b;
  ZT_CHECK_CUDA(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking));
  ZT_CHECK_CUDA(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking));
  float* x = dev_floats(64, 1.0f);
  add_one | Launch("add_one", 1, 64, 0, a)(x, x, 64);
  ZT_CHECK_CUDA(cudaStreamSynchronize(a));  // the host waited for a: b's later work is ordered after it
  add_one | Launch("add_one", 1, 64, 0, b)(x, x, 64);
  ZT_CHECK_CUDA(cudaStreamSynchronize(b));
  EXPECT_EQ(host_copy(x, 64)[0], 3.0f);
}

// The NCCL comm (one emulated rank) on its own stream, after a kernel on the compute stream wrote
// the buffer: nccl_comm.cu must make its stream wait for the compute stream's work.
// The NCCL comm follows the compute stream it is made with; the trainer's is the backend's
// (CudaOps<T>::stream(), the context's non-blocking stream), which is what this test passes.
std::unique_ptr<zt::Comm> nccl_following(cudaStream_t compute) {
  static std::unique_ptr<zt::Comm> boot = zt::make_mpi_comm(zt::CommOptions{});
  return zt::make_nccl_comm(zt::CommOptions{}, *boot, compute, /*bf16=*/false);
}

TEST(EmuNccl, CollectiveWaitsForComputeStream) {
  const cudaStream_t compute = zt::CudaOps<float>::stream();
  ASSERT_EQ(compute, zt::CudaOps<zt::bf16>::stream());
  ASSERT_EQ(compute, zt::cuda::Context::get().stream);
  std::unique_ptr<zt::Comm> comm = nccl_following(compute);
  const size_t n = 1024;
  float* a = dev_floats(n, 1.0f);
  float* b = dev_floats(n, 2.0f);
  float* g = dev_floats(n, 0.0f);
  ZT_CHECK_CUDA(cudaDeviceSynchronize());
  zt::cuda::residual_forward(g, a, b, n, compute);  // g = 3, on the compute stream
  comm->wait(comm->all_reduce(g, n));                // on the comm stream
  zt::cuda::residual_forward(a, g, g, n, compute);  // a = 6: reads what the collective wrote
  ZT_CHECK_CUDA(cudaStreamSynchronize(compute));
  EXPECT_EQ(host_copy(g, n)[5], 3.0f);
  EXPECT_EQ(host_copy(a, n)[5], 6.0f);
}

// The same with the comm following another stream (the bug the compute-stream argument prevents:
// a collective reading a buffer the compute stream is still writing) is reported.
TEST(EmuNcclDeathTest, CollectiveFollowingTheWrongStreamIsARace) {
  EXPECT_DEATH(
      {
        cudaStream_t other = nullptr;
        ZT_CHECK_CUDA(cudaStreamCreateWithFlags(&other, cudaStreamNonBlocking));
        std::unique_ptr<zt::Comm> comm = nccl_following(other);
        const size_t n = 1024;
        float* a = dev_floats(n, 1.0f);
        float* g = dev_floats(n, 0.0f);
        ZT_CHECK_CUDA(cudaDeviceSynchronize());
        zt::cuda::residual_forward(g, a, a, n, zt::CudaOps<float>::stream());
        comm->wait(comm->all_reduce(g, n));
      },
      "unordered use of memory across streams");
}

TEST(EmuNccl, NeedsAComputeStream) {
  try {
    nccl_following(nullptr);
    FAIL() << "make_nccl_comm accepted no compute stream";
  } catch (const zt::Error& e) {
    EXPECT_NE(std::string(e.what()).find("needs the compute stream"), std::string::npos) << e.what();
  }
}

// ---- device memory ------------------------------------------------------------------------------------
TEST(EmuMemoryDeathTest, HostDereferenceOfDeviceMemory) {
  float* x = dev_floats(16, 1.0f);
  EXPECT_DEATH({ volatile float v = x[3]; (void)v; }, "host code dereferenced device memory");
}
// Between two launches on the same allocation (it stays mapped, its protection key disabled): the
// host's read still faults.
TEST(EmuMemoryDeathTest, HostDereferenceBetweenLaunches) {
  float* x = dev_floats(16, 1.0f);
  add_one | Launch("add_one", 1, 16, 0, nullptr)(x, x, 16);
  EXPECT_DEATH(
      {
        volatile float v = x[3];
        (void)v;
        add_one | Launch("add_one", 1, 16, 0, nullptr)(x, x, 16);
      },
      "host code dereferenced device memory");
}

// A host thread reads x while a kernel that was given x runs (the kernel waits for it): on a GPU
// the two overlap, and the read is of device memory all the same.
std::atomic<int> g_phase{0};
void wait_for_host_thread(float* x) {
  g_phase = 1;
  while (g_phase != 2) std::this_thread::yield();
  x[0] = 0.0f;
}
// Whether this CPU and kernel have memory protection keys (x86 "pku" and "ospke" in /proc/cpuinfo):
// without them the emulator opens an op's allocations with mprotect, which no thread can be kept
// out of while the op runs (test/emu/runtime.cpp, Keys).
bool cpu_has_protection_keys() {
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("flags", 0) == 0) return line.find(" pku") != std::string::npos && line.find(" ospke") != std::string::npos;
  return false;
}
TEST(EmuMemoryDeathTest, HostThreadDereferenceWhileAKernelRuns) {
  if (!cpu_has_protection_keys())
    GTEST_SKIP() << "this CPU has no memory protection keys (pku/ospke in /proc/cpuinfo): the emulator cannot keep "
                    "other host threads out of an allocation while an op has it open";
  float* x = dev_floats(16, 1.0f);
  EXPECT_DEATH(
      {
        std::thread host([x] {
          while (g_phase != 1) std::this_thread::yield();
          volatile float v = x[3];
          (void)v;
          g_phase = 2;
        });
        wait_for_host_thread | Launch("wait_for_host_thread", 1, 1, 0, nullptr)(x);
        host.join();
      },
      "host code dereferenced device memory");
}

// out[0] = *elsewhere: an allocation the kernel was not given.
float* g_elsewhere = nullptr;
void read_elsewhere(float* out) { out[0] = *g_elsewhere; }
// The allocation the previous launch used (its protection key held, not enabled for this launch).
TEST(EmuMemoryDeathTest, KernelTouchingAnAllocationNotPassedToIt) {
  g_elsewhere = dev_floats(16, 1.0f);
  float* out = dev_floats(16, 0.0f);
  add_one | Launch("add_one", 1, 16, 0, nullptr)(g_elsewhere, g_elsewhere, 16);
  EXPECT_DEATH(read_elsewhere | Launch("read_elsewhere", 1, 1, 0, nullptr)(out),
               "which is not an allocation passed to it as an argument");
}

// out[i] = the sum of 16 inputs: 17 allocations in one launch, more than there are protection keys
// (15), so some are opened with mprotect instead: each is open during the launch, closed after it.
void sum16(float* out, const float* a0, const float* a1, const float* a2, const float* a3, const float* a4,
           const float* a5, const float* a6, const float* a7, const float* a8, const float* a9, const float* a10,
           const float* a11, const float* a12, const float* a13, const float* a14, const float* a15) {
  const int i = int(threadIdx.x);
  out[i] = a0[i] + a1[i] + a2[i] + a3[i] + a4[i] + a5[i] + a6[i] + a7[i] + a8[i] + a9[i] + a10[i] + a11[i] + a12[i] +
           a13[i] + a14[i] + a15[i];
}
TEST(EmuMemoryDeathTest, MoreAllocationsThanProtectionKeys) {
  std::vector<float*> in;
  for (int k = 0; k < 16; ++k) in.push_back(dev_floats(32, float(k)));
  float* out = dev_floats(32, 0.0f);
  for (int rep = 0; rep < 2; ++rep) {  // twice: those without a key are opened and closed again
    sum16 | Launch("sum16", 1, 32, 0, nullptr)(out, in[0], in[1], in[2], in[3], in[4], in[5], in[6], in[7], in[8],
                                                in[9], in[10], in[11], in[12], in[13], in[14], in[15]);
    EXPECT_EQ(host_copy(out, 32)[31], 120.0f);
  }
  for (float* p : in) EXPECT_DEATH({ volatile float v = p[1]; (void)v; }, "host code dereferenced device memory");
  EXPECT_DEATH({ volatile float v = out[1]; (void)v; }, "host code dereferenced device memory");
}
TEST(EmuMemoryDeathTest, CopyDirectionChecked) {
  float* x = dev_floats(16, 1.0f);
  float* y = dev_floats(16, 1.0f);
  EXPECT_DEATH((void)cudaMemcpy(x, y, 16 * sizeof(float), cudaMemcpyHostToDevice), "is device memory");
}
TEST(EmuMemoryDeathTest, CopyPastAllocationEnd) {
  float* x = dev_floats(16, 1.0f);
  std::vector<float> h(32);
  EXPECT_DEATH((void)cudaMemcpy(h.data(), x, 32 * sizeof(float), cudaMemcpyDeviceToHost), "past the end");
}
TEST(EmuMemoryDeathTest, KernelOutOfBounds) {
  float* x = dev_floats(1024, 1.0f);  // 4 KiB: ends exactly at a guard page
  float* y = dev_floats(1024, 0.0f);
  add_one | Launch("add_one", 5, 256, 0, nullptr)(y, x, 1024);  // in bounds
  EXPECT_EQ(host_copy(y, 1024)[1023], 2.0f);
  EXPECT_DEATH(add_one | Launch("add_one", 5, 256, 0, nullptr)(y, x, 1280), "touched device memory");
}

// ---- launches and barriers -------------------------------------------------------------------------------
TEST(EmuLaunch, BadConfigurationIsALaunchError) {
  float* x = dev_floats(16, 1.0f);
  add_one | Launch("add_one", 1, 2048, 0, nullptr)(x, x, 16);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidConfiguration);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}
TEST(EmuLaunch, SyncthreadsOrdersSharedMemory) {
  int* out = nullptr;
  ZT_CHECK_CUDA(cudaMalloc(&out, 64 * sizeof(int)));
  neighbour | Launch("neighbour", 1, 64, 0, nullptr)(out, true);
  std::vector<int> h(64);
  ZT_CHECK_CUDA(cudaMemcpy(h.data(), out, 64 * sizeof(int), cudaMemcpyDeviceToHost));
  for (int t = 0; t < 64; ++t) EXPECT_EQ(h[size_t(t)], (t + 1) % 64);
}

}  // namespace
