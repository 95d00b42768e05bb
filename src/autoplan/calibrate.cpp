#include "autoplan/calibrate.h"

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

// The same (the untimed call only where `warm_up`: not where a call before touched everything),
// but stopping early once the measurement is steady: after `least` timed calls, as soon
// as the two fastest agree within `agree` (relative) on every rank, else after `most`. Two calls
// that agree were both undisturbed (a burst would have to slow both by the same), so more calls
// would not find a faster one. Collective: every rank makes the same number of calls, so that
// ranks sharing cores run together as they do in training.
template <class F>
double steady_best_time(Comm& comm, int least, int most, double agree, bool warm_up, F&& f) {
  if (warm_up) f();
  std::vector<double> t;
  for (int i = 0; i < most; ++i) {
    const auto t0 = Clock::now();
    f();
    t.push_back(seconds_since(t0));
    if (int(t.size()) < least) continue;
    std::vector<double> sorted = t;
    std::sort(sorted.begin(), sorted.end());
    const uint64_t steady = sorted[1] <= sorted[0] * (1 + agree) ? 1 : 0;
    uint64_t all = 1;
    for (uint64_t x : comm.all_gather_u64(steady)) all &= x;
    if (all) break;
  }
  return *std::min_element(t.begin(), t.end());
}

// The median of `reps` timed calls of f after one untimed, each call after an untimed before():
// for the disk, whose rate moves from call to call by itself (a virtual disk's host cache), where
// the fastest would promise its best moment.
template <class F, class G>
double median_time(int reps, F&& f, G&& before) {
  before();
  f();
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    before();
    const auto t0 = Clock::now();
    f();
    t.push_back(seconds_since(t0));
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

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

std::string canonical_dir(const std::string& dir) {
  std::error_code ec;
  const std::string where = std::filesystem::weakly_canonical(dir, ec).string();
  return where.empty() ? dir : where;
}

namespace {

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

// One forward + backward of a model of cfg.L blocks at micro-batch b <= the model's: what the
// trainer's micro-step runs.
template <class Model>
double time_micro_step(Comm& comm, Model& model, int V, int b, int T, bool warm_up) {
  std::vector<int> in(size_t(b) * T), tg(in.size());
  for (size_t i = 0; i < in.size(); ++i) in[i] = int((i * 7919) % size_t(V)), tg[i] = int((i * 104729 + 1) % size_t(V));
  return steady_best_time(comm, 3, 5, 0.02, warm_up, [&] {
    model.zero_grad();
    model.forward(in.data(), tg.data(), b, T, true, typename Model::S(1.0 / (double(b) * T)));
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

namespace {

// Every probe stores seconds (a whole call's, or per parameter or byte moved) or a share, the
// slowest rank's (max_over_ranks: never below 0). Past a day, or below a femtosecond, no probe of
// this machine measured it.
constexpr double kLeastSeconds = 1e-15, kMostSeconds = 86400;

// Why the cached `v` of `key` cannot be what its probe measured; "" when it can.
std::string bad_entry(const std::string& key, const nlohmann::json& v) {
  if (!v.is_number()) return "not a number";
  const double x = v.get<double>();
  if (!std::isfinite(x)) return "not finite";
  auto ends = [&](const std::string& tail) {
    return key.size() >= tail.size() && key.compare(key.size() - tail.size(), tail.size(), tail) == 0;
  };
  if (key.rfind("overlap ", 0) == 0 || ends(" exposed")) return x >= 0 && x <= 1 ? "" : "not a share from 0 to 1";
  // Differences of two times (the engine run's later micro-steps and flush) may come out 0.
  if (x == 0 && (ends(" next") || ends(" flush"))) return "";
  if (x < kLeastSeconds || x > kMostSeconds) return "not a time a probe measures (1e-15 to 86400 s)";
  return "";
}

}  // namespace

Calibration::Calibration(Comm& comm, std::string cache_path, int threads, const std::string& version,
                         std::string comm_settings, std::vector<std::string>& notes)
    : comm_(comm), path_(std::move(cache_path)), threads_(threads), comm_settings_(std::move(comm_settings)),
      machine_(this_machine(version)), notes_(notes) {
  omp_set_num_threads(threads_);
  openblas_set_num_threads(threads_);
  // Rank 0 takes the lock first; while another planner holds it every rank waits, a second at a
  // time (short collectives: one long wait would pass the comm layer's hang timeout).
  if (comm_.rank() == 0) {
    std::error_code ec;
    const std::filesystem::path parent = std::filesystem::path(path_).parent_path();
    if (!parent.empty()) std::filesystem::create_directories(parent, ec);
    // Best effort: where no lock file can be made, the cache cannot be written either (save
    // refuses), so no entries of another planner's can be lost.
    lock_fd_ = ::open((path_ + ".lock").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  }
  for (bool said = false;;) {
    uint64_t got = comm_.rank() != 0 || lock_fd_ < 0 || ::flock(lock_fd_, LOCK_EX | LOCK_NB) == 0 ? 1 : 0;
    comm_.wait(comm_.broadcast(&got, sizeof got, 0));
    if (got) break;
    if (comm_.rank() == 0 && !said) {
      std::printf("calibration: %s is in use by another planner (%s.lock held); waiting for it to finish\n", path_.c_str(),
                  path_.c_str());
      std::fflush(stdout);
    }
    said = true;
    ::sleep(1);
  }
  // Rank 0 reads and checks the cache; every rank gets the same entries, so all take the same
  // probes (collectives).
  std::string text;
  if (comm_.rank() == 0) {
    std::error_code ec;
    if (std::filesystem::is_regular_file(path_, ec)) {
      nlohmann::json j = nlohmann::json::parse(read_text(path_), nullptr, false);
      if (j.is_discarded() || !j.is_object() || !j.contains("zerotrain_calibration"))
        throw Error("--calibration " + path_ + ": not a zerotrain calibration cache (it would be replaced): give another path");
      ZT_REQUIRE(j.contains("entries") && j["entries"].is_object(),
                 "--calibration " << path_ << ": its \"entries\" is not an object: not a calibration cache this build "
                                  << "reads (it would be replaced): remove it or give another path");
      if (j["machine"] != machine_) {
        notes_.push_back("calibration: " + path_ + " was measured on another machine or build (" + clip(j["machine"].dump(), 300) +
                         "); measuring again, it will be replaced");
      } else {
        nlohmann::json kept = nlohmann::json::object();
        for (const auto& [key, v] : j["entries"].items()) {
          const std::string why = bad_entry(key, v);
          if (why.empty()) kept[key] = v;
          else
            notes_.push_back("warning: calibration: " + path_ + ": \"" + clip(key, 200) + "\" is " + clip(v.dump(), 40) +
                             ", " + why + ": measuring it again");
        }
        text = kept.dump();
      }
    }
  }
  uint64_t n = text.size();
  comm_.wait(comm_.broadcast(&n, sizeof n, 0));
  text.resize(n);
  if (n) comm_.wait(comm_.broadcast(text.data(), n, 0));
  if (n) entries_ = nlohmann::json::parse(text);
}

Calibration::~Calibration() {
  if (lock_fd_ >= 0) ::close(lock_fd_);
}

double Calibration::cached(const std::string& key, const std::function<double()>& probe) {
  if (!entries_.contains(key)) {
    comm_.barrier();  // every rank starts together: they share the machine as in training
    const auto t0 = Clock::now();
    const double v = probe();
    record(key, v, seconds_since(t0));
  }
  const double v = entries_[key].get<double>();
  used_[key] = v;
  return v;
}

void Calibration::record(const std::string& key, double mine, double took_s) {
  const double v = max_over_ranks(comm_, mine);
  entries_[key] = v;
  ++measured_;
  if (comm_.rank() == 0) {  // progress, the number itself, and what measuring it took
    std::printf("  %s: %.6g", key.c_str(), v);
    if (took_s >= 0.05) std::printf("  (%.1f s)", took_s);
    std::printf("\n");
    std::fflush(stdout);
  }
}

std::map<int, MicroStepCost> Calibration::micro_steps(const GPTConfig& cfg, const std::set<int>& bs, int T,
                                                      Recompute::Policy policy, int classifier_chunk, int embedding_rows) {
  static const char* names[] = {"none", "selective", "block"};
  auto key = [&](Recompute::Policy p, int L, int b) {
    std::ostringstream k;
    k << "micro_step C" << cfg.C << " NH" << cfg.NH << " V" << cfg.V << " T" << T << " B" << b << " " << names[int(p)]
      << " chunk" << classifier_chunk << " embedding_rows" << embedding_rows << " threads" << threads_ << " ranks/host" << comm_.local_world() << " L" << L;
    return k.str();
  };
  // Seconds per micro-step of a model of L blocks under p, for every b: one model, built at the
  // largest b not yet cached (its build and initialisation cost more than a step), run at each b
  // (a smaller batch uses the first rows of its buffers, as the engine's last micro-batch would).
  auto timings = [&](Recompute::Policy p, int L) {
    int largest = 0;
    for (int b : bs)
      if (!has(key(p, L, b))) largest = b;  // bs is ascending
    MemoryTracker mem;  // before the model: destroyed after it, which releases into it
    std::unique_ptr<GPT<CpuOps<float>>> model;
    if (largest > 0) {
      GPTConfig c = cfg;
      c.L = L;
      Recompute rc;
      rc.policy = p;
      rc.every = 1;
      rc.classifier_chunk = classifier_chunk;
      model = std::make_unique<GPT<CpuOps<float>>>(c, largest, T, mem, 128, true, true, rc, embedding_rows);
      model->init_gpt2(1);
    }
    // Largest first: its untimed first call touches every buffer, so the smaller ones need none.
    std::map<int, double> t;
    bool touched = false;
    for (auto b = bs.rbegin(); b != bs.rend(); ++b)
      t[*b] = cached(key(p, L, *b), [&] {
        const double s = time_micro_step(comm_, *model, cfg.V, *b, T, /*warm_up=*/!touched);
        touched = true;
        return s;
      });
    return t;
  };
  // A block and the rest from models of 1 and 3 blocks without recomputation. A policy's block
  // costs what its 3-block model adds to that, per sequence of the micro-batch: the sum of what it
  // adds at every b over the sum of the b (recomputation is a forward again, its work per
  // sequence), never less than nothing (recomputing saves no time, and a difference of two timings
  // can come out negative). One probe disturbed then moves it by its share, not whole: scenario 1's
  // selective 3-block model at B 2 added 1.9 ms a block where B 1, 4 and 8 added 0 to 0.2 ms, and
  // its B 2 x 4 candidate came out +21% (docs/autoplan.md, "Measured").
  const std::map<int, double> t1 = timings(Recompute::Policy::none, 1), t3 = timings(Recompute::Policy::none, 3);
  double recompute_per_sequence_s = 0;
  if (policy != Recompute::Policy::none) {
    const std::map<int, double> tp = timings(policy, 3);
    double added = 0, sequences = 0;
    for (int b : bs) added += (tp.at(b) - t3.at(b)) / 3, sequences += b;
    recompute_per_sequence_s = std::max(0.0, added / sequences);
  }
  std::map<int, MicroStepCost> out;
  for (int b : bs) {
    MicroStepCost& m = out[b];
    m.block_s = std::max(0.0, (t3.at(b) - t1.at(b)) / 2);
    m.fixed_s = std::max(0.0, t1.at(b) - m.block_s);
    m.block_s += recompute_per_sequence_s * b;
  }
  return out;
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
    k << "link " << op << " N" << N << " ranks/host" << comm_.local_world() << " bytes" << n * 4 << " " << comm_settings_;
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

void Calibration::save() {
  if (comm_.rank() != 0 || saved_) return;
  saved_ = true;
  // The lock goes with the save, not with the planner: --validate after it may run for minutes.
  struct Unlock {
    int& fd;
    ~Unlock() {
      if (fd >= 0) ::close(fd), fd = -1;
    }
  } unlock{lock_fd_};
  if (measured_ == 0) return;
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
