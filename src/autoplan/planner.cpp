#include "autoplan/planner.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <map>
#include <numeric>
#include <set>
#include <sstream>
#include <tuple>

#include "autoplan/calibrate.h"
#include "autoplan/cost_model.h"
#include "backend/ops_cpu.h"
#include "model/gpt.h"
#include "offload/nvme_dir.h"
#include "plan/plan.h"
#include "runtime/device.h"
#include "runtime/error.h"
#include "runtime/launcher.h"
#include "runtime/memory.h"
#include "runtime/output_path.h"
#include "train/backend_choice.h"
#include "train/inputs.h"
#include "train/trainer.h"
#include "zero/engine_settings.h"
#include "zero/estimate.h"
#include "zero/offload_plan.h"
#include "zero/partition.h"
#if ZT_HAVE_CUDA
#include "runtime/cuda_context.h"
#endif

namespace zt::autoplan {
namespace {

// What a process holds besides the tracked buffers (docs/autoplan.md, "Fitting"): shared libraries,
// runtimes, heap; test/zero/memory_formulas.py holds a run's peak RSS to at most this above its
// tracked total plus the init transient.
constexpr uint64_t kRuntimeOverhead = uint64_t(256) << 20;
constexpr int kEngineProbeMicroSteps = 4;  // the engine run's grad_accum with parameter offload
constexpr int kEngineProbeSteps = 3;  // an engine run's steps: the first untimed, the faster of the other two
constexpr int kEngineProbeRuns = 3;  // an engine run is made up to this many times,
constexpr double kEngineProbeBudget_s = 4;  // another only while those before took less in all

// One point of the space the planner searches (docs/autoplan.md, "Candidates").
struct Choice {
  int stage = 0;
  bool optimizer_offloaded = false, params_offloaded = false;  // to offload_to
  std::string offload_to = "nvme";  // where: "nvme" (CPU backend), "cpu" (CUDA backend: pinned host memory)
  std::string policy = "none";
  int every = 1;
  int micro_batch = 1, grad_accum = 1;
  double bucket_mb = 25;
  bool overlap = true;

  void apply(nlohmann::json& j) const {
    j["zero"]["stage"] = stage;
    j["zero"]["bucket_mb"] = bucket_mb;
    j["zero"]["overlap_comm"] = overlap;
    j["offload"]["optimizer"] = optimizer_offloaded ? offload_to : "none";
    j["offload"]["params"] = params_offloaded ? offload_to : "none";
    j["recompute"]["policy"] = policy;
    j["recompute"]["every"] = every;
    j["batch"]["micro_batch"] = micro_batch;
    j["batch"]["grad_accum"] = grad_accum;
  }
  std::string offload() const {
    const std::string what = params_offloaded ? "opt+params" : optimizer_offloaded ? "opt" : "-";
    return offload_to == "cpu" && optimizer_offloaded ? what + " cpu" : what;
  }
  std::string recompute() const { return policy == "block" && every > 1 ? "block/" + std::to_string(every) : policy; }
  std::string label() const {
    std::ostringstream os;
    os << "stage " << stage << ", B " << micro_batch << " x " << grad_accum << ", recompute " << recompute();
    if (optimizer_offloaded) os << ", offload " << offload();
    return os.str();
  }
  nlohmann::json to_json() const {
    return {{"zero.stage", stage},       {"offload.optimizer", optimizer_offloaded ? offload_to : "none"},
            {"offload.params", params_offloaded ? offload_to : "none"}, {"recompute.policy", policy},
            {"recompute.every", every},  {"batch.micro_batch", micro_batch}, {"batch.grad_accum", grad_accum},
            {"zero.bucket_mb", bucket_mb}, {"zero.overlap_comm", overlap}};
  }
};

struct Candidate {
  Choice choice;
  nlohmann::json resolved;  // the base plan with the choice applied: what --out gets
  uint64_t host = 0, nvme = 0;  // per rank: estimate (host + pinned) + init transient + overhead; swap files
  uint64_t device = 0;  // per rank, CUDA backend: the estimate's device tier (+ NCCL's own buffers)
  bool fits = false;
  int embedding_rows = 0;  // as the engine splits the embedding (stage 3 at N > 1), for the compute probe
  offload::SwapSpec swap;  // offload: the plan's sub-groups, buffer sets, queue depth (for the I/O probes)
  std::vector<size_t> unit_shards;  // parameter offload: this rank's shard of each unit, for the pass probe
  int embedding_units = 1;
  bool regather = false;   // the chunked classifier regathers the embedding in backward
  StepShape shape;
  Rates rates;  // the calibrated rates its prediction used
  // Parameter offload, from the engine run (docs/autoplan.md, "Calibration"): its first and each
  // later micro-step at micro-batch 1, and the model's time for such a micro-step without the
  // transfers (its compute part apart), from which pass_first_s and pass_next_s are backed out;
  // and the gradient flush after the last backward (pass_flush_s).
  double engine_first_micro_s = 0, engine_next_micro_s = 0, engine_flush_s = 0;
  double engine_base_micro_s = 0, engine_base_compute_s = 0, engine_base_tail_s = 0;
  Prediction pred;
  double measured_s = -1;              // the fastest of measured_runs_s
  std::vector<double> measured_runs_s;  // one per --validate round
  std::vector<double> measured_update_runs_s;  // the optimizer update's part of each, beside the prediction's
};

std::string mib(double bytes) {
  std::ostringstream os;
  os << std::fixed << std::setprecision(bytes < (10 << 20) ? 1 : 0) << bytes / double(1 << 20) << " MiB";
  return os.str();
}
std::string ms(double s) {
  std::ostringstream os;
  os << std::fixed << std::setprecision(s < 0.1 ? 1 : 0) << s * 1e3;
  return os.str();
}

// The space (docs/autoplan.md, "Candidates"). At one rank, stages 1-3 shard nothing: they appear
// only where the offload needs them (optimizer: 2; parameters: 3). Offload goes to `offload_to`:
// "nvme" on the CPU backend (where `offload` says the directory takes it), "cpu" on the CUDA
// backend (pinned host memory, the memory ladder's GPU rung; docs/plans.md).
std::vector<Choice> enumerate(const Plan& base, int world, long per_rank_sequences, bool offload,
                              const std::string& offload_to) {
  std::vector<int> batches;
  for (long b = 1; b <= per_rank_sequences; ++b)
    if (per_rank_sequences % b == 0) batches.push_back(int(b));
  std::vector<std::pair<std::string, int>> policies = {{"none", 1}, {"selective", 1}, {"block", 1}};
  if (base.model.n_layer >= 2) policies.push_back({"block", 2});
  struct Placement {
    int stage;
    bool opt, params;
  };
  std::vector<Placement> placements;
  if (world == 1) {
    placements.push_back({0, false, false});
    if (offload) placements.insert(placements.end(), {{2, true, false}, {3, true, true}});
  } else {
    for (int st = 0; st <= 3; ++st) placements.push_back({st, false, false});
    if (offload) placements.insert(placements.end(), {{1, true, false}, {2, true, false}, {3, true, false}, {3, true, true}});
  }
  std::vector<double> buckets = {base.zero.bucket_mb};
  if (world > 1 && base.zero.bucket_mb / 4 >= 0.25) buckets.push_back(base.zero.bucket_mb / 4);
  std::vector<bool> overlaps = world > 1 ? std::vector<bool>{true, false} : std::vector<bool>{base.zero.overlap_comm};

  std::vector<Choice> out;
  for (const Placement& pl : placements)
    for (const auto& [policy, every] : policies)
      for (int b : batches)
        for (double bucket : buckets)
          for (bool ov : overlaps) {
            Choice c;
            c.stage = pl.stage, c.optimizer_offloaded = pl.opt, c.params_offloaded = pl.params, c.offload_to = offload_to;
            c.policy = policy, c.every = every;
            c.micro_batch = b, c.grad_accum = int(per_rank_sequences / b);
            c.bucket_mb = bucket, c.overlap = ov;
            out.push_back(c);
          }
  return out;
}

// The shape of one candidate's step, for the cost model (docs/autoplan.md gives each term).
StepShape step_shape(const Plan& plan, const Estimate& est, int world) {
  const EngineSettings s = engine_settings<CpuOps<float>>(plan, world, 0);
  const ParamLayout layout = s.layout();
  const Partition part(layout, s.zero);
  StepShape sh;
  sh.stage = plan.zero.stage;
  sh.world = world;
  sh.grad_accum = plan.batch.grad_accum;
  sh.layers = plan.model.n_layer;
  sh.recomputed_blocks = plan.recompute.policy == "block" ? (sh.layers + plan.recompute.every - 1) / plan.recompute.every : 0;
  sh.overlap = plan.zero.overlap_comm;
  const double psi = double(part.total()), N = world, A = sh.grad_accum;
  sh.shard_params = sh.stage == 0 ? psi : psi / N;
  sh.comm_bytes = double(est.bytes_per_step);
  const double buckets = double(part.buckets().size()), units = double(layout.units().size());
  sh.padded_params = psi, sh.units = units, sh.buckets = buckets;
  sh.collectives = sh.stage == 0 ? buckets : sh.stage == 1 ? buckets + units : sh.stage == 2 ? A * buckets + units
                                                                                             : A * (buckets + 2 * units);
  sh.all_gather_share = sh.stage == 0 ? 0 : sh.stage == 1 ? 0.5 : sh.stage == 2 ? 1 / (A + 1) : 2.0 / 3;
  // The last unit reduced is the embedding's (at stage 3: one of its block-sized chunks).
  const double last_unit = double(part.unit_padded(0));
  sh.tail_bytes = world == 1 ? 0 : (sh.stage == 0 ? 2 * (N - 1) / N : (N - 1) / N) * 4 * last_unit;
  const double shard_bytes = 4 * psi / N;  // one fp32 state's shard
  if (plan.offload.optimizer == "nvme") sh.optimizer_io_bytes = 2 * shard_bytes + 2 * shard_bytes;  // m, v read and written
  if (plan.offload.params == "nvme") sh.optimizer_io_bytes += 2 * shard_bytes + shard_bytes;  // p, g read; p written
  // The gradient path in memory: each bucket summed into the gradient shard (read the bucket, read
  // and write the shard), per micro-step at stages 2-3, once per step at stage 1.
  const double path = 4 * psi + 2 * 4 * psi / N;
  sh.grad_path_bytes = sh.stage >= 2 ? A * path : sh.stage == 1 ? path : 0;
  return sh;
}

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

// Installs remove_run_dir_and_die for the planner's lifetime, the handlers before restored after.
class RunDirSignals {
 public:
  RunDirSignals() {
    struct sigaction sa = {};
    sa.sa_handler = remove_run_dir_and_die;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART | SA_RESETHAND;
    for (size_t i = 0; i < 3; ++i) ::sigaction(kSignals[i], &sa, &old_[i]);
  }
  ~RunDirSignals() {
    for (size_t i = 0; i < 3; ++i) ::sigaction(kSignals[i], &old_[i], nullptr);
  }
  RunDirSignals(const RunDirSignals&) = delete;
  RunDirSignals& operator=(const RunDirSignals&) = delete;

 private:
  static constexpr int kSignals[3] = {SIGINT, SIGTERM, SIGHUP};
  struct sigaction old_[3];
};

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

// Seconds per step of `plan`, the median of `steps` after the first; and of its optimizer update
// (ZeroEngine::last_update_s), likewise.
struct Measured {
  double step_s, update_s;
};
Measured measure(const nlohmann::json& resolved, int steps, Comm& comm, const std::string& parent) {
  const TrainResult r = run_steps(resolved, steps, comm, parent);
  return {median_after_first(r.step_ms) / 1e3, median_after_first(r.update_ms) / 1e3};
}

// Offload measured as the engine runs it: the candidate trained in this process for a few steps
// at micro-batch 1 and its own sequence length (its shards and swap files are the candidate's),
// so that its transfers have compute between them as in training: runs of 16-token micro-steps,
// their I/O back to back, measured the update 25-40% slower than the candidates ran it
// (scenario 2, 2026-11-27).
// - The optimizer step: seconds per byte it moves (Rates' pipeline_s_per_byte), from the time of
//   the update itself (ZeroEngine::last_update_s: the sub-group pipeline with the AdamW) over the
//   candidate's optimizer_io_bytes. Without parameter offload the run is at stage 3 where N > 1:
//   the same shard, and the stage's other costs are the links' to predict.
// - With parameter offload, its micro-steps, from a run of kEngineProbeMicroSteps: the
//   first is the time to the end of its backward; each later one, a third of the time from there
//   to the end of the last one's; the flush, from there to the gradients' being final (the
//   gradient writes still in flight, once a step). plan() backs the transfers out of them. From one
//   run: the difference of two runs carried both runs' noise, and runs here differ by up to 60%
//   (the disk's speed drifts over seconds) where the steps within one differ by a few percent.
// A run is made up to kEngineProbeRuns times while the runs so far took under kEngineProbeBudget_s,
// and the one of least step time kept. Cached like a probe, by the partition's shape.
struct EngineRates {
  double optimizer_s_per_byte = 0;
  double first_micro_s = 0, next_micro_s = 0, flush_s = 0;  // with parameter offload
};
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

// The chosen plan and its report: both written, or neither replaced (runtime/output_path.h); the
// plan renamed last, so a plan on disk never goes without its report.
void write_plan_and_report(const std::string& out, const nlohmann::json& plan, const std::string& report,
                           const nlohmann::json& rep) {
  write_by_rename({{"--out (its report)", report, nullptr, rep.dump(1) + "\n"}, {"--out", out, nullptr, plan.dump(2) + "\n"}});
}

// ---- On the CUDA backend: memory only (docs/autoplan.md, "On the CUDA backend") ----------------
// No rates are measured for the GPU (this machine has none to measure; the device README's runs are
// benchmarks, not a calibration), so nothing is predicted there: the planner sizes every candidate
// against the GPU it runs on and takes the first that fits in the memory ladder's order.

// Kept free on the device beyond the estimate: what it does not count (NCCL's communicators beside
// the approximation added per candidate, cuBLASLt's heuristics, the allocator's rounding). On an H100
// the runs used 5.6-15.7 MiB more than their estimates (scripts/device/RESULTS.md).
constexpr uint64_t kDeviceReserve = uint64_t(64) << 20;

// What one rank's device offers the run: the free memory of the GPU it will take (local rank r
// takes GPU r % gpus, as train does) once every local rank's CUDA context and cuBLASLt workspace
// exist (as the trainer counts it: free at start), shared evenly among the ranks on that GPU, less
// kDeviceReserve; the least over all ranks (they must agree on what fits). Collective.
uint64_t device_bytes_per_rank(Comm& comm) {
  uint64_t mine = 0;
#if ZT_HAVE_CUDA
  ZT_REQUIRE(device::available(), "plan: device \"cuda\" but no CUDA device is visible: the planner sizes a CUDA plan "
                                  "against the GPU it will run on; run it there, or size a plan here with ./train "
                                  "estimate --set device=cuda");
  const int gpus = device::count(), gpu = comm.local_rank() % gpus;
  cuda::Context::select(gpu);
  (void)cuda::Context::get();
  comm.barrier();  // every context exists before anyone counts
  int sharing = 0;
  for (int r = 0; r < comm.local_world(); ++r) sharing += r % gpus == gpu;
  const uint64_t share = uint64_t(device::free_bytes()) / uint64_t(sharing);
  mine = share > kDeviceReserve ? share - kDeviceReserve : 0;
#else
  throw Error("plan: device \"cuda\" but this build has no CUDA backend");
#endif
  for (uint64_t x : comm.all_gather_u64(mine)) mine = std::min(mine, x);
  return mine;
}

// The memory ladder's order (docs/plans.md: a smaller micro-batch first, then selective, then
// block recomputation, then a higher stage, then offload): a candidate is taken only where every
// one before it does not fit, as a run climbing the ladder would.
auto ladder_key(const Choice& c) {
  const int offload = c.params_offloaded ? 2 : c.optimizer_offloaded ? 1 : 0;
  const int recompute = c.policy == "none" ? 0 : c.policy == "selective" ? 1 : c.every > 1 ? 2 : 3;
  return std::make_tuple(offload, c.stage, recompute, -c.micro_batch, !c.overlap, -c.bucket_mb);
}

void print_memory_table(const std::vector<const Candidate*>& rows, int world) {
  std::printf("  #  stage  offload        recompute  B x GA   bucket  overlap |  device/rank    host/rank   nvme/rank\n");
  int i = 0;
  for (const Candidate* c : rows) {
    const Choice& ch = c->choice;
    char bucket[32] = "-";
    if (world > 1) std::snprintf(bucket, sizeof bucket, "%.2f", ch.bucket_mb);
    std::printf("%3d  %5d  %-13s  %-9s  %2d x %-3d %6s  %-7s | %12s %12s %11s\n", ++i, ch.stage, ch.offload().c_str(),
                ch.recompute().c_str(), ch.micro_batch, ch.grad_accum, bucket, world > 1 ? (ch.overlap ? "on" : "off") : "-",
                mib(double(c->device)).c_str(), mib(double(c->host)).c_str(), mib(double(c->nvme)).c_str());
  }
}

void print_table(const std::vector<const Candidate*>& rows, int world, bool measured) {
  std::printf("  #  stage  offload     recompute  B x GA   bucket  overlap |  host/rank  nvme/rank | compute   comm exposed  "
              "I/O  optim |  ms/step   tok/s  bound%s\n",
              measured ? " |  measured  error" : "");
  int i = 0;
  for (const Candidate* c : rows) {
    const Choice& ch = c->choice;
    const Prediction& p = c->pred;
    const double tokens = double(ch.micro_batch) * ch.grad_accum * world * c->resolved["model"]["seq_len"].get<double>();
    char bucket[32] = "-";
    if (world > 1) std::snprintf(bucket, sizeof bucket, "%.2f", ch.bucket_mb);
    std::printf("%3d  %5d  %-10s  %-9s  %2d x %-3d %6s  %-7s | %10s %10s | %7s %6s %7s %4s %6s | %8s %7.0f  %-9s", ++i,
                ch.stage, ch.offload().c_str(), ch.recompute().c_str(), ch.micro_batch, ch.grad_accum,
                bucket, world > 1 ? (ch.overlap ? "on" : "off") : "-", mib(double(c->host)).c_str(),
                mib(double(c->nvme)).c_str(), ms(p.compute_s).c_str(), ms(p.comm_s).c_str(), ms(p.exposed_comm_s).c_str(),
                ms(p.pass_io_s).c_str(), ms(p.optimizer_s).c_str(), ms(p.step_s).c_str(),
                tokens / p.step_s, p.bound.c_str());
    if (measured && c->measured_s > 0)
      std::printf(" | %8s %+5.0f%%", ms(c->measured_s).c_str(), (p.step_s / c->measured_s - 1) * 100);
    std::printf("\n");
  }
}

// Why the winner won, against the runner-up: the part of the step that differs most.
std::string why(const Candidate& best, const Candidate* next) {
  std::ostringstream os;
  const Prediction& p = best.pred;
  os << "chosen: " << best.choice.label() << ": " << ms(p.step_s) << " ms/step predicted (compute " << ms(p.compute_s)
     << ", communication waited for " << ms(p.exposed_comm_s) << ", I/O " << ms(p.pass_io_s)
     << ", optimizer step " << ms(p.optimizer_s) << "; " << p.bound << "-bound)";
  if (next) {
    const Prediction& q = next->pred;
    const std::pair<const char*, double> diffs[] = {
        {"compute", q.compute_s - p.compute_s},
        {"communication waited for", q.exposed_comm_s - p.exposed_comm_s},
        {"I/O", q.pass_io_s - p.pass_io_s},
        {"optimizer", q.optimizer_s - p.optimizer_s}};
    const auto* most = &diffs[0];
    for (const auto& d : diffs)
      if (std::fabs(d.second) > std::fabs(most->second)) most = &d;
    os << "\nnext: " << next->choice.label() << ": " << ms(q.step_s) << " ms (" << std::showpos << std::fixed
       << std::setprecision(1) << (q.step_s / p.step_s - 1) * 100 << "%" << std::noshowpos << ")";
    if (q.step_s < p.step_s * 1.005)
      os << ", within 0.5%: a tie as far as the model can tell";
    else
      os << ", mostly " << most->first << " (" << std::showpos << ms(most->second) << std::noshowpos << " ms)";
    if (next->host < best.host) os << ", for " << mib(double(best.host - next->host)) << " less host memory per rank";
  }
  return os.str();
}

}  // namespace

std::string report_path(const std::string& out) {
  const std::string ext = ".json";
  if (out.size() > ext.size() && out.compare(out.size() - ext.size(), ext.size(), ext) == 0)
    return out.substr(0, out.size() - ext.size()) + ".report.json";
  return out + ".report.json";
}

int plan_command(const PlanRequest& req, Comm& comm) {
  const int world = req.world;
  const bool root = comm.rank() == 0;
  ZT_REQUIRE(comm.world() == world, "plan: --world " << world << " but " << comm.world() << " rank(s) were launched: the "
                                    << "planner measures the link and the cores as the ranks will share them, so run it "
                                    << "with the ranks it plans for" << (world > 1 ? ": mpirun -np " + std::to_string(world) + " ./train plan ..." : ""));
  ZT_REQUIRE(req.show >= 1 && req.show <= 100000, "plan: --show must be 1-100000 rows, got " << req.show);
  ZT_REQUIRE(req.validate_steps >= 2 && req.validate_steps <= 1000,
             "plan: --validate-steps must be 2-1000 (the first step is not timed), got " << req.validate_steps);
  ZT_REQUIRE(req.validate_rounds >= 1 && req.validate_rounds <= 10,
             "plan: --validate-rounds must be 1-10, got " << req.validate_rounds);
  ZT_REQUIRE(!req.out.empty(), "plan: --out FILE is required: where the chosen plan is written");

  Plan base = load_plan(req.base, req.overrides, /*check_files=*/false);
  if (!req.comm.is_null()) {  // the settings the ranks run (ZT_COMM_* applied): every candidate gets them
    nlohmann::json j = base.resolved;
    j["comm"] = req.comm;
    Plan with_comm = plan_from_json(j, false);
    with_comm.source = base.source;
    with_comm.files = base.files;  // the extends chain: inputs no output may replace
    base = std::move(with_comm);
  }
  const std::string backend = planned_backend(base, world);
  // The cost model is calibrated on the CPU backend only; on the CUDA backend the planner sizes
  // memory and predicts nothing (docs/autoplan.md, "On the CUDA backend").
  const bool on_device = backend != "cpu-fp32";
  ZT_REQUIRE(!on_device || req.validate == 0,
             "plan: --validate compares predicted with measured step times, and on the CUDA backend nothing is "
             "predicted (no rates are measured for it): train the chosen plan itself");

  // --validate trains: its data must be there before anything is measured.
  if (req.validate != 0) (void)plan_from_json(base.resolved, /*check_files=*/true);

  // Every output is checked before anything is measured (runtime/output_path.h).
  const std::string cache = req.calibration.empty() ? default_cache_path() : req.calibration;
  // The cache is read and rewritten: an output, so that neither it nor --out can be an input or each other.
  OutputPaths paths;
  register_plan_inputs(paths, base);
  paths.output("--calibration", cache);
  const std::string out = paths.output("--out", req.out);
  const std::string report = paths.output("--out (its report)", report_path(req.out));
  // --out's directory, made now (the check found where it can be), not after a minute of probes.
  {
    std::error_code ec;
    const std::filesystem::path dir = std::filesystem::path(out).parent_path();
    if (!dir.empty()) std::filesystem::create_directories(dir, ec);
    ZT_REQUIRE(!ec, "plan: --out " << req.out << ": cannot create its directory " << dir.string() << ": " << ec.message());
  }

  // A base made for a world of its own (batch.world: a plan this command wrote) keeps that world's batch.
  const long global = req.global_batch > 0 ? req.global_batch
                                           : long(base.batch.micro_batch) * base.batch.grad_accum *
                                                 (base.batch.world > 0 ? base.batch.world : world);
  ZT_REQUIRE(global % world == 0, "plan: the global batch of " << global << " sequences does not divide among " << world
                                                               << " ranks: give --global-batch a multiple of " << world);
  const long per_rank = global / world;
  ZT_REQUIRE(per_rank <= 4096, "plan: " << per_rank << " sequences per rank per step is past what the planner searches (4096)");

  // What this host offers (docs/autoplan.md, "Fitting").
  // The least any rank has (ranks on other hosts, or a ZT_MEM_AVAILABLE_BYTES set for one rank):
  // every rank must find the same candidates fit, or their probes would differ and wait on each other.
  HostMemory avail = host_memory_available();
  for (uint64_t x : comm.all_gather_u64(avail.bytes))
    if (x && (avail.bytes == 0 || x < avail.bytes)) avail.bytes = x;
  const int local = comm.local_world();
  bool nvme = true, direct = true;
  uint64_t nvme_free = 0;
  std::string nvme_why;
  if (!on_device) offload::check_nvme_free_override();
  if (!on_device) try {
      const offload::NvmeDir d = offload::check_nvme_dir(base.offload.nvme_dir, 0, "");
      nvme_free = d.free_bytes;
      direct = d.direct;
    } catch (const Error& e) {
      nvme = false;
      nvme_why = e.what();
    }
  {
    const std::vector<uint64_t> ok = comm.all_gather_u64(nvme ? 1 : 0), free = comm.all_gather_u64(nvme_free),
                                dio = comm.all_gather_u64(direct ? 1 : 0);
    for (size_t r = 0; r < ok.size(); ++r) {
      if (nvme && !ok[r]) nvme = false, nvme_why = "not on rank " + std::to_string(r);
      nvme_free = std::min(nvme_free, free[r]);
      direct = direct && dio[r];
    }
  }
  const uint64_t device_avail = on_device ? device_bytes_per_rank(comm) : 0;

  // The least any candidate can hold, by arithmetic before sizing each one (at 65536 layers sizing
  // the candidates took minutes, then found none fit): every candidate keeps the fp32 weights,
  // gradients and two AdamW moments somewhere, at best sharded over the ranks (stage 3), in host
  // memory or the swap files.
  if (!on_device && avail.bytes > 0) {
    const double C = base.model.n_embd, psi = double(base.model.n_layer) * 12 * C * C +
                                              double(GPTConfig::pad_vocab(base.model.vocab_size)) * C;
    const double least = 16 * psi / world * local, room = double(avail.bytes) + (nvme ? double(nvme_free) : 0);
    if (least > room)
      throw Error("plan: no candidate fits: " + std::to_string(base.model.n_layer) + " layers of " +
                  std::to_string(base.model.n_embd) + " channels hold at least " + mib(psi * 4) +
                  " of fp32 weights, and their gradients and two AdamW moments as much each: at least " +
                  mib(least) + " on this host at best sharded over " + std::to_string(world) + " rank(s) (" +
                  std::to_string(local) + " here); available: " + mib(double(avail.bytes)) + " host (" + avail.source +
                  ")" + (nvme ? " and " + mib(double(nvme_free)) + " in " + base.offload.nvme_dir : ", no offload (" + nvme_why + ")"));
  }

  // A key the planner searches, given with --set, fixes it: only the candidates that keep it. (The
  // batch keys and zero.bucket_mb are not among them: with --set they give the global batch and
  // the bucket size the search starts from, docs/autoplan.md.)
  std::vector<std::string> fixed;
  for (const std::string& o : req.overrides) {
    const std::string key = o.substr(0, o.find('='));
    for (const char* k : {"zero.stage", "zero.overlap_comm", "offload.optimizer", "offload.params", "recompute.policy",
                          "recompute.every"})
      if (key == k && std::find(fixed.begin(), fixed.end(), key) == fixed.end()) fixed.push_back(key);
  }
  std::vector<Choice> choices;
  for (const Choice& ch : enumerate(base, world, per_rank, nvme, on_device ? "cpu" : "nvme")) {
    const nlohmann::json cj = ch.to_json();
    bool keeps = true;
    for (const std::string& k : fixed) {
      const size_t dot = k.find('.');
      keeps = keeps && cj[k] == base.resolved[k.substr(0, dot)][k.substr(dot + 1)];
    }
    if (keeps) choices.push_back(ch);
  }
  if (!fixed.empty()) {
    std::string what;
    for (const std::string& k : fixed) {
      const size_t dot = k.find('.');
      what += (what.empty() ? "" : ", ") + k + "=" + base.resolved[k.substr(0, dot)][k.substr(dot + 1)].dump();
    }
    ZT_REQUIRE(!choices.empty(), "plan: --set " << what << ": no candidate the planner searches at " << world
                                  << " rank(s) has that (docs/autoplan.md, \"Candidates\""
                                  << (nvme ? "" : "; no offload here: " + nvme_why)
                                  << "): drop the --set to let it choose, or train that plan as it is");
    if (root) std::printf("plan: --set fixes %s: only candidates with that\n", what.c_str());
  }
  std::vector<Candidate> all;
  for (const Choice& ch : choices) {
    Candidate c;
    c.choice = ch;
    c.resolved = base.resolved;
    ch.apply(c.resolved);
    c.resolved["batch"]["world"] = world;  // its batch is for this world: training at another is refused
    Plan p = plan_from_json(c.resolved, false);
    p.source = base.source;
    record_backend(p, backend);
    record_comm_backend(p, planned_comm_backend(p, backend, world));
    const Estimate est = estimate_plan(p, world);
    const uint64_t transient = uint64_t(GPTConfig::pad_vocab(p.model.vocab_size)) * uint64_t(p.model.n_embd) * 4;
    c.host = est.tier_total(Tier::host) + est.tier_total(Tier::pinned) + transient + kRuntimeOverhead;
    c.nvme = est.tier_total(Tier::nvme);
    c.fits = (avail.bytes == 0 || c.host * uint64_t(local) <= avail.bytes) && (c.nvme == 0 || c.nvme * uint64_t(local) <= nvme_free);
    if (on_device) {
      c.device = est.tier_total(Tier::device) + (est.comm.backend == "nccl" ? est.comm.nccl_internal : 0);
      c.fits = c.fits && c.device <= device_avail;
    }
    c.shape = step_shape(p, est, world);
    const EngineSettings es = engine_settings<CpuOps<float>>(p, world, 0);
    c.embedding_rows = es.embedding_rows;
    c.swap = swap_spec_of(p.offload, comm.rank(), direct);
    if (ch.params_offloaded) {
      const ParamLayout layout = es.layout();
      const Partition part(layout, es.zero);
      for (int u = 0; u < layout.num_units(); ++u) c.unit_shards.push_back(part.unit_shard_numel(u));
      c.embedding_units = layout.embedding_units();
      c.regather = es.zero.classifier_regather;
    }
    all.push_back(std::move(c));
  }
  // Overlap off sends the same bytes and waits for all of them: a candidate only where its twin
  // with overlap on (two staging slots and a prefetched unit more) does not fit.
  std::set<std::string> fits_with_overlap;
  for (const Candidate& c : all)
    if (c.fits && c.choice.overlap) fits_with_overlap.insert(c.choice.to_json().dump());
  std::vector<Candidate*> fit;
  for (Candidate& c : all) {
    Choice twin = c.choice;
    twin.overlap = true;
    if (c.fits && (c.choice.overlap || !fits_with_overlap.count(twin.to_json().dump()))) fit.push_back(&c);
  }
  if (root)
    std::printf("plan: %s at %d rank(s), %ld sequences per step (%ld per rank): %zu candidates, %zu fit in %s per host (%s)%s%s\n",
                req.base.c_str(), world, global, per_rank, all.size(), fit.size(),
                avail.bytes ? mib(double(avail.bytes)).c_str() : "unknown memory", avail.source.c_str(),
                on_device ? (" and " + mib(double(device_avail)) + " per rank on the GPU (" + backend + ")").c_str() : "",
                nvme ? "" : (" (no offload candidates: " + nvme_why + ")").c_str());
  if (fit.empty() && on_device) {
    const auto least = std::min_element(all.begin(), all.end(), [](auto& a, auto& b) { return a.device < b.device; });
    throw Error("plan: no candidate fits: the smallest needs " + mib(double(least->device)) + " of GPU memory per rank (" +
                least->choice.label() + ") and " + mib(double(least->host)) + " host memory per rank x " +
                std::to_string(local) + " rank(s) on this host; available: " + mib(double(device_avail)) +
                " per rank on the GPU (free, less " + mib(double(kDeviceReserve)) + " kept), " +
                (avail.bytes ? mib(double(avail.bytes)) : "unknown") + " host (" + avail.source + ")");
  }
  if (on_device) {
    std::stable_sort(fit.begin(), fit.end(), [](const Candidate* a, const Candidate* b) {
      return ladder_key(a->choice) < ladder_key(b->choice);
    });
    const Candidate& best = *fit[0];
    if (root) {
      std::printf("\n");
      std::vector<const Candidate*> rows(fit.begin(), fit.begin() + std::min<size_t>(fit.size(), size_t(req.show)));
      print_memory_table(rows, world);
      if (fit.size() > rows.size()) std::printf("  ... %zu more that fit (all in %s)\n", fit.size() - rows.size(), report.c_str());
      std::printf("\nchosen: %s: the first rung of the memory ladder that fits (docs/plans.md); on the CUDA backend the "
                  "planner sizes memory only and predicts no step time (no rates are measured for it)\n",
                  best.choice.label().c_str());
      nlohmann::json cands = nlohmann::json::array();
      for (const Candidate* c : fit)
        cands.push_back({{"choice", c->choice.to_json()}, {"device_bytes_per_rank", c->device},
                         {"host_bytes_per_rank", c->host}, {"nvme_bytes_per_rank", c->nvme}});
      const nlohmann::json rep = {{"base", req.base},
                                  {"world", world},
                                  {"global_batch", global},
                                  {"backend", backend},
                                  {"chosen_by", "memory ladder"},
                                  {"available_device_bytes_per_rank", device_avail},
                                  {"device_reserve_bytes", kDeviceReserve},
                                  {"available_host_bytes", avail.bytes},
                                  {"ranks_per_host", local},
                                  {"runtime_overhead_bytes", kRuntimeOverhead},
                                  {"candidates", cands}};
      write_plan_and_report(out, best.resolved, report, rep);
      std::printf("wrote %s (run it: %s./train %s) and %s\n", out.c_str(),
                  world > 1 ? ("mpirun -np " + std::to_string(world) + " ").c_str() : "", out.c_str(), report.c_str());
    }
    comm.barrier();  // the files exist when any rank returns
    return 0;
  }
  if (fit.empty()) {
    const auto least_host = std::min_element(all.begin(), all.end(), [](auto& a, auto& b) { return a.host < b.host; });
    std::ostringstream os;
    os << "plan: no candidate fits: the smallest needs " << mib(double(least_host->host)) << " host memory per rank x "
       << local << " rank(s) on this host (" << least_host->choice.label() << ")";
    if (least_host->nvme) os << " and " << mib(double(least_host->nvme)) << " in offload.nvme_dir per rank";
    os << "; available: " << (avail.bytes ? mib(double(avail.bytes)) : "unknown") << " host (" << avail.source << ")";
    if (nvme) os << ", " << mib(double(nvme_free)) << " in " << base.offload.nvme_dir;
    else os << ", no offload (" << nvme_why << ")";
    throw Error(os.str());
  }

  // The probe and --validate runs' directories go beside --out (run_steps), and go on every exit.
  const std::string out_dir = std::filesystem::path(out).parent_path().string();
  const RunDirSignals run_dir_signals;

  // Calibrate what the candidates that fit need, every rank at once.
  const int threads = base.run.threads > 0 ? base.run.threads : threads_per_rank(this_launch(), affinity_cpus(), local);
  std::vector<std::string> notes;
  std::ostringstream comm_key;  // what the link, overlap and engine probes ran on
  comm_key << "comm " << base.comm.collectives << " thread" << int(base.comm.thread) << " inflight" << base.comm.inflight
           << " poll_us" << base.comm.poll_us;
  Calibration cal(comm, cache, threads, req.version, world > 1 ? comm_key.str() : "", notes);
  // What was measured before a failure (a probe run refused, a signal's exception) is kept.
  struct SaveOnThrow {
    Calibration& cal;
    const int pending = std::uncaught_exceptions();
    ~SaveOnThrow() {
      if (std::uncaught_exceptions() > pending) try {
          cal.save();
        } catch (...) {  // the failure itself is the message
        }
    }
  } save_on_throw{cal};
  if (root)
    for (const std::string& n : notes) std::fprintf(n.rfind("warning:", 0) == 0 ? stderr : stdout, "%s\n", n.c_str());
  const GPTConfig cfg = GPTConfig::make(base.model.n_layer, base.model.n_head, base.model.n_embd, base.model.seq_len,
                                        base.model.vocab_size);
  const int T = base.model.seq_len, chunk = base.recompute.classifier_chunk;
  using MicroKey = std::tuple<int, std::string, int>;  // micro-batch, policy, embedding rows
  std::map<MicroKey, MicroStepCost> micro;
  auto policy_of = [](const std::string& name) {
    return name == "block" ? Recompute::Policy::block : name == "selective" ? Recompute::Policy::selective : Recompute::Policy::none;
  };
  std::set<MicroKey> needed;
  for (Candidate* c : fit) {
    needed.insert({c->choice.micro_batch, "none", c->embedding_rows});
    needed.insert({c->choice.micro_batch, c->choice.policy, c->embedding_rows});
    if (c->choice.params_offloaded) needed.insert({1, "none", c->embedding_rows});  // the engine run's micro-steps
  }
  if (root) std::printf("calibrating (%d thread(s) per rank; cache %s)...\n", threads, cache.c_str());
  const auto t_cal = std::chrono::steady_clock::now();
  std::fflush(stdout);
  std::map<std::pair<std::string, int>, std::set<int>> batches;  // (policy, embedding rows) -> micro-batches
  for (const auto& [b, pol, rows] : needed) batches[{pol, rows}].insert(b);
  for (const auto& [what, bs] : batches)
    for (const auto& [b, cost] : cal.micro_steps(cfg, bs, T, policy_of(what.first), chunk, what.second))
      micro[{b, what.first, what.second}] = cost;
  const double adamw = cal.adamw_s_per_param();
  std::map<std::pair<std::string, double>, LinkCost> links;
  std::map<double, double> overlap;  // bucket_mb -> exposed share
  bool any_nvme = false;
  for (Candidate* c : fit) {
    any_nvme |= c->choice.optimizer_offloaded;
    if (world == 1) continue;
    const size_t bytes = size_t(c->choice.bucket_mb * double(1 << 20));
    for (const char* op : {"all_reduce", "reduce_scatter", "all_gather"})
      if (!links.count({op, c->choice.bucket_mb})) links[{op, c->choice.bucket_mb}] = cal.link(op, bytes);
    if (!overlap.count(c->choice.bucket_mb)) overlap[c->choice.bucket_mb] = cal.overlap_exposed_share(cfg, T, bytes);
  }
  // Offload, measured as it runs (docs/autoplan.md, "Calibration"): the optimizer step and
  // parameter offload's passes from short runs of the engine itself where the data is there to
  // train on, else from the optimizer pipeline and pass probes; the passes' overlap with compute
  // from the pass probe. The engine runs come first: on this machine a run measured right after
  // the disk probe moved the optimizer's bytes at half the rate it did otherwise (and the rate
  // training reaches), which waiting 5 s did not change. The disk alone, last, is only reported.
  bool have_data = true;
  try {
    (void)plan_from_json(base.resolved, /*check_files=*/true);
  } catch (const Error&) {
    have_data = false;
  }
  for (Candidate* c : fit) {
    if (!c->choice.optimizer_offloaded) continue;
    if (have_data) {
      const EngineRates e = engine_rates(*c, cal, comm, out_dir);
      c->rates.pipeline_s_per_byte = e.optimizer_s_per_byte;
      c->engine_first_micro_s = e.first_micro_s, c->engine_next_micro_s = e.next_micro_s, c->engine_flush_s = e.flush_s;
    } else {
      c->rates.pipeline_s_per_byte = cal.optimizer_pipeline_s_per_byte(c->swap, size_t(c->shape.shard_params));
    }
  }
  for (Candidate* c : fit) {
    if (!c->choice.params_offloaded) continue;
    const PassCost pass = cal.pass_io(c->swap, c->unit_shards, c->embedding_units, c->regather, /*transfers=*/!have_data);
    if (!have_data) c->rates.pass_first_s = pass.first_s, c->rates.pass_next_s = pass.next_s;
    c->rates.pass_exposed = pass.exposed;
  }
  if (root && !have_data && any_nvme)
    std::printf("calibration: no training data (%s), so offload's rates are the optimizer pipeline and pass probes', "
                "which predict them slower than the engine runs them\n", base.data.train.c_str());
  const double disk = any_nvme ? cal.disk_bytes_per_s(base.offload.nvme_dir, direct) : 0;
  cal.save();
  if (any_nvme) settle_disk(base.offload.nvme_dir);  // the probes' files: flushed and trimmed before anything else runs
  if (root)
    std::printf("calibration: %d probe(s) measured in %.1f s, the rest from the cache\n", cal.measured(),
                std::chrono::duration<double>(std::chrono::steady_clock::now() - t_cal).count());
  // What the offloaded optimizer step reaches against the disk alone (docs/offload.md: offload at
  // the disk's speed).
  for (const Candidate* c : fit)
    if (root && c->rates.pipeline_s_per_byte > 0) {
      const double pipe = 1 / c->rates.pipeline_s_per_byte;
      std::printf("offload: the optimizer step moves %.2f GB/s (reads and writes together), the disk "
                  "alone %.2f GB/s mixed: %.0f%%\n", pipe / 1e9, disk / 1e9, 100 * pipe / disk);
      break;
    }

  for (Candidate* c : fit) {
    Rates r = c->rates;
    const MicroStepCost& none = micro[{c->choice.micro_batch, "none", c->embedding_rows}];
    const MicroStepCost& own = micro[{c->choice.micro_batch, c->choice.policy, c->embedding_rows}];
    r.block_s = c->choice.policy == "selective" ? own.block_s : none.block_s;
    r.block_recomputed_s = own.block_s;
    r.fixed_s = own.fixed_s;
    r.adamw_s_per_param = adamw;
    if (world > 1) {
      const LinkCost red = links[{c->shape.stage == 0 ? "all_reduce" : "reduce_scatter", c->choice.bucket_mb}];
      const LinkCost gat = links[{"all_gather", c->choice.bucket_mb}];
      r.reduce_alpha_s = red.alpha_s, r.reduce_bytes_per_s = red.bytes_per_s;
      r.gather_alpha_s = gat.alpha_s, r.gather_bytes_per_s = gat.bytes_per_s;
      r.overlap_exposed = overlap[c->choice.bucket_mb];
    }
    r.memory_bytes_per_s = 28 / adamw;  // AdamW reads p, g, m, v and writes p, m, v: 28 bytes a parameter
    if (c->engine_first_micro_s > 0) {
      // The passes from the engine run's micro-steps: what each took beyond the model's time for
      // the same micro-step without parameter offload (micro-batch 1, no recomputation, one
      // micro-step's collectives) is the transfers' exposed part beside that compute; the
      // transfers themselves follow by the cost model's own overlap formula, and are then exposed
      // beside each candidate's compute as pass_io_s says (docs/autoplan.md, "Calibration").
      const MicroStepCost& one = micro[{1, "none", c->embedding_rows}];
      Rates r1 = r;
      r1.block_s = r1.block_recomputed_s = one.block_s, r1.fixed_s = one.fixed_s;
      r1.pass_first_s = r1.pass_next_s = r1.pass_flush_s = 0;
      StepShape s1 = c->shape;
      const double A = s1.grad_accum;
      s1.grad_accum = 1, s1.recomputed_blocks = 0;
      s1.comm_bytes /= A, s1.grad_path_bytes /= A;  // parameter offload is at stage 3: all of them per micro-step
      s1.collectives = s1.buckets + 2 * s1.units, s1.optimizer_io_bytes = 0;
      const Prediction p1 = predict(s1, r1);
      c->engine_base_compute_s = p1.compute_s, c->engine_base_tail_s = p1.tail_s;
      c->engine_base_micro_s = p1.compute_s + p1.exposed_comm_s;
      r.pass_first_s = transfers_behind(c->engine_first_micro_s - c->engine_base_micro_s, p1.compute_s, r.pass_exposed);
      r.pass_next_s = transfers_behind(c->engine_next_micro_s - c->engine_base_micro_s, p1.compute_s, r.pass_exposed);
      // The flush: all exposed (backward has ended), less the last collective the model counts apart.
      r.pass_flush_s = std::max(0.0, c->engine_flush_s - p1.tail_s);
    }
    c->rates = r;
    c->pred = predict(c->shape, r);
    // The cache's values are checked on load; this is the backstop for one that passed and still
    // predicts nonsense (a rate far off its kind's range).
    ZT_REQUIRE(std::isfinite(c->pred.step_s) && c->pred.step_s > 0,
               "plan: " << c->choice.label() << " is predicted at " << c->pred.step_s << " s a step from the rates in "
                        << cache << " (report: the rates): remove that file to measure again");
  }
  std::stable_sort(fit.begin(), fit.end(), [](const Candidate* a, const Candidate* b) {
    return a->pred.step_s != b->pred.step_s ? a->pred.step_s < b->pred.step_s : a->host < b->host;
  });

  const Candidate& best = *fit[0];
  if (root) {
    std::printf("\n");
    std::vector<const Candidate*> rows(fit.begin(), fit.begin() + std::min<size_t>(fit.size(), size_t(std::max(1, req.show))));
    print_table(rows, world, false);
    if (fit.size() > rows.size()) std::printf("  ... %zu more that fit (all in %s)\n", fit.size() - rows.size(), report.c_str());
    std::printf("\n%s\n", why(best, fit.size() > 1 ? fit[1] : nullptr).c_str());
  }

  auto write_outputs = [&] {
    if (!root) return;
    nlohmann::json cands = nlohmann::json::array();
    for (const Candidate* c : fit) {
      const StepShape& s = c->shape;
      nlohmann::json j = {{"choice", c->choice.to_json()},
                          {"host_bytes_per_rank", c->host},
                          {"nvme_bytes_per_rank", c->nvme},
                          {"shape",
                           {{"stage", s.stage}, {"world", s.world}, {"grad_accum", s.grad_accum}, {"layers", s.layers},
                            {"recomputed_blocks", s.recomputed_blocks}, {"overlap", s.overlap},
                            {"padded_params", s.padded_params}, {"units", s.units}, {"buckets", s.buckets},
                            {"shard_params", s.shard_params}, {"comm_bytes", s.comm_bytes}, {"collectives", s.collectives},
                            {"tail_bytes", s.tail_bytes}, {"all_gather_share", s.all_gather_share},
                            {"optimizer_io_bytes", s.optimizer_io_bytes},
                            {"grad_path_bytes", s.grad_path_bytes}}},
                          {"embedding_rows", c->embedding_rows},
                          {"rates",
                           {{"block_s", c->rates.block_s}, {"block_recomputed_s", c->rates.block_recomputed_s},
                            {"fixed_s", c->rates.fixed_s}, {"adamw_s_per_param", c->rates.adamw_s_per_param},
                            {"reduce_alpha_s", c->rates.reduce_alpha_s}, {"reduce_bytes_per_s", c->rates.reduce_bytes_per_s},
                            {"gather_alpha_s", c->rates.gather_alpha_s}, {"gather_bytes_per_s", c->rates.gather_bytes_per_s},
                            {"overlap_exposed", c->rates.overlap_exposed},
                            {"pipeline_s_per_byte", c->rates.pipeline_s_per_byte},
                            {"pass_first_s", c->rates.pass_first_s}, {"pass_next_s", c->rates.pass_next_s},
                            {"pass_flush_s", c->rates.pass_flush_s},
                            {"pass_exposed", c->rates.pass_exposed},
                            {"memory_bytes_per_s", c->rates.memory_bytes_per_s}}},
                          {"predicted", c->pred.to_json()}};
      if (c->measured_s > 0) {
        j["measured_step_s"] = c->measured_s;
        j["measured_runs_s"] = c->measured_runs_s;
        j["measured_update_runs_s"] = c->measured_update_runs_s;
      }
      if (c->engine_first_micro_s > 0)  // what pass_first_s, pass_next_s and pass_flush_s came from
        j["engine_passes"] = {{"first_micro_s", c->engine_first_micro_s}, {"next_micro_s", c->engine_next_micro_s},
                              {"flush_s", c->engine_flush_s}, {"tail_s", c->engine_base_tail_s},
                              {"base_micro_s", c->engine_base_micro_s}, {"base_compute_s", c->engine_base_compute_s}};
      cands.push_back(j);
    }
    nlohmann::json links_json = nlohmann::json::object();
    for (const auto& [k, l] : links)
      links_json[k.first + " bucket_mb " + std::to_string(k.second)] = {{"alpha_s", l.alpha_s}, {"bytes_per_s", l.bytes_per_s}};
    nlohmann::json micro_json = nlohmann::json::object();
    for (const auto& [k, m] : micro)
      micro_json["B" + std::to_string(std::get<0>(k)) + " " + std::get<1>(k) + " embedding_rows " +
                 std::to_string(std::get<2>(k))] = {{"block_s", m.block_s}, {"fixed_s", m.fixed_s}};
    const nlohmann::json rep = {
        {"base", req.base},
        {"world", world},
        {"global_batch", global},
        {"available_host_bytes", avail.bytes},
        {"available_nvme_bytes", nvme_free},
        {"ranks_per_host", local},
        {"runtime_overhead_bytes", kRuntimeOverhead},
        {"machine", cal.machine()},
        {"threads_per_rank", threads},
        {"rates", {{"micro_step", micro_json}, {"adamw_s_per_param", adamw}, {"links", links_json}, {"disk_bytes_per_s", disk}}},
        {"probes", cal.used()},
        {"candidates", cands}};
    write_plan_and_report(out, best.resolved, report, rep);
  };
  write_outputs();
  if (root) std::printf("wrote %s (run it: %s./train %s) and %s\n", out.c_str(),
                        world > 1 ? ("mpirun -np " + std::to_string(world) + " ").c_str() : "", out.c_str(), report.c_str());

  const size_t k = req.validate < 0 ? fit.size() : std::min(fit.size(), size_t(req.validate));
  if (k == 0) return 0;
  const int rounds = req.validate_rounds;
  if (root) std::printf("\nvalidating the top %zu: %d steps each, the first not timed; %d round(s), every other one in "
                        "reverse order, the fastest run counts (and the first candidate run once untimed before)\n",
                        k, req.validate_steps, rounds);
  // The first run after the calibration measured up to 25% slower than its twin run later, in 4 of
  // 5 sweeps on the development VM, all of its steps (settling the disk did not change it): so the
  // first candidate runs once untimed first.
  (void)measure(fit[0]->resolved, 2, comm, out_dir);
  // Rounds: the machine drifts over a sweep (whole sweeps 9-13% off their calibration, twin plans of
  // the same cost up to 17% apart within one: docs/autoplan.md), so each candidate runs once per
  // round, the rounds in alternating order so that a slow stretch falls on other candidates in the
  // next, and its time is its fastest run, as each calibration probe keeps its fastest repeat.
  for (int r = 0; r < rounds; ++r)
    for (size_t j = 0; j < k; ++j) {
      const size_t i = r % 2 == 0 ? j : k - 1 - j;
      Candidate* c = fit[i];
      const Measured m = measure(c->resolved, req.validate_steps, comm, out_dir);
      c->measured_runs_s.push_back(m.step_s);
      c->measured_update_runs_s.push_back(m.update_s);
      c->measured_s = *std::min_element(c->measured_runs_s.begin(), c->measured_runs_s.end());
      if (root) {
        std::printf("  round %d/%d, %zu/%zu %s: predicted %s ms, measured %s ms\n", r + 1, rounds, i + 1, k,
                    c->choice.label().c_str(), ms(c->pred.step_s).c_str(), ms(c->measured_runs_s.back()).c_str());
        std::fflush(stdout);
      }
    }
  if (root) {
    std::printf("\n");
    print_table(std::vector<const Candidate*>(fit.begin(), fit.begin() + long(k)), world, true);
    const auto fastest = std::min_element(fit.begin(), fit.begin() + long(k),
                                          [](auto* a, auto* b) { return a->measured_s < b->measured_s; });
    if (*fastest != fit[0])
      std::printf("measured fastest: #%ld (%s), %.1f%% faster than the chosen plan\n", long(fastest - fit.begin()) + 1,
                  (*fastest)->choice.label().c_str(), (1 - (*fastest)->measured_s / fit[0]->measured_s) * 100);
    else
      std::printf("measured fastest: the chosen plan\n");
  }
  write_outputs();
  return 0;
}

}  // namespace zt::autoplan
