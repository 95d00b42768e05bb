#include "autoplan/engine_runs.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <numeric>
#include <sstream>
#include <vector>

#include "runtime/error.h"
#include "train/backend_choice.h"

namespace zt::autoplan {
namespace {

constexpr int kEngineProbeMicroSteps = 4;  // the engine run's grad_accum with parameter offload
constexpr int kEngineProbeSteps = 3;  // an engine run's steps: the first untimed, the faster of the other two
constexpr int kEngineProbeRuns = 3;  // an engine run is made up to this many times,
constexpr double kEngineProbeBudget_s = 4;  // another only while those before took less in all

// The median of xs after the first (the first step pays for first touches).
double median_after_first(const std::vector<double>& xs) {
  std::vector<double> t(xs.begin() + 1, xs.end());
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// The directory of the run in progress (rank 0's), for the signal path: SIGINT, SIGTERM or SIGHUP
// during a probe or --validate run end the process (those runs save nothing), and an exception's
// RAII never runs there. Fixed storage: the handler may only make async-signal-safe calls.
char g_run_dir[4096];

extern "C" void remove_run_dir_and_die(int sig) {
  if (g_run_dir[0]) {
    char path[sizeof g_run_dir + 32];
    for (const char* name : {"/metrics.jsonl", "/plan.json"}) {
      size_t n = 0;
      for (const char* p = g_run_dir; *p && n + 1 < sizeof path; ++p) path[n++] = *p;
      for (const char* p = name; *p && n + 1 < sizeof path; ++p) path[n++] = *p;
      path[n] = 0;
      (void)::unlink(path);
    }
    (void)::rmdir(g_run_dir);
  }
  ::signal(sig, SIG_DFL);
  ::raise(sig);
}

// A run's directory (rank 0's), removed when it goes out of scope: on an exception too.
struct RunDir {
  std::string path;
  ~RunDir() {
    if (path.empty()) return;
    g_run_dir[0] = 0;
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
};

// Runs `plan` for a few steps in this process on `comm`. Its output goes nowhere; its log and
// plan.json to a directory under `parent` (--out's: somewhere the user named, should a SIGKILL leave
// it) removed after. Everything else a plan can write outside that directory is dropped:
// checkpoints (a base with checkpoint.every but no dir is refused, and a probe must not save into
// or resume from the user's), final weights, the trace, samples; and fault injection.
TrainResult run_steps(const nlohmann::json& resolved, int steps, Comm& comm, const std::string& parent) {
  RunDir dir;
  if (comm.rank() == 0) {
    std::string tmpl = (std::filesystem::path(parent.empty() ? "." : parent) / "zt-plan-run-XXXXXX").string();
    ZT_CHECK_ERRNO(mkdtemp(tmpl.data()) != nullptr, "plan: a directory for the probe and --validate runs: mkdtemp " << tmpl);
    dir.path = tmpl;
    if (dir.path.size() < sizeof g_run_dir) std::memcpy(g_run_dir, dir.path.c_str(), dir.path.size() + 1);
  }
  uint64_t n = dir.path.size();
  comm.wait(comm.broadcast(&n, sizeof n, 0));
  std::string where(n, '\0');
  if (comm.rank() == 0) where = dir.path;
  comm.wait(comm.broadcast(where.data(), n, 0));
  nlohmann::json j = resolved;
  j["run"]["steps"] = steps;
  j["run"]["eval_every"] = 0;
  j["run"]["eval_batches"] = 1;
  j["run"]["sample_every"] = 0;
  j["run"]["log"] = where + "/metrics.jsonl";
  j["run"]["final_weights"] = "";
  j["run"]["trace"] = "";
  j["data"]["tokenizer"] = "";
  j["checkpoint"]["dir"] = "";
  j["checkpoint"]["every"] = 0;
  j["checkpoint"]["resume"] = "none";
  j["comm"]["fault_skip_rank"] = -1;
  j["comm"]["fault_skip_step"] = -1;
  Plan plan = plan_from_json(j, true);
  plan.source = "candidate";
  const std::string backend = choose_backend(plan, comm.world());
  record_backend(plan, backend);
  record_comm_backend(plan, choose_comm_backend(plan, backend, comm));
  std::fflush(stdout);
  const int saved = dup(1), null = open("/dev/null", O_WRONLY);
  dup2(null, 1);
  TrainResult r;
  try {
    r = train(plan, comm);
  } catch (...) {
    std::fflush(stdout);
    dup2(saved, 1);
    close(saved), close(null);
    throw;
  }
  std::fflush(stdout);
  dup2(saved, 1);
  close(saved), close(null);
  // Its swap files are gone: written back and trimmed before the next candidate runs.
  if (plan.offload.optimizer == "nvme" || plan.offload.params == "nvme") settle_disk(plan.offload.nvme_dir);
  comm.barrier();
  return r;
}

}  // namespace

RunDirSignals::RunDirSignals() {
  struct sigaction sa = {};
  sa.sa_handler = remove_run_dir_and_die;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART | SA_RESETHAND;
  for (size_t i = 0; i < 3; ++i) ::sigaction(kSignals[i], &sa, &old_[i]);
}
RunDirSignals::~RunDirSignals() {
  for (size_t i = 0; i < 3; ++i) ::sigaction(kSignals[i], &old_[i], nullptr);
}

Measured measure(const nlohmann::json& resolved, int steps, Comm& comm, const std::string& parent) {
  const TrainResult r = run_steps(resolved, steps, comm, parent);
  return {median_after_first(r.step_ms) / 1e3, median_after_first(r.update_ms) / 1e3};
}

EngineRates engine_rates(const Candidate& c, Calibration& cal, Comm& comm, const std::string& parent) {
  const bool passes = c.choice.params_offloaded;
  auto key = [&](int grad_accum) {
    std::ostringstream k;
    k << "engine " << canonical_dir(c.swap.dir) << " " << c.choice.offload() << " units" << c.unit_shards.size()
      << " numel" << uint64_t(c.shape.shard_params) << " world" << c.shape.world << " qd" << c.swap.queue_depth
      << " subgroup" << c.swap.subgroup_numel << " sets" << c.swap.buffer_count << " threads" << cal.threads()
      << " ranks/host" << comm.local_world() << " seq" << c.resolved["model"]["seq_len"].get<int>()
      << (cal.comm_settings().empty() ? "" : " " + cal.comm_settings()) << " grad_accum" << grad_accum;
    return k.str();
  };
  struct Run {
    double step, update, first, next, flush;  // of its fastest step
    double fastest_update;  // of any step after the first, by the slowest rank's
  };
  std::map<int, std::vector<Run>> runs_at;  // by grad_accum
  auto run_once = [&](int grad_accum) {
    std::vector<Run>& runs = runs_at[grad_accum];
    nlohmann::json j = c.resolved;
    j["batch"]["micro_batch"] = 1;
    j["batch"]["grad_accum"] = grad_accum;
    j["recompute"]["policy"] = "none";
    if (!passes && c.shape.world > 1) j["zero"]["stage"] = 3;
    settle_disk(c.swap.dir);  // what the probes before left: written back and trimmed
    const auto t0 = std::chrono::steady_clock::now();
    const TrainResult r = run_steps(j, kEngineProbeSteps, comm, parent);
    // The parts of one step, the fastest after the first (by the slowest rank's time, so that every
    // rank takes the same step), as every probe keeps its fastest repeat: parts of one step add up
    // to at most its time, which the fastest (or medians) of each part taken apart need not (under
    // load they did not, by 20%). 3 steps and not 4 (the median of the last 3, before):
    // scenario 3's calibration took 54-62 s, and its runs of 4 a third of that.
    std::vector<double> slowest(r.step_ms.size());
    for (size_t x = 0; x < slowest.size(); ++x)
      for (uint64_t us : comm.all_gather_u64(uint64_t(r.step_ms[x] * 1e3))) slowest[x] = std::max(slowest[x], us / 1e3);
    std::vector<size_t> order(r.step_ms.size() - 1);
    std::iota(order.begin(), order.end(), size_t(1));
    std::sort(order.begin(), order.end(), [&](size_t x, size_t y) { return slowest[x] < slowest[y]; });
    const size_t i = order.front();
    const double later = grad_accum > 1 ? (r.backward_ms[i] - r.first_micro_ms[i]) / (grad_accum - 1) : 0;
    const double flush = r.gradients_ms[i] - r.backward_ms[i];
    double fastest_update = 1e300;
    for (size_t x = 1; x < r.update_ms.size(); ++x) {
      double u = 0;
      for (uint64_t us : comm.all_gather_u64(uint64_t(r.update_ms[x] * 1e3))) u = std::max(u, us / 1e3);
      fastest_update = std::min(fastest_update, u);
    }
    runs.push_back({r.step_ms[i] / 1e3, r.update_ms[i] / 1e3, r.first_micro_ms[i] / 1e3, later / 1e3, flush / 1e3,
                    fastest_update / 1e3});
    // Every rank decides alike: by the slowest rank's time.
    uint64_t ms = uint64_t(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    for (uint64_t x : comm.all_gather_u64(ms)) ms = std::max(ms, x);
    return ms / 1e3;
  };
  auto measured = [&](int grad_accum) -> const Run& {
    std::vector<Run>& runs = runs_at[grad_accum];
    // Up to kEngineProbeRuns, while the runs so far took under kEngineProbeBudget_s in all: a rule
    // of one run's length (3 runs where one took under 4 s) made scenario 3's calibration jump by
    // 8 s when its 4.0-4.1 s run came out just under (the minute of calibration: 54-62 s).
    if (runs.empty())
      for (double spent = 0; int(runs.size()) < kEngineProbeRuns && spent < kEngineProbeBudget_s;) spent += run_once(grad_accum);
    // The fastest run, as every probe keeps its fastest repeat and --validate its fastest round:
    // the update of one partition ran at two speeds, 0.13 s and 0.19-0.27 s, from run to run
    // (scenario 2's parameter offload, 2026-11-27), and the median of 3 took the slow one.
    std::sort(runs.begin(), runs.end(), [](const Run& a, const Run& b) { return a.step < b.step; });
    return runs.front();
  };
  // The update from a run of one micro-step; with parameter offload, the micro-steps from a second
  // run, of kEngineProbeMicroSteps (4, not 2: the later micro-steps and the flush apart, which one
  // later micro-step cannot give). The update has a run of its own because that run is short,
  // so made more often (up to 3 times) than the run of 4, which often takes over 4 s alone: the latter's update moved
  // from 0.15 s to 0.29 s from one planner to the next (scenario 2, where the candidates' own took
  // 0.13-0.24 s). (At 16 tokens a micro-step, the update after 4 micro-steps also took twice what
  // it took after one: near-empty micro-steps read, add to and write back the gradient file within
  // a few hundred ms.)
  EngineRates e;
  // The update: the fastest of every step's (after each run's first), not the fastest step's: its
  // own probe, and every probe keeps its fastest. By the fastest step's, scenario 1's parameter
  // offload partition once measured 119 ms where its candidates' own updates took 63-106 ms (and
  // the sweep before 55 ms): the disk's two speeds, which a step's other parts need not share.
  e.optimizer_s_per_byte = cal.cached(key(1) + " update", [&] {
    measured(1);
    double u = 1e300;
    for (const Run& run : runs_at[1]) u = std::min(u, run.fastest_update);
    return u;
  }) / c.shape.optimizer_io_bytes;
  (void)cal.cached(key(1) + " step", [&] { return measured(1).step; });  // reported beside it
  if (passes) {
    const int micro = kEngineProbeMicroSteps;
    e.first_micro_s = cal.cached(key(micro) + " first", [&] { return measured(micro).first; });
    e.next_micro_s = cal.cached(key(micro) + " next", [&] { return measured(micro).next; });
    e.flush_s = cal.cached(key(micro) + " flush", [&] { return measured(micro).flush; });
    (void)cal.cached(key(micro) + " step", [&] { return measured(micro).step; });
  }
  return e;
}

}  // namespace zt::autoplan
