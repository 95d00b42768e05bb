// Benchmarks of the offload path's two halves (docs/design.md §3.6), printed as JSON lines for
// scripts/bench_offload.sh:
//
//   zt_bench_offload adamw N THREADS   the CPU AdamW (kernels/adamw.cpp) on N fp32 parameters, and the
//                                      streaming limit on the same machine: a kernel with AdamW's exact
//                                      memory traffic (read p, g, m, v; write p, m, v = 28 bytes per
//                                      parameter) and no arithmetic to speak of.
//   zt_bench_offload io DIR MIB QD     one swap file of MIB MiB in DIR through offload::Uring (1 MiB
//                                      pieces, QD in flight): sequential write, sequential read, and
//                                      the optimizer's read/write pipeline with an empty update, and
//                                      with AdamW as the update (how much of it the transfers hide).
//   zt_bench_offload mixed DIR READ_MIB WRITE_MIB QD
//                                      reads and writes at once, as the offloaded step does (its
//                                      gathers and optimizer reads beside the write-behind): READ_MIB
//                                      read from one swap file while WRITE_MIB are written to another,
//                                      in 1 MiB pieces interleaved in that proportion on one ring of
//                                      QD in flight; the rate is both together (bytes moved / time).
#include <omp.h>

#include <algorithm>
#include <exception>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/adamw.h"
#include "offload/swap_file.h"
#include "offload/swap_pipeline.h"
#include "offload/uring.h"

namespace {

using Clock = std::chrono::steady_clock;
double now_s() { return std::chrono::duration<double>(Clock::now().time_since_epoch()).count(); }

template <class F>
double best_of(int reps, F&& f) {
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    const double t0 = now_s();
    f();
    best = std::min(best, now_s() - t0);
  }
  return best;
}

float* big(size_t n, float value) {
  float* p = static_cast<float*>(std::aligned_alloc(4096, n * sizeof(float)));
  if (!p) std::abort();
#pragma omp parallel for schedule(static)
  for (size_t i = 0; i < n; ++i) p[i] = value;  // first touch by the threads that will stream it
  return p;
}

int adamw(size_t n, int threads) {
  omp_set_num_threads(threads);
  float *p = big(n, 0.5f), *g = big(n, 0.01f), *m = big(n, 0.0f), *v = big(n, 0.0f);
  zt::cpu::AdamWArgs a{1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 1.0f, 1};
  const double t_adamw = best_of(7, [&] { zt::cpu::adamw_update(p, g, m, v, n, a); ++a.step; });
  // Same streams as AdamW, one add per stream: what the memory system allows.
  const double t_stream = best_of(7, [&] {
#pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < n; ++i) {
      const float gi = g[i];
      p[i] += gi;
      m[i] += gi;
      v[i] += gi;
    }
  });
  const double bytes = 28.0 * double(n);
  std::printf("{\"what\": \"adamw\", \"params\": %zu, \"threads\": %d, \"adamw_s\": %.6f, \"adamw_params_per_s\": %.4g, "
              "\"adamw_gb_per_s\": %.3f, \"stream_s\": %.6f, \"stream_gb_per_s\": %.3f, \"limit_params_per_s\": %.4g}\n",
              n, threads, t_adamw, double(n) / t_adamw, bytes / t_adamw / 1e9, t_stream, bytes / t_stream / 1e9,
              double(n) / t_stream);
  for (float* x : {p, g, m, v}) std::free(x);
  return 0;
}

int io(const std::string& dir, size_t mib, unsigned qd) {
  using namespace zt::offload;
  const size_t bytes = mib << 20, chunk = size_t(64) << 20;
  SwapFile f(swap_file_path(dir, 0, "bench"), bytes, true);
  unsigned char* buf = static_cast<unsigned char*>(std::aligned_alloc(kIoAlign, chunk));
  std::memset(buf, 1, chunk);  // not zeros: a virtual disk may skip writing (or reading) blocks of zeros
  Uring uring(qd);
  auto pass = [&](bool write) {
    for (size_t off = 0; off < bytes; off += chunk) {
      const size_t n = std::min(chunk, bytes - off);
      if (write) uring.write(f.fd(), buf, n, off, 0, "bench");
      else uring.read(f.fd(), buf, n, off, 0, "bench");
    }
    uring.wait(0);
  };
  const double tw = best_of(3, [&] { pass(true); });
  const double tr = best_of(3, [&] { pass(false); });
  // The optimizer's pipeline on two states of bytes/2 each, nothing to update.
  std::free(buf);
  const size_t numel = bytes / 2 / 4;
  SwapFile m(swap_file_path(dir, 0, "bench_m"), numel * 4, true), v(swap_file_path(dir, 0, "bench_v"), numel * 4, true);
  SwapSpec spec;
  spec.dir = dir, spec.queue_depth = qd, spec.buffer_count = 3, spec.subgroup_numel = (size_t(4) << 20) / 4;  // the plan's default
  float* pool = static_cast<float*>(std::aligned_alloc(kIoAlign, pool_numel(spec, numel, 2) * 4));
  SwapPipeline pipe({&m, &v}, numel, pool, spec);
  // Real data first: a virtual disk may skip blocks of zeros, which is all fallocate leaves.
  pipe.for_each_subgroup([](size_t, size_t n, float* const* b) {
    for (size_t j = 0; j < n; ++j) b[0][j] = b[1][j] = 1.0f;
  });
  const double tp = best_of(3, [&] { pipe.for_each_subgroup([](size_t, size_t, float* const*) {}); });
  // The same with the real update: how much of the update the transfers hide (1 = all of the
  // shorter of the two, 0 = none: the step is then I/O time + update time).
  float *p = big(numel, 0.5f), *g = big(numel, 0.01f);
  zt::cpu::AdamWArgs a{1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 1.0f, 1};
  double t_update = 0;
  const double tf = best_of(3, [&] {
    t_update = 0;
    pipe.for_each_subgroup([&](size_t begin, size_t n, float* const* b) {
      const double t0 = now_s();
      zt::cpu::adamw_update(p + begin, g + begin, b[0], b[1], n, a);
      t_update += now_s() - t0;
    });
    ++a.step;
  });
  std::free(p);
  std::free(g);
  std::free(pool);
  const double hidden = (tp + t_update - tf) / std::min(tp, t_update);
  std::printf("{\"what\": \"io\", \"mib\": %zu, \"queue_depth\": %u, \"io_uring\": %s, \"write_gb_per_s\": %.3f, "
              "\"read_gb_per_s\": %.3f, \"pipeline_read_plus_write_gb_per_s\": %.3f, \"pipeline_io_s\": %.4f, "
              "\"update_s\": %.4f, \"pipeline_with_update_s\": %.4f, \"overlap\": %.3f}\n",
              mib, qd, uring.available() ? "true" : "false", double(bytes) / tw / 1e9, double(bytes) / tr / 1e9,
              2.0 * double(bytes) / tp / 1e9, tp, t_update, tf, hidden);
  return 0;
}

int mixed(const std::string& dir, size_t read_mib, size_t write_mib, unsigned qd) {
  using namespace zt::offload;
  const size_t piece = Uring::kMaxIo, rb = read_mib << 20, wb = write_mib << 20, chunk = size_t(64) << 20;
  SwapFile r(swap_file_path(dir, 0, "bench_r"), rb, true), w(swap_file_path(dir, 0, "bench_w"), wb, true);
  // What the step writes never repeats (floats that move every step): nor does the probe's data, in
  // case the virtual disk dedups or compresses. Each piece has its own place in a read window and
  // in the written data, so no two pieces in flight share memory.
  unsigned char* rbuf = static_cast<unsigned char*>(std::aligned_alloc(kIoAlign, chunk));
  uint64_t* data = static_cast<uint64_t*>(std::aligned_alloc(kIoAlign, rb + wb));
  if (!rbuf || !data) {
    std::fprintf(stderr, "zt_bench_offload mixed: out of memory for %zu MiB of probe data\n", read_mib + write_mib + 64);
    return 1;
  }
  uint64_t x = 0x9E3779B97F4A7C15ull;
  for (size_t i = 0; i < (rb + wb) / 8; ++i) x ^= x << 13, x ^= x >> 7, x ^= x << 17, data[i] = x;  // xorshift64
  unsigned char* wdata = reinterpret_cast<unsigned char*>(data) + rb;
  Uring uring(qd);
  for (size_t off = 0; off < rb; off += chunk)
    uring.write(r.fd(), reinterpret_cast<unsigned char*>(data) + off, std::min(chunk, rb - off), off, 0, "bench");
  uring.wait(0);
  // Bresenham over the two streams: after every piece, the bytes read and written so far stand in
  // READ_MIB : WRITE_MIB as nearly as whole pieces allow.
  const double t = best_of(3, [&] {
    size_t ro = 0, wo = 0;
    while (ro < rb || wo < wb) {
      const bool write = ro >= rb || (wo < wb && double(wo) * double(rb) < double(ro) * double(wb));
      size_t& off = write ? wo : ro;
      const size_t n = std::min(piece, (write ? wb : rb) - off);
      if (write) uring.write(w.fd(), wdata + off, n, off, 0, "bench");
      else uring.read(r.fd(), rbuf + off % chunk, n, off, 0, "bench");
      off += n;
    }
    uring.wait(0);
  });
  std::free(rbuf);
  std::free(data);
  std::printf("{\"what\": \"mixed\", \"read_mib\": %zu, \"write_mib\": %zu, \"queue_depth\": %u, \"io_uring\": %s, "
              "\"s\": %.4f, \"read_gb_per_s\": %.3f, \"write_gb_per_s\": %.3f, \"gb_per_s\": %.3f}\n",
              read_mib, write_mib, qd, uring.available() ? "true" : "false", t, double(rb) / t / 1e9,
              double(wb) / t / 1e9, double(rb + wb) / t / 1e9);
  return 0;
}

}  // namespace

int main(int argc, char** argv) try {
  const std::string what = argc > 1 ? argv[1] : "";
  if (what == "adamw" && argc == 4) return adamw(std::strtoull(argv[2], nullptr, 10), std::atoi(argv[3]));
  if (what == "io" && argc == 5) return io(argv[2], std::strtoull(argv[3], nullptr, 10), unsigned(std::atoi(argv[4])));
  if (what == "mixed" && argc == 6)
    return mixed(argv[2], std::strtoull(argv[3], nullptr, 10), std::strtoull(argv[4], nullptr, 10),
                 unsigned(std::atoi(argv[5])));
  std::fprintf(stderr,
               "usage: zt_bench_offload adamw N THREADS | io DIR MIB QUEUE_DEPTH | mixed DIR READ_MIB WRITE_MIB "
               "QUEUE_DEPTH\n");
  return 2;
} catch (const std::exception& e) {  // a failed file or io_uring call (zt::Error names it): one line
  std::fprintf(stderr, "zt_bench_offload: %s\n", e.what());
  return 1;
}
