// Groups and point to point of the NCCL comm (src/comm/nccl_comm.cu) under the emulator (test/emu/nccl.cpp):
//   mpirun -np 4 -x ZT_EMU_DEVICES=4 ./zt_nccl_groups_emu      (ctest emulated.nccl_groups, label emu)
// Device buffers throughout: the world splits into rows of two (ncclCommSplit), each row all-reduces,
// and a send/recv ring runs in the world and in the reversed group (each rank sends to rank + 1,
// receives from rank - 1), the values checked on the host. Exit 0 only when every rank passed.
#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "comm/comm.h"
#include "comm/nccl_comm.h"
#include "runtime/cuda_check.h"

namespace {

int g_failures = 0;
#define CHECK(cond, ...)                                                  \
  do {                                                                    \
    if (!(cond)) {                                                        \
      std::fprintf(stderr, "nccl_groups_emu: FAILED %s: ", #cond);        \
      std::fprintf(stderr, __VA_ARGS__);                                  \
      std::fprintf(stderr, "\n");                                         \
      ++g_failures;                                                       \
    }                                                                     \
  } while (0)

float* device(const std::vector<float>& h, cudaStream_t s) {
  float* d = nullptr;
  ZT_CHECK_CUDA(cudaMalloc(&d, h.size() * 4));
  ZT_CHECK_CUDA(cudaMemcpyAsync(d, h.data(), h.size() * 4, cudaMemcpyHostToDevice, s));
  return d;
}
std::vector<float> host(const float* d, size_t n, cudaStream_t s) {
  std::vector<float> h(n);
  ZT_CHECK_CUDA(cudaMemcpyAsync(h.data(), d, n * 4, cudaMemcpyDeviceToHost, s));
  ZT_CHECK_CUDA(cudaStreamSynchronize(s));
  return h;
}

void ring(zt::Comm& c, cudaStream_t s) {
  const int g = c.rank(), N = c.world();
  if (N == 1) return;
  const size_t n = 5000;
  std::vector<float> mine(n);
  for (size_t i = 0; i < n; ++i) mine[i] = float(c.global_rank() * 100 + int(i % 7));
  float* out = device(mine, s);
  float* in = device(std::vector<float>(n, -1.0f), s);
  c.begin_step(1);
  const zt::CommHandle hs = c.send(out, 4 * n, (g + 1) % N), hr = c.recv(in, 4 * n, (g + N - 1) % N);
  c.wait(hr);
  c.wait(hs);
  const std::vector<uint64_t> globals = c.all_gather_u64(uint64_t(c.global_rank()));
  const int from = int(globals[size_t((g + N - 1) % N)]);
  const std::vector<float> got = host(in, n, s);
  CHECK(got[0] == float(from * 100) && got[n - 1] == float(from * 100 + int((n - 1) % 7)),
        "group \"%s\" rank %d: got %g from rank %d", c.name().c_str(), g, got[0], (g + N - 1) % N);
  CHECK(c.step_stats().bytes == 4 * n, "group \"%s\": %llu bytes counted, sent %zu", c.name().c_str(),
        (unsigned long long)c.step_stats().bytes, 4 * n);
  ZT_CHECK_CUDA(cudaFree(out));
  ZT_CHECK_CUDA(cudaFree(in));
}

}  // namespace

int main() {
  zt::CommOptions opts;
  opts.timeout_s = 60;
  std::unique_ptr<zt::Comm> boot = zt::make_mpi_comm(opts);
  cudaStream_t s = nullptr;
  int rc = 0;
  {
    std::unique_ptr<zt::Comm> world;
    try {
      int ndev = 0;
      ZT_CHECK_CUDA(cudaGetDeviceCount(&ndev));
      ZT_CHECK_CUDA(cudaSetDevice(boot->local_rank() % ndev));
      ZT_CHECK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
      world = zt::make_nccl_comm(opts, *boot, s, /*bf16=*/false);
      const int r = world->rank(), N = world->world();
      std::unique_ptr<zt::Comm> row = world->split(r / 2, r, "row " + std::to_string(r / 2));
      CHECK(row->name() == "row " + std::to_string(r / 2), "name %s", row->name().c_str());
      CHECK(row->rank() == r % 2 && row->world() == std::min(2, N - r / 2 * 2), "rank %d of %d", row->rank(),
            row->world());
      const size_t n = 1000;
      float* x = device(std::vector<float>(n, float(r + 1)), s);
      row->wait(row->all_reduce(x, n));
      float sum = 0;
      for (int q = r / 2 * 2; q < std::min(N, r / 2 * 2 + 2); ++q) sum += float(q + 1);
      CHECK(host(x, n, s)[n - 1] == sum, "row all-reduce: %g, want %g", host(x, n, s)[n - 1], sum);
      ZT_CHECK_CUDA(cudaFree(x));
      ring(*world, s);
      std::unique_ptr<zt::Comm> rev = world->split(0, N - r, "reversed");
      CHECK(rev->rank() == N - 1 - r, "reversed rank %d", rev->rank());
      ring(*rev, s);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "nccl_groups_emu rank %d: %s\n", boot->rank(), e.what());
      boot->abort_all(2);
    }
    double failed = g_failures ? 1 : 0;
    boot->all_reduce_sum(&failed, 1);
    if (boot->rank() == 0) std::printf("nccl_groups_emu: %d rank(s), %d failed\n", boot->world(), int(failed));
    rc = failed > 0 ? 1 : 0;
  }
  if (s) ZT_CHECK_CUDA(cudaStreamDestroy(s));
  return rc;
}
