// Disk probes (calibrate.h): the disk alone, the offloaded optimizer's pipeline, parameter offload's passes.
#include "autoplan/calibrate.h"
#include "autoplan/probe_timing.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <fstream>
#include <sstream>

#include <cblas.h>
#include <omp.h>

#include "backend/ops_cpu.h"
#include "kernels/adamw.h"
#include "model/gpt.h"
#include "offload/shard_source.h"
#include "offload/swap_file.h"
#include "offload/swap_pipeline.h"
#include "offload/uring.h"
#include "runtime/clock.h"
#include "runtime/error.h"
#include "plan/plan.h"
#include "runtime/output_path.h"

namespace zt::autoplan {
namespace {

// Values in [0, 1) that never repeat (a virtual disk may skip zeros or deduplicate), as fp32.
void fill_values(float* x, size_t n, uint64_t seed) {
  uint64_t s = 0x9E3779B97F4A7C15ull ^ seed;
  for (size_t i = 0; i < n; ++i) s ^= s << 13, s ^= s >> 7, s ^= s << 17, x[i] = float(s >> 40) * 0x1p-24f;
}

// A kIoAlign-aligned buffer of n floats, freed with it.
struct AlignedFloats {
  float* p;
  explicit AlignedFloats(size_t n) : p(static_cast<float*>(std::aligned_alloc(offload::kIoAlign, offload::io_round_up(n * 4 + 1)))) {
    ZT_REQUIRE(p, "plan: out of memory for a disk probe's " << n * 4 << " bytes");
  }
  ~AlignedFloats() { std::free(p); }
};

// Writes n floats of fill_values into f from its start, 16 MiB at a time.
void write_values(offload::SwapFile& f, size_t n, uint64_t seed) {
  const size_t piece = size_t(4) << 20;
  AlignedFloats buf(std::min(n, piece));
  for (size_t at = 0; at < n; at += piece) {
    const size_t k = std::min(piece, n - at);
    fill_values(buf.p, k, seed + at);
    f.write_blocks(buf.p, offload::io_round_up(k * 4), at * 4);
  }
}

// A swap file of n floats for a probe in dir, filled with fill_values.
std::unique_ptr<offload::SwapFile> probe_file(const std::string& dir, int rank, const std::string& tag, size_t n,
                                              bool direct, uint64_t seed) {
  auto f = std::make_unique<offload::SwapFile>(offload::swap_file_path(dir, rank, tag), n * 4, direct);
  write_values(*f, n, seed);
  return f;
}

}  // namespace

// Waits until the filesystem of `dir` has written back what is pending and freed what deleted
// files held (syncfs: a journal commit, where a filesystem mounted with `discard` also trims the
// freed blocks). A probe's files, written then deleted, would otherwise still be flushed and
// trimmed while the next probe or run measures the disk (measured: the first candidate validated
// after the probes ran up to 25% slower than its twin).
void settle_disk(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;  // nothing of ours there to wait for
  (void)::syncfs(fd);  // best effort: a failure only leaves the disk busier during the next probe
  ::close(fd);
}


double Calibration::disk_bytes_per_s(const std::string& dir, bool direct) {
  std::error_code ec;
  std::ostringstream k;
  k << "disk " << canonical_dir(dir) << " ranks/host" << comm_.local_world();
  const size_t half = size_t(128) << 20;
  // Stored as the probe's seconds, so that the slowest rank's is the one kept.
  return 2.0 * double(half) / cached(k.str(), [&] {
    using namespace offload;
    std::filesystem::create_directories(dir, ec);
    ZT_REQUIRE(!ec, "plan: offload.nvme_dir " << dir << ": cannot create it for the disk probe: " << ec.message());
    // 128 MiB read while 128 MiB are written, in 1 MiB pieces on one ring of 32: the optimizer
    // pipeline's mix. Data that never repeats (a virtual disk may skip zeros or deduplicate).
    const size_t piece = Uring::kMaxIo;
    SwapFile r(swap_file_path(dir, comm_.rank(), "probe_r"), half, direct);
    SwapFile w(swap_file_path(dir, comm_.rank(), "probe_w"), half, direct);
    uint64_t* data = static_cast<uint64_t*>(std::aligned_alloc(kIoAlign, 2 * half));
    ZT_REQUIRE(data, "plan: out of memory for the disk probe's 256 MiB");
    uint64_t x = 0x9E3779B97F4A7C15ull ^ uint64_t(comm_.rank());
    for (size_t i = 0; i < 2 * half / 8; ++i) x ^= x << 13, x ^= x >> 7, x ^= x << 17, data[i] = x;
    unsigned char* bytes = reinterpret_cast<unsigned char*>(data);
    Uring uring(32);
    for (size_t off = 0; off < half; off += piece) uring.write(r.fd(), bytes + off, piece, off, 0, "disk probe");
    uring.wait(0);
    settle_disk(dir);
    const double t = best_time(3, [&] {
      for (size_t off = 0; off < half; off += piece) {
        uring.read(r.fd(), bytes + off, piece, off, 0, "disk probe");
        uring.write(w.fd(), bytes + half + off, piece, off, 0, "disk probe");
      }
      uring.wait(0);
    });
    std::free(data);
    return t;
  });
}

double Calibration::optimizer_pipeline_s_per_byte(const offload::SwapSpec& spec, size_t shard_numel) {
  using namespace offload;
  const size_t align = kIoAlign / 4;
  const size_t n = (std::min(shard_numel, size_t(64) << 20) + align - 1) / align * align;
  std::ostringstream k;
  k << "optimizer_pipeline " << canonical_dir(spec.dir) << " numel" << n << " subgroup" << spec.subgroup_numel << " sets"
    << spec.buffer_count << " qd" << spec.queue_depth << (spec.direct ? "" : " buffered") << " threads" << threads_
    << " ranks/host" << comm_.local_world();
  return cached(k.str(), [&] {
    std::error_code ec;
    std::filesystem::create_directories(spec.dir, ec);
    ZT_REQUIRE(!ec, "plan: offload.nvme_dir " << spec.dir << ": cannot create it for the optimizer probe: " << ec.message());
    // m and v in files (training leaves them written by the step before: each run writes them back).
    auto m = probe_file(spec.dir, comm_.rank(), "probe_m", n, spec.direct, uint64_t(comm_.rank()) << 32);
    auto v = probe_file(spec.dir, comm_.rank(), "probe_v", n, spec.direct, uint64_t(comm_.rank()) << 32 | 1);
    settle_disk(spec.dir);
    AlignedFloats pool(pool_numel(spec, n, 2));
    std::vector<float> p(n, 0.5f), g(n, 0.01f);
    SwapPipeline pipe({m.get(), v.get()}, n, pool.p, spec);
    cpu::AdamWArgs a{1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 1.0f, 1};
    comm_.barrier();  // the ranks' steps start together in training (after the gradient norm)
    return median_time(3, [&] {
      pipe.for_each_subgroup([&](size_t begin, size_t count, float* const* bufs) {
        cpu::adamw_update(p.data() + begin, g.data() + begin, bufs[0], bufs[1], count, a);
      });
      ++a.step;
    }, [] {}) / (16.0 * double(n));  // m and v read and written
  });
}

PassCost Calibration::pass_io(const offload::SwapSpec& spec, const std::vector<size_t>& unit_shard_numel,
                              int embedding_units, bool regather, bool transfers) {
  using namespace offload;
  using Ranges = std::vector<ShardSource<float>::Range>;
  const int U = int(unit_shard_numel.size()), E = embedding_units;
  ZT_ASSERT(U > 0 && E >= 1 && E <= U);
  size_t total = 0;
  for (size_t n : unit_shard_numel) total += n;
  // Shards of up to 128M parameters in all are measured as they are. Larger ones at two scales,
  // every unit shrunk in proportion, and extrapolated to full size along the line through the two
  // (each read's latency stays, its transfer grows with the bytes; scaling one time up would
  // multiply the latencies too). The overlap alone is a ratio: measured at up to 16M parameters,
  // every unit shrunk in proportion (on this machine the share hidden at 16M, 32M and 81M
  // parameters varied as much between repeats as between sizes, and 16M takes a quarter the time).
  const size_t cap = size_t(transfers ? 128 : 16) << 20;
  const bool scaled = total > cap;
  const double s_hi = scaled ? double(cap) / double(total) : 1.0, s_lo = s_hi / 2;
  auto ranges_at = [&](double scale) {
    Ranges r;
    size_t flat = 0;
    for (size_t n : unit_shard_numel) {
      const size_t m = std::max<size_t>(1024, size_t(double(n) * scale));
      r.push_back({flat, m});
      flat += m;
    }
    return r;
  };
  const Ranges hi = ranges_at(s_hi);
  const size_t flat = hi.back().flat + hi.back().numel;
  size_t largest = 0;
  for (const auto& r : hi) largest = std::max(largest, r.numel);

  std::ostringstream k;
  k << "pass " << canonical_dir(spec.dir) << " units" << U << " embedding_units" << E << (regather ? " regather" : "")
    << " numel" << total << " largest" << *std::max_element(unit_shard_numel.begin(), unit_shard_numel.end()) << " qd"
    << spec.queue_depth << (spec.direct ? "" : " buffered") << " threads" << threads_ << " ranks/host" << comm_.local_world()
    << (transfers ? "" : " overlap");  // its `next` is at the overlap's scale
  const std::string key = k.str();
  // Without `transfers` only the overlap is wanted (and `next`, the transfers it overlaps).
  std::vector<std::string> keys = {key + " next", key + " exposed"};
  if (transfers) keys.push_back(key + " first");
  if (transfers && scaled) keys.push_back(key + " first at half"), keys.push_back(key + " next at half");
  bool all = true;
  for (const std::string& x : keys) all = all && entries_.contains(x);
  if (!all) {
    comm_.barrier();  // every rank starts together: they share the disk as in training
    const auto t_probe = Clock::now();
    // The schedule of ParamGatherer::begin_pass; a unit used at consecutive positions is read once.
    std::vector<int> sched;
    for (int u = E - 1; u >= 0; --u) sched.push_back(u);
    for (int u = E; u < U; ++u) sched.push_back(u);
    for (int u = 0; u < E; ++u) sched.push_back(u);
    const size_t backward_from = sched.size();
    for (int u = E - 1; u >= 0; --u) sched.push_back(u);
    for (int u = U - 1; u >= E; --u) sched.push_back(u);
    if (regather)
      for (int u = E - 1; u >= 0; --u) sched.push_back(u);
    std::vector<int> reads;
    std::vector<bool> in_backward;
    for (size_t i = 0; i < sched.size(); ++i)
      if (reads.empty() || sched[i] != reads.back()) reads.push_back(sched[i]), in_backward.push_back(i >= backward_from);

    std::error_code ec;
    std::filesystem::create_directories(spec.dir, ec);
    ZT_REQUIRE(!ec, "plan: offload.nvme_dir " << spec.dir << ": cannot create it for the pass probe: " << ec.message());
    auto param_file = probe_file(spec.dir, comm_.rank(), "probe_params", flat, spec.direct, uint64_t(comm_.rank()) << 32);
    auto grad_file = probe_file(spec.dir, comm_.rank(), "probe_grads", flat, spec.direct, uint64_t(comm_.rank()) << 32 | 1);
    const size_t buf_numel = io_round_up(largest * 4 + 2 * kIoAlign) / 4;
    AlignedFloats r0(buf_numel), r1(buf_numel), g0(buf_numel), g1(buf_numel);
    settle_disk(spec.dir);
    float sink = 0;
    auto use = [&](int, const float* shard) { sink += shard[0]; };
    auto nothing = [] {};

    // Compute at hook i, in proportion to unit i's parameters (a unit's forward or backward costs
    // about 2 or 4 FLOPs per parameter per token, the embedding's LM head included): `gemms[i]`
    // multiplies of 256 x 256 matrices on the BLAS threads, as the model's matmuls run.
    const int G = 256;
    std::vector<float> ga(size_t(G) * G, 0.5f), gb(size_t(G) * G, 0.25f), gc(size_t(G) * G);
    auto gemm = [&] { cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, G, G, G, 1.0f, ga.data(), G, gb.data(), G, 0.0f, gc.data(), G); };
    std::vector<int> gemms(reads.size(), 0);
    auto compute_at = [&](size_t i) {
      for (int j = 0; j < gemms[i]; ++j) gemm();
    };
    // One micro-step's transfers over the shards `ranges` (optionally with the compute).
    auto pass = [&](const Ranges& ranges, bool fresh, bool with_compute) {
      ShardSource<float> params(param_file.get(), ranges, {r0.p, r1.p}, spec.queue_depth);
      ShardSource<float> grads(grad_file.get(), {}, {g0.p, g1.p}, spec.queue_depth);
      // Read i goes into buffer i % 2, queued one hook before it is used: at hook i the read of
      // i + 1 starts (its buffer's last shard, i - 1's, is done with) and then i is waited for.
      params.request(reads[0], 0, use);
      for (size_t i = 0; i < reads.size(); ++i) {
        if (i + 1 < reads.size()) params.request(reads[i + 1], int((i + 1) % 2), use);
        params.deliver(int(i % 2), use);
        if (with_compute) compute_at(i);
        // A block's gradients are complete after its backward (the embedding's at the very end).
        if (in_backward[i] && reads[i] >= E) {
          const auto& r = ranges[size_t(reads[i])];
          grads.accumulate(r.flat, r.numel, fresh, [&](float* d) { d[0] += 1.0f; });
        }
      }
      for (int u = 0; u < E; ++u) grads.accumulate(ranges[size_t(u)].flat, ranges[size_t(u)].numel, fresh, [&](float* d) { d[0] += 1.0f; });
      grads.flush();
    };
    std::vector<double> v;  // in the order of `keys`
    v.push_back(median_time(3, [&] { pass(hi, false, false); }, nothing));
    // The overlap: as much compute as the transfers take, spread over the hooks by unit size.
    const double t_gemm = best_time(3, [&] { for (int j = 0; j < 16; ++j) gemm(); }) / 16;
    const double want = max_over_ranks(comm_, v[0]) / max_over_ranks(comm_, t_gemm);  // gemms in all
    for (size_t i = 0; i < reads.size(); ++i)
      gemms[i] = int(std::lround(want * double(hi[size_t(reads[i])].numel) / double(2 * flat)));
    const double t_compute = median_time(3, [&] { for (size_t i = 0; i < reads.size(); ++i) compute_at(i); }, nothing);
    const double t_both = median_time(3, [&] { pass(hi, false, true); }, nothing);
    // The share of the shorter of the two that running them together did not hide.
    const double hidden = (v[0] + t_compute - t_both) / std::min(v[0], t_compute);
    v.push_back(std::clamp(1.0 - hidden, 0.0, 1.0) + (sink < 0 ? 1e-30 : 0.0));  // (sink: the reads are used)
    if (transfers) v.push_back(median_time(3, [&] { pass(hi, true, false); }, nothing));
    if (transfers && scaled) {
      const Ranges lo = ranges_at(s_lo);
      v.push_back(median_time(3, [&] { pass(lo, true, false); }, nothing));
      v.push_back(median_time(3, [&] { pass(lo, false, false); }, nothing));
    }
    for (size_t i = 0; i < keys.size(); ++i) record(keys[i], v[i], i == 0 ? seconds_since(t_probe) : 0);
  }
  for (const std::string& x : keys) used_[x] = entries_[x];
  // Along the line through (s_lo, t_lo) and (s_hi, t_hi) to full size; never below t_hi.
  auto full = [&](const std::string& name) {
    const double t_hi = entries_[key + " " + name].get<double>();
    if (!scaled) return t_hi;
    const double t_lo = entries_[key + " " + name + " at half"].get<double>();
    return t_hi + std::max(0.0, t_hi - t_lo) / (s_hi - s_lo) * (1 - s_hi);
  };
  PassCost c;
  c.exposed = entries_[key + " exposed"].get<double>();
  if (!transfers) return c;
  c.first_s = full("first");
  c.next_s = full("next");
  return c;
}


}  // namespace zt::autoplan
