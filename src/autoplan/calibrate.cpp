#include "autoplan/calibrate.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <cblas.h>
#include <omp.h>

#include "backend/ops_cpu.h"
#include "kernels/adamw.h"
#include "model/gpt.h"
#include "offload/swap_file.h"
#include "offload/uring.h"
#include "runtime/error.h"
#include "runtime/output_path.h"

namespace zt::autoplan {
namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// The fastest of `reps` timed calls after one untimed (first-touch page faults, BLAS thread
// start-up): the planner predicts an undisturbed machine, and another job's burst during a probe
// slows some calls, never speeds one up.
template <class F>
double best_time(int reps, F&& f) {
  f();
  double best = 1e300;
  for (int i = 0; i < reps; ++i) {
    const auto t0 = Clock::now();
    f();
    best = std::min(best, seconds_since(t0));
  }
  return best;
}

std::string read_text(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// The first "key : value" line of a /proc file whose key starts with `key`.
std::string proc_field(const std::string& path, const std::string& key) {
  std::ifstream f(path);
  std::string line;
  while (std::getline(f, line))
    if (line.rfind(key, 0) == 0) {
      const size_t colon = line.find(':');
      if (colon == std::string::npos) return "";
      std::string v = line.substr(colon + 1);
      v.erase(0, v.find_first_not_of(" \t"));
      return v;
    }
  return "";
}

// What makes measured rates comparable: the same host, CPU, CPUs, memory and build.
nlohmann::json this_machine(const std::string& version) {
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  return {{"host", host},
          {"cpu", proc_field("/proc/cpuinfo", "model name")},
          {"cpus", long(sysconf(_SC_NPROCESSORS_ONLN))},  // the host's; a rank's share is in each probe's key
          {"mem_total", proc_field("/proc/meminfo", "MemTotal")},
          {"zerotrain", version}};
}

double max_over_ranks(Comm& comm, double v) {
  uint64_t bits;
  std::memcpy(&bits, &v, 8);
  double m = 0;
  for (uint64_t b : comm.all_gather_u64(bits)) {
    double x;
    std::memcpy(&x, &b, 8);
    m = std::max(m, x);
  }
  return m;
}

// One forward + backward of a model of cfg.L blocks at (b, T): what the trainer's micro-step runs.
double time_micro_step(const GPTConfig& cfg, int b, int T, const Recompute& rc, int embedding_rows) {
  using Ops = CpuOps<float>;
  MemoryTracker mem;
  GPT<Ops> model(cfg, b, T, mem, 128, true, true, rc, embedding_rows);
  model.init_gpt2(1);
  std::vector<int> in(size_t(b) * T), tg(in.size());
  for (size_t i = 0; i < in.size(); ++i) in[i] = int((i * 7919) % size_t(cfg.V)), tg[i] = int((i * 104729 + 1) % size_t(cfg.V));
  return best_time(5, [&] {
    model.zero_grad();
    model.forward(in.data(), tg.data(), b, T, true, Ops::S(1.0 / (double(b) * T)));
    model.backward();
  });
}

}  // namespace

std::string default_cache_path() {
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x) return std::string(x) + "/zerotrain/calibration.json";
  const char* home = std::getenv("HOME");
  ZT_REQUIRE(home && *home, "plan: neither XDG_CACHE_HOME nor HOME is set: give the calibration cache with --calibration FILE");
  return std::string(home) + "/.cache/zerotrain/calibration.json";
}

Calibration::Calibration(Comm& comm, std::string cache_path, int threads, const std::string& version,
                         std::vector<std::string>& notes)
    : comm_(comm), path_(std::move(cache_path)), threads_(threads), machine_(this_machine(version)), notes_(notes) {
  omp_set_num_threads(threads_);
  openblas_set_num_threads(threads_);
  // Rank 0 reads the cache; every rank gets its text, so all take the same probes (collectives).
  std::string text;
  if (comm_.rank() == 0) {
    std::error_code ec;
    if (std::filesystem::is_regular_file(path_, ec)) {
      text = read_text(path_);
      nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
      if (j.is_discarded() || !j.is_object() || !j.contains("zerotrain_calibration"))
        throw Error("--calibration " + path_ + ": not a zerotrain calibration cache (it would be replaced): give another path");
      if (j["machine"] != machine_) {
        notes_.push_back("calibration: " + path_ + " was measured on another machine or build (" + j["machine"].dump() +
                         "); measuring again, it will be replaced");
        text.clear();
      }
    }
  }
  uint64_t n = text.size();
  comm_.wait(comm_.broadcast(&n, sizeof n, 0));
  text.resize(n);
  if (n) comm_.wait(comm_.broadcast(text.data(), n, 0));
  if (n) entries_ = nlohmann::json::parse(text)["entries"];
}

double Calibration::cached(const std::string& key, const std::function<double()>& probe) {
  double v;
  if (entries_.contains(key)) {
    v = entries_[key].get<double>();
  } else {
    comm_.barrier();  // every rank starts together: they share the machine as in training
    v = max_over_ranks(comm_, probe());
    entries_[key] = v;
    ++measured_;
    if (comm_.rank() == 0) {  // progress, and the number itself
      std::printf("  %s: %.6g\n", key.c_str(), v);
      std::fflush(stdout);
    }
  }
  used_[key] = v;
  return v;
}

MicroStepCost Calibration::micro_step(const GPTConfig& cfg, int b, int T, Recompute::Policy policy, int classifier_chunk,
                                      int embedding_rows) {
  static const char* names[] = {"none", "selective", "block"};
  auto key = [&](Recompute::Policy p, int L) {
    std::ostringstream k;
    k << "micro_step C" << cfg.C << " NH" << cfg.NH << " V" << cfg.V << " T" << T << " B" << b << " " << names[int(p)]
      << " chunk" << classifier_chunk << " embedding_rows" << embedding_rows << " threads" << threads_ << " ranks/host" << comm_.local_world() << " L" << L;
    return k.str();
  };
  auto model = [&](Recompute::Policy p, int L) {
    return cached(key(p, L), [&] {
      GPTConfig c = cfg;
      c.L = L;
      Recompute rc;
      rc.policy = p;
      rc.every = 1;
      rc.classifier_chunk = classifier_chunk;
      return time_micro_step(c, b, T, rc, embedding_rows);
    });
  };
  // A block and the rest from models of 1 and 3 blocks without recomputation; a policy's block
  // costs what its 3-block model adds to that, never less than nothing (recomputing saves no time,
  // and a difference of two timings can come out negative).
  const double t1 = model(Recompute::Policy::none, 1), t3 = model(Recompute::Policy::none, 3);
  MicroStepCost m;
  m.block_s = std::max(0.0, (t3 - t1) / 2);
  m.fixed_s = std::max(0.0, t1 - m.block_s);
  if (policy != Recompute::Policy::none) m.block_s += std::max(0.0, model(policy, 3) - t3) / 3;
  return m;
}

double Calibration::adamw_s_per_param() {
  const size_t n = size_t(1) << 22;  // 64 MiB of state: far past the caches, as any real shard
  std::ostringstream k;
  k << "adamw threads" << threads_ << " ranks/host" << comm_.local_world();
  return cached(k.str(), [&] {
    std::vector<float> p(n, 0.5f), g(n, 0.01f), m(n, 0.0f), v(n, 0.0f);
    cpu::AdamWArgs a{1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 1.0f, 1};
    return best_time(3, [&] {
      cpu::adamw_update(p.data(), g.data(), m.data(), v.data(), n, a);
      ++a.step;
    }) / double(n);
  });
}

LinkCost Calibration::link(const std::string& op, size_t bytes) {
  const int N = comm_.world();
  if (N == 1) return {0, 1e30};
  // Whole buffers of n floats, n a multiple of N, at `bytes` and at a sixteenth of it.
  auto time_at = [&](size_t full_bytes, double& sent) {
    const size_t share = std::max<size_t>(1024, full_bytes / 4 / size_t(N));
    const size_t n = share * size_t(N);
    std::vector<float> a(n, 1.0f), r(n, 0.0f);
    if (op == "all_reduce") sent = double(2 * (N - 1)) * 4.0 * double(n) / N;
    else sent = double(N - 1) * 4.0 * double(share);
    std::ostringstream k;
    k << "link " << op << " N" << N << " ranks/host" << comm_.local_world() << " bytes" << n * 4;
    return cached(k.str(), [&] {
      return best_time(3, [&] {
        if (op == "all_reduce") comm_.wait(comm_.all_reduce(a.data(), n));
        else if (op == "reduce_scatter") comm_.wait(comm_.reduce_scatter(a.data(), r.data(), share));
        else comm_.wait(comm_.all_gather(a.data(), r.data(), share));
      });
    });
  };
  double big_sent = 0, small_sent = 0;
  const double t_big = time_at(bytes, big_sent);
  const double t_small = time_at(bytes / 16, small_sent);
  LinkCost c;
  if (t_big > t_small && big_sent > small_sent) {
    c.bytes_per_s = (big_sent - small_sent) / (t_big - t_small);
    c.alpha_s = std::max(0.0, t_small - small_sent / c.bytes_per_s);
  } else {  // the two sizes did not tell latency from bandwidth apart: all of it bandwidth
    c.bytes_per_s = big_sent / t_big;
  }
  return c;
}

double Calibration::overlap_exposed_share(const GPTConfig& cfg, int T, size_t bytes) {
  const int N = comm_.world();
  if (N == 1) return 0;
  std::ostringstream k;
  k << "overlap C" << cfg.C << " NH" << cfg.NH << " V" << cfg.V << " T" << T << " N" << N << " ranks/host"
    << comm_.local_world() << " threads" << threads_ << " bytes" << bytes;
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

double Calibration::disk_bytes_per_s(const std::string& dir, bool direct) {
  std::error_code ec;
  const std::string where = std::filesystem::weakly_canonical(dir, ec).string();
  std::ostringstream k;
  k << "disk " << (where.empty() ? dir : where) << " ranks/host" << comm_.local_world();
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

void Calibration::save() {
  if (comm_.rank() != 0 || measured_ == 0) return;
  const std::string target = check_output_path("--calibration", path_);
  std::error_code ec;
  std::filesystem::create_directories(std::filesystem::path(target).parent_path(), ec);
  const nlohmann::json j = {{"zerotrain_calibration", 1}, {"machine", machine_}, {"entries", entries_}};
  write_by_rename("--calibration", target, [&](const std::string& tmp) {
    std::ofstream f(tmp);
    f << j.dump(2) << "\n";
    ZT_REQUIRE(f.good(), "--calibration " << tmp << ": write failed");
  });
}

}  // namespace zt::autoplan
