// Link probes (calibrate.h): a collective's latency and bandwidth, and its overlap with compute.
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

LinkCost Calibration::link(const std::string& op, size_t bytes, Comm* group, const std::string& group_name,
                           std::vector<LinkPoint>* points) {
  Comm& g = group ? *group : comm_;
  const int N = g.world();
  if (N == 1) return {0, 1e30};
  // Whole buffers of n floats, n a multiple of N, at `bytes` and at a sixteenth of it; each timed
  // as a run of collectives back to back, kRunBytes sent in all (up to kMostInRun of them), per
  // collective. Training sends them back to back; one alone on an idle link can cross faster than
  // the link's rate where the link lets a burst through first (tc's token bucket: a 1 MB burst let
  // a tensor group's sub-MB all-reduce cross a 125 MB/s link at 289 MB/s; docs/autoplan.md,
  // "Measured: the mesh").
  constexpr double kRunBytes = 8 << 20;
  constexpr double kMostInRun = 128;
  auto time_at = [&](size_t full_bytes, double& sent) {
    const size_t share = std::max<size_t>(1024, full_bytes / 4 / size_t(N));
    const size_t n = share * size_t(N);
    std::vector<float> a(n, 1.0f), r(n, 0.0f);
    if (op == "all_reduce") sent = double(2 * (N - 1)) * 4.0 * double(n) / N;
    else sent = double(N - 1) * 4.0 * double(share);
    const int run = int(std::clamp(std::ceil(kRunBytes / sent), 1.0, kMostInRun));
    std::ostringstream k;
    k << "link " << op << " N" << N << (group_name.empty() ? "" : " " + group_name) << " ranks/host" << comm_.local_world()
      << " bytes" << n * 4 << " run" << run << " " << comm_settings_;
    return cached(k.str(), [&] {
      return best_time(3, [&] {
        for (int i = 0; i < run; ++i) {
          if (op == "all_reduce") g.wait(g.all_reduce(a.data(), n));
          else if (op == "reduce_scatter") g.wait(g.reduce_scatter(a.data(), r.data(), share));
          else g.wait(g.all_gather(a.data(), r.data(), share));
        }
      }) / run;
    });
  };
  double big_sent = 0, small_sent = 0;
  const double t_big = time_at(bytes, big_sent);
  const double t_small = time_at(bytes / 16, small_sent);
  const std::vector<LinkPoint> mine = {{small_sent, t_small}, {big_sent, t_big}};
  if (points) points->insert(points->end(), mine.begin(), mine.end());
  return fit_link(mine);
}

LinkCost fit_link(const std::vector<LinkPoint>& points) {
  // Least squares of seconds = alpha + bytes / bytes_per_s.
  const double n = double(points.size());
  double sx = 0, sy = 0, sxx = 0, sxy = 0, most = 0, most_t = 1;
  for (const LinkPoint& p : points) {
    sx += p.bytes, sy += p.seconds, sxx += p.bytes * p.bytes, sxy += p.bytes * p.seconds;
    if (p.bytes > most) most = p.bytes, most_t = p.seconds;
  }
  const double det = n * sxx - sx * sx, slope = det > 0 ? (n * sxy - sx * sy) / det : 0;
  LinkCost c;
  if (slope > 0) {
    c.bytes_per_s = 1 / slope;
    c.alpha_s = std::max(0.0, (sy - slope * sx) / n);
  } else {  // the sizes did not tell latency from bandwidth apart: all of it bandwidth
    c.bytes_per_s = most / most_t;
  }
  return c;
}

LinkCost Calibration::stage_link(int P, size_t bytes) {
  const int N = comm_.world(), per_stage = N / P, rank = comm_.rank();
  const int stage = rank / per_stage, peer_stage = stage ^ 1;
  const int peer = peer_stage < P ? peer_stage * per_stage + rank % per_stage : -1;  // an odd last stage waits
  auto time_at = [&](size_t n) {
    std::vector<char> out(n, 1), in(n, 0);
    std::ostringstream k;
    k << "stage_link P" << P << " N" << N << " ranks/host" << comm_.local_world() << " bytes" << n << " " << comm_settings_;
    return cached(k.str(), [&] {
      return best_time(3, [&] {
        if (peer < 0) return;
        const CommHandle r = comm_.recv(in.data(), n, peer);
        const CommHandle s = comm_.send(out.data(), n, peer);
        comm_.wait(s);
        comm_.wait(r);
      });
    });
  };
  const size_t big = std::max<size_t>(bytes, 64 << 10), small = big / 16;
  const double t_big = time_at(big), t_small = time_at(small);
  LinkCost c;
  if (t_big > t_small) {
    c.bytes_per_s = double(big - small) / (t_big - t_small);
    c.alpha_s = std::max(0.0, t_small - double(small) / c.bytes_per_s);
  } else {
    c.bytes_per_s = double(big) / t_big;
  }
  return c;
}

double Calibration::overlap_exposed_share(const GPTConfig& cfg, int T, size_t bytes) {
  const int N = comm_.world();
  if (N == 1) return 0;
  std::ostringstream k;
  k << "overlap C" << cfg.C << " NH" << cfg.NH << " V" << cfg.V << " T" << T << " N" << N << " ranks/host"
    << comm_.local_world() << " threads" << threads_ << " bytes" << bytes << " " << comm_settings_;
  return cached(k.str(), [&] {
    using Ops = CpuOps<float>;
    GPTConfig c = cfg;
    c.L = 1;
    MemoryTracker mem;
    GPT<Ops> model(c, 1, T, mem, 128, true, true, Recompute{});
    model.init_gpt2(1);
    std::vector<int> in(static_cast<size_t>(T)), tg(in.size());
    for (size_t i = 0; i < in.size(); ++i) in[i] = int((i * 7919) % size_t(c.V)), tg[i] = int((i * 104729 + 1) % size_t(c.V));
    auto compute = [&] {
      model.zero_grad();
      model.forward(in.data(), tg.data(), 1, T, true, Ops::S(1.0 / T));
      model.backward();
    };
    const size_t share = std::max<size_t>(1024, bytes / 4 / size_t(N));
    std::vector<float> a(share, 1.0f), r(share * size_t(N), 0.0f);
    // As many all-gathers as take about as long as the compute (every rank the same count).
    const double t_compute = best_time(3, compute);
    const double t_one = best_time(3, [&] { comm_.wait(comm_.all_gather(a.data(), r.data(), share)); });
    const int count = int(std::clamp(std::round(max_over_ranks(comm_, t_compute) / max_over_ranks(comm_, t_one)), 1.0, 64.0));
    auto collectives = [&](bool with_compute) {
      std::vector<CommHandle> h;
      for (int i = 0; i < count; ++i) h.push_back(comm_.all_gather(a.data(), r.data(), share));
      if (with_compute) compute();
      for (CommHandle x : h) comm_.wait(x);
    };
    comm_.barrier();
    const double t_comm = best_time(3, [&] { collectives(false); });
    comm_.barrier();
    const double t_both = best_time(3, [&] { collectives(true); });
    // The share of the shorter of the two that running them together did not hide.
    const double hidden = (t_compute + t_comm - t_both) / std::min(t_compute, t_comm);
    return std::clamp(1.0 - hidden, 0.0, 1.0);
  });
}


}  // namespace zt::autoplan
