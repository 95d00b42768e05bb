// Plan loading, part 2 (docs/design.md §4): the resolved JSON (plan_json.cpp) into the typed Plan.
//
//   plan_from_json: schema check again (for JSON built by hand), ranges per field (including
//   the 32-bit limits of the kernels), combinations of fields, what this build supports
//   (runtime/support.h), and (optionally) this machine: run.threads against its cores, the data
//   files. Each check throws one zt::Error line that names the JSON path.
#include "plan/plan.h"

#include <glob.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <regex>
#include <sstream>
#include <unordered_set>

#include "runtime/error.h"
#include "runtime/launcher.h"
#include "runtime/output_path.h"
#include "runtime/support.h"
#include "plan/plan_detail.h"

namespace zt {

using namespace plan_detail;

void plan_detail::bad(const std::string& path, const std::string& what) { throw Error("plan: " + path + ": " + what); }

namespace {

namespace fs = std::filesystem;

// ---- typed reads with range checks --------------------------------------------------------------


const json& at(const json& root, const std::string& dotted) {
  const json* cur = &root;
  size_t start = 0;
  while (true) {
    size_t dot = dotted.find('.', start);
    std::string key = dotted.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    ZT_ASSERT(cur->is_object() && cur->contains(key));
    cur = &(*cur)[key];
    if (dot == std::string::npos) return *cur;
    start = dot + 1;
  }
}

std::string num_str(int64_t x) { return std::to_string(x); }

int64_t get_i64(const json& root, const std::string& path, int64_t min, int64_t max = INT_MAX) {
  const json& v = at(root, path);
  if (!v.is_number_integer()) bad(path, "expected an integer, got " + describe(v));
  if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX))
    bad(path, "must be <= " + num_str(max) + ", got " + v.dump());
  int64_t x = v.get<int64_t>();
  if (x < min) bad(path, "must be >= " + num_str(min) + ", got " + v.dump());
  if (x > max) bad(path, "must be <= " + num_str(max) + ", got " + v.dump());
  return x;
}

int get_int(const json& root, const std::string& path, int64_t min) {
  return static_cast<int>(get_i64(root, path, min, INT_MAX));
}

double get_num(const json& root, const std::string& path) {
  const json& v = at(root, path);
  if (!v.is_number()) bad(path, "expected a number, got " + describe(v));
  return v.get<double>();
}

double get_positive(const json& root, const std::string& path) {
  double x = get_num(root, path);
  if (!(x > 0)) bad(path, "must be > 0, got " + at(root, path).dump());
  return x;
}

double get_nonneg(const json& root, const std::string& path) {
  double x = get_num(root, path);
  if (!(x >= 0)) bad(path, "must be >= 0, got " + at(root, path).dump());
  return x;
}

bool get_bool(const json& root, const std::string& path) {
  const json& v = at(root, path);
  if (!v.is_boolean()) bad(path, "expected true or false, got " + describe(v));
  return v.get<bool>();
}

std::string get_str(const json& root, const std::string& path) {
  const json& v = at(root, path);
  if (!v.is_string()) bad(path, "expected a string, got " + describe(v));
  return v.get<std::string>();
}

// "\"a\"", "\"a\" or \"b\"", "\"a\", \"b\" or \"c\"".
std::string alternatives(const std::vector<std::string>& xs) {
  std::string out;
  for (size_t i = 0; i < xs.size(); ++i) {
    if (i > 0) out += (i + 1 == xs.size()) ? " or " : ", ";
    out += json(xs[i]).dump();
  }
  return out;
}

std::string get_choice(const json& root, const std::string& path, const std::vector<std::string>& allowed) {
  std::string s = get_str(root, path);
  for (const auto& a : allowed)
    if (s == a) return s;
  bad(path, "must be " + alternatives(allowed) + ", got " + shown(json(s)));
}

// ---- what this build supports -----------------------------------------------------------------
//
// The plan side of the support table (runtime/support.h): devices and precisions no built backend
// runs, and the feature values (offload, checkpoints, master_weights false) this build does not
// run. Limits of a backend that depend on the run (ranks, zero.stage, head sizes, index limits) are
// checked where the backend is chosen (choose_backend, train/backend_choice.h), from the same
// table. Everything rejected here is a valid plan (it passed the range and combination checks).
void check_supported_by_this_build(const Plan& p) {
  auto unsupported = [](const std::string& path, const std::string& value, const std::string& supported) {
    bad(path, value + " is not supported by this build yet (supported: " + supported + ")");
  };
  auto quoted = [](const std::vector<std::string>& v) {
    std::string s;
    for (const auto& x : v) s += (s.empty() ? "" : ", ") + json(x).dump();
    return s;
  };
  std::vector<std::string> devices = {"auto"}, precisions = {"auto"};
  for (const support::Backend& b : support::backends()) {
    if (!b.built) continue;
    if (std::find(devices.begin(), devices.end(), b.device) == devices.end()) devices.push_back(b.device);
    if (std::find(precisions.begin(), precisions.end(), b.precision) == precisions.end()) precisions.push_back(b.precision);
  }
  if (p.device != "auto" && !support::device_built(p.device))
    unsupported("device", shown(json(p.device)),
                quoted(devices) + "; this build has no CUDA backend: build where nvcc is installed");
  if (p.precision.compute != "auto" && !support::precision_built(p.precision.compute))
    unsupported("precision.compute", shown(json(p.precision.compute)),
                quoted(precisions) + "; bf16 needs the CUDA backend, or oneDNN (libdnnl-dev) at build time for the "
                                     "CPU backend");
  const support::Features& f = support::features();
  if (!p.precision.master_weights && !f.master_weights_off)
    unsupported("precision.master_weights", "false", "true; the optimizer always updates fp32 weights");
  auto in = [](const std::vector<std::string>& v, const std::string& x) {
    return std::find(v.begin(), v.end(), x) != v.end();
  };
  // As for the optimizer: nothing to move on the CPU backend; the CUDA backend keeps the shard in
  // pinned host memory (f.offload_params lists "cpu" only where a CUDA backend is built).
  if (p.offload.params == "cpu" && (p.device == "cpu" || (p.device == "auto" && !support::device_built("cuda"))))
    bad("offload.params", "\"cpu\" changes nothing on the CPU backend, which already keeps everything in host memory; "
                          "use \"nvme\" to move the parameter shard to disk (zero.stage 3), or \"none\"");
  if (!in(f.offload_params, p.offload.params))
    unsupported("offload.params", shown(json(p.offload.params)), quoted(f.offload_params));
  if (p.offload.optimizer == "cpu") {
    // Host memory is where the CPU backend keeps everything already; the CUDA backend runs AdamW on
    // the CPU from pinned host memory (f.offload_optimizer lists "cpu" only where a CUDA backend is built).
    const std::string fix = "; use \"nvme\" to move the optimizer state to disk, or \"none\"";
    if (p.device == "cpu" || (p.device == "auto" && !support::device_built("cuda")))
      bad("offload.optimizer", "\"cpu\" changes nothing on the CPU backend, which already keeps everything in host "
                               "memory" + fix);
  }
  if (!in(f.offload_optimizer, p.offload.optimizer))
    unsupported("offload.optimizer", shown(json(p.offload.optimizer)), quoted(f.offload_optimizer));
  if (p.checkpoint.every != 0 && !f.checkpoint_saving)
    unsupported("checkpoint.every", std::to_string(p.checkpoint.every), "0, i.e. no checkpoint saving");
  if (!f.checkpoint_resume && p.checkpoint.resume != "none")
    unsupported("checkpoint.resume", shown(json(p.checkpoint.resume)), "\"none\"");
}

// Combinations that no build can run, whatever it supports.
void check_combinations(const Plan& p) {
  if (p.comm.backend == "nccl" && p.device == "cpu")
    bad("comm.backend", "\"nccl\" needs device \"cuda\" (NCCL moves device buffers, one GPU per rank); the CPU "
                        "backend's collectives run over MPI: set comm.backend to \"mpi\" or \"auto\"");
  if (p.offload.params != "none" && p.zero.stage != 3)
    bad("offload.params", shown(json(p.offload.params)) +
                              " requires zero.stage 3 (only sharded parameters can be offloaded), got zero.stage " +
                              std::to_string(p.zero.stage));
  if (p.offload.optimizer != "none" && p.zero.stage == 0)
    bad("offload.optimizer", shown(json(p.offload.optimizer)) +
                                 " requires zero.stage 1, 2 or 3: offload streams a rank's shard of the optimizer "
                                 "state, and stage 0 keeps a full replica on every rank (got zero.stage 0)");
  for (const char* which : {"optimizer", "params"}) {
    const std::string& v = std::string(which) == "optimizer" ? p.offload.optimizer : p.offload.params;
    if (v == "nvme" && p.offload.nvme_dir.empty())
      bad("offload.nvme_dir", std::string("must be set when offload.") + which + " is \"nvme\"");
  }
  if (p.checkpoint.every > 0 && p.checkpoint.dir.empty())
    bad("checkpoint.dir", "must be set when checkpoint.every > 0 (got \"\")");
  if (p.checkpoint.resume == "auto" && p.checkpoint.dir.empty())
    bad("checkpoint.dir", "must be set when checkpoint.resume is \"auto\" (got \"\")");
}

// Data paths: relative paths are relative to the current working directory (where `train` is
// run; `make` leaves it at the repo root), not to the plan file.
void check_data_files(const Plan& p) {
  const char* hint = " (run scripts/prepare_data first, or make train)";
  auto glob_count = [](const std::string& pattern) {
    glob_t g;
    std::memset(&g, 0, sizeof g);
    int rc = glob(pattern.c_str(), 0, nullptr, &g);
    size_t n = rc == 0 ? g.gl_pathc : 0;
    globfree(&g);
    return n;
  };
  if (glob_count(p.data.train) == 0) bad("data.train", "no files match " + shown(json(p.data.train)) + hint);
  if (glob_count(p.data.val) == 0) bad("data.val", "no files match " + shown(json(p.data.val)) + hint);
  std::error_code ec;
  if (!p.data.tokenizer.empty() && fs::is_directory(p.data.tokenizer, ec))
    bad("data.tokenizer", json(p.data.tokenizer).dump() + " is a directory, not a tokenizer file (e.g. " +
                              "\"data/brown/gpt2_tokenizer.bin\", or \"\" to skip samples)");
  // Each kind by its name: a FIFO or a device was once reported "not found".
  if (!p.data.tokenizer.empty() && !input_file_problem(p.data.tokenizer).empty())
    bad("data.tokenizer", shown(json(p.data.tokenizer)) + " " + input_file_problem(p.data.tokenizer) +
                              " (give an llm.c tokenizer file, or \"\" to skip samples)");
  if (!p.data.tokenizer.empty() && !fs::is_regular_file(p.data.tokenizer, ec))
    bad("data.tokenizer", "file not found: " + shown(json(p.data.tokenizer)) +
                              " (run scripts/prepare_data first, or set data.tokenizer to \"\" to skip samples)");
  const std::string& resume = p.checkpoint.resume;
  if (resume != "none" && resume != "auto" && !fs::is_directory(resume, ec))
    bad("checkpoint.resume", "no checkpoint directory at " + shown(json(resume)) +
                                 " (give a step_NNNNNNNN directory or a checkpoint.dir, \"auto\" or \"none\")");
  if (!p.model.init.empty() && fs::is_directory(p.model.init, ec))
    bad("model.init", json(p.model.init).dump() + " is a directory, not an llm.c checkpoint (give the .bin file, " +
                          "or \"\" for a random init)");
  if (!p.model.init.empty() && !input_file_problem(p.model.init).empty())
    bad("model.init", shown(json(p.model.init)) + " " + input_file_problem(p.model.init) +
                          " (give an llm.c checkpoint file, or \"\" for a random init)");
  if (!p.model.init.empty() && !fs::is_regular_file(p.model.init, ec))
    bad("model.init", "file not found: " + shown(json(p.model.init)) + " (set model.init to \"\" for a random init)");
}

// More threads than this per rank only thrash; far more exhaust the process (each is a stack).
void check_machine(const Plan& p) {
  const int cores = affinity_cpus();
  if (int64_t(p.run.threads) > 4 * int64_t(cores))
    bad("run.threads", std::to_string(p.run.threads) + " is more than 4 x the " + std::to_string(cores) +
                           " cores this process may use (0 = one per core)");
  // run.threads 0 takes Slurm's grant, held to the same rule: refused here, before anything is written.
  if (p.run.threads == 0) (void)threads_per_rank(this_launch(), cores, 1);
}

}  // namespace

void record_backend(Plan& plan, const std::string& backend) {
  const size_t dash = backend.find('-');
  ZT_ASSERT(dash != std::string::npos);
  plan.device = backend.substr(0, dash);
  plan.precision.compute = backend.substr(dash + 1);
  ZT_ASSERT((plan.device == "cpu" || plan.device == "cuda") &&
            (plan.precision.compute == "fp32" || plan.precision.compute == "bf16"));
  plan.resolved["device"] = plan.device;
  plan.resolved["precision"]["compute"] = plan.precision.compute;
}

void record_shard_group(Plan& plan, int ranks) {
  if (plan.zero.shard_group != "host") return;
  plan.zero.shard_group = std::to_string(ranks);
  plan.resolved["zero"]["shard_group"] = plan.zero.shard_group;
}

void record_comm_backend(Plan& plan, const std::string& comm_backend) {
  ZT_ASSERT(comm_backend == "nccl" || comm_backend == "mpi");
  plan.comm.backend = comm_backend;
  plan.resolved["comm"]["backend"] = comm_backend;
}

Plan plan_from_json(const nlohmann::json& resolved, bool check_files) {
  // Missing keys take their defaults, so partial JSON built by hand works too.
  json r = base_plan_json();
  check_schema(base_plan_json(), resolved, "", "");
  json given = resolved;
  unset_nulls(base_plan_json(), given);
  deep_merge(r, given);

  Plan p;
  p.resolved = r;

  // 65536 layers is far past any real model, and bounds the per-layer bookkeeping of the layout.
  p.model.n_layer = static_cast<int>(get_i64(r, "model.n_layer", 1, 65536));
  p.model.n_head = get_int(r, "model.n_head", 1);
  p.model.n_embd = get_int(r, "model.n_embd", 1);
  if (p.model.n_embd > INT_MAX / 4)
    bad("model.n_embd", "must be <= " + std::to_string(INT_MAX / 4) +
                            " (the MLP width 4 x n_embd is a 32-bit int in the kernels), got " +
                            std::to_string(p.model.n_embd));
  if (p.model.n_embd % p.model.n_head != 0)
    bad("model.n_embd", "must be divisible by model.n_head (" + std::to_string(p.model.n_head) + "), got " +
                            std::to_string(p.model.n_embd));
  p.model.seq_len = get_int(r, "model.seq_len", 1);
  {
    const json& v = at(r, "model.vocab_size");
    int64_t x = get_i64(r, "model.vocab_size", INT64_MIN, INT64_MAX);
    if (x < 2 || x > 65536) bad("model.vocab_size", "must be in [2, 65536] (tokens are stored as uint16), got " + v.dump());
    p.model.vocab_size = static_cast<int>(x);
  }
  p.model.init = get_str(r, "model.init");

  p.data.train = get_str(r, "data.train");
  if (p.data.train.empty()) bad("data.train", "must not be empty (a glob of token shards, e.g. \"data/brown/train_*.bin\")");
  p.data.val = get_str(r, "data.val");
  if (p.data.val.empty()) bad("data.val", "must not be empty (a token shard, e.g. \"data/brown/val.bin\")");
  p.data.tokenizer = get_str(r, "data.tokenizer");
  p.data.shuffle = get_bool(r, "data.shuffle");

  p.batch.micro_batch = get_int(r, "batch.micro_batch", 1);
  p.batch.grad_accum = get_int(r, "batch.grad_accum", 1);
  p.batch.world = int(get_i64(r, "batch.world", 0, 65536));
  {
    // Every kernel takes the rows of a micro-step (micro_batch x seq_len) as an int.
    const int64_t tokens = int64_t(p.batch.micro_batch) * p.model.seq_len;
    if (tokens > INT_MAX)
      bad("batch.micro_batch", "micro_batch x model.seq_len = " + std::to_string(tokens) +
                                   " tokens per micro-step; the kernels count them in 32 bits (at most " +
                                   std::to_string(INT_MAX) + ")");
  }

  p.optim.lr = get_positive(r, "optim.lr");
  {
    const json& betas = at(r, "optim.betas");
    if (!betas.is_array() || betas.size() != 2)
      bad("optim.betas", "expected an array of 2 numbers, got " + describe(betas));
    for (int i = 0; i < 2; ++i) {
      const std::string path = "optim.betas[" + std::to_string(i) + "]";
      if (!betas[i].is_number()) bad(path, "expected a number, got " + describe(betas[i]));
      double b = betas[i].get<double>();
      if (!(b >= 0 && b < 1)) bad(path, "must be in [0, 1), got " + betas[i].dump());
    }
    p.optim.beta1 = betas[0].get<double>();
    p.optim.beta2 = betas[1].get<double>();
  }
  p.optim.eps = get_positive(r, "optim.eps");
  p.optim.weight_decay = get_nonneg(r, "optim.weight_decay");
  p.optim.grad_clip = get_nonneg(r, "optim.grad_clip");
  p.optim.warmup_steps = get_int(r, "optim.warmup_steps", 0);
  p.optim.schedule = get_choice(r, "optim.schedule", {"cosine", "constant"});
  p.optim.min_lr_ratio = get_num(r, "optim.min_lr_ratio");
  if (!(p.optim.min_lr_ratio >= 0 && p.optim.min_lr_ratio <= 1))
    bad("optim.min_lr_ratio", "must be in [0, 1], got " + at(r, "optim.min_lr_ratio").dump());

  p.precision.compute = get_choice(r, "precision.compute", {"auto", "fp32", "bf16"});
  p.precision.master_weights = get_bool(r, "precision.master_weights");

  {
    const json& v = at(r, "zero.stage");
    int64_t st = get_i64(r, "zero.stage", INT64_MIN, INT64_MAX);
    if (st < 0 || st > 3) bad("zero.stage", "must be 0, 1, 2 or 3, got " + v.dump());
    p.zero.stage = static_cast<int>(st);
  }
  p.zero.bucket_mb = get_positive(r, "zero.bucket_mb");
  p.zero.overlap_comm = get_bool(r, "zero.overlap_comm");
  p.zero.prefetch_units = get_int(r, "zero.prefetch_units", 0);
  {
    // "world", "host", or a number of ranks written as a string ("2"): whether it divides the world
    // is known only at launch (zero/data_mesh.h).
    const std::string g = get_str(r, "zero.shard_group");
    const bool digits = !g.empty() && g.size() <= 6 && g.find_first_not_of("0123456789") == std::string::npos;
    if (!(g == "world" || g == "host" || (digits && std::stol(g) >= 1)))
      bad("zero.shard_group", "must be \"world\", \"host\" or a number of ranks >= 1 such as \"2\", got " +
                                  shown(json(g)));
    p.zero.shard_group = digits ? std::to_string(std::stol(g)) : g;
  }

  p.mesh.pipeline = static_cast<int>(get_i64(r, "mesh.pipeline", 1, 1024));
  p.mesh.schedule = get_choice(r, "mesh.schedule", {"gpipe", "1f1b", "interleaved"});
  p.mesh.chunks = static_cast<int>(get_i64(r, "mesh.chunks", 1, 1024));
  p.mesh.tensor = static_cast<int>(get_i64(r, "mesh.tensor", 1, 1024));
  if (p.model.n_head % p.mesh.tensor != 0)
    bad("mesh.tensor", std::to_string(p.mesh.tensor) + " does not divide model.n_head " + std::to_string(p.model.n_head) +
                           ": every tensor rank holds n_head / mesh.tensor whole heads");
  p.mesh.sequence_parallel = get_bool(r, "mesh.sequence_parallel");
  if (p.mesh.sequence_parallel && p.mesh.tensor == 1)
    bad("mesh.sequence_parallel", "splits the positions over the tensor group: it needs mesh.tensor > 1");
  if (p.mesh.sequence_parallel && p.model.seq_len % p.mesh.tensor != 0)
    bad("mesh.sequence_parallel", "needs model.seq_len " + std::to_string(p.model.seq_len) +
                                      " divisible by mesh.tensor " + std::to_string(p.mesh.tensor) +
                                      ": every tensor rank holds seq_len / mesh.tensor positions of each sequence");

  p.comm.backend = get_choice(r, "comm.backend", {"auto", "nccl", "mpi"});
  p.comm.timeout_s = get_positive(r, "comm.timeout_s");
  p.comm.fault_skip_rank = get_int(r, "comm.fault_skip_rank", -1);
  p.comm.fault_skip_step = get_int(r, "comm.fault_skip_step", -1);
  p.comm.thread = get_bool(r, "comm.thread");
  p.comm.collectives = get_choice(r, "comm.collectives", {"ring", "mpi", "mpi_blocking"});
  // The limits of zt::CommOptions (comm/comm.h), which the plan layer does not include.
  p.comm.inflight = static_cast<int>(get_i64(r, "comm.inflight", 0, 1024));
  p.comm.poll_us = static_cast<int>(get_i64(r, "comm.poll_us", 0, 100000));

  p.recompute.policy = get_choice(r, "recompute.policy", {"none", "selective", "block"});
  p.recompute.every = get_int(r, "recompute.every", 1);
  p.recompute.classifier_chunk = get_int(r, "recompute.classifier_chunk", -1);
  if (p.recompute.every != 1 && p.recompute.policy != "block")
    bad("recompute.every", "only applies to recompute.policy \"block\" (got policy \"" + p.recompute.policy +
                               "\" with every " + std::to_string(p.recompute.every) + ")");

  p.offload.optimizer = get_choice(r, "offload.optimizer", {"none", "cpu", "nvme"});
  p.offload.params = get_choice(r, "offload.params", {"none", "cpu", "nvme"});
  p.offload.nvme_dir = get_str(r, "offload.nvme_dir");
  p.offload.queue_depth = static_cast<int>(get_i64(r, "offload.queue_depth", 1, 4096));
  p.offload.buffer_count = static_cast<int>(get_i64(r, "offload.buffer_count", 2, 64));
  p.offload.subgroup_mb = get_positive(r, "offload.subgroup_mb");
  p.offload.overlap_update = get_bool(r, "offload.overlap_update");
  if (p.offload.subgroup_mb > 65536)
    bad("offload.subgroup_mb", "must be <= 65536 (MiB per state per sub-group), got " + at(r, "offload.subgroup_mb").dump());

  p.checkpoint.dir = get_str(r, "checkpoint.dir");
  p.checkpoint.every = get_int(r, "checkpoint.every", 0);
  p.checkpoint.keep = get_int(r, "checkpoint.keep", 1);
  p.checkpoint.chunk_mb = get_positive(r, "checkpoint.chunk_mb");
  if (p.checkpoint.chunk_mb > 65536 || p.checkpoint.chunk_mb * 1048576.0 < 4)
    bad("checkpoint.chunk_mb", "must be between 4 bytes and 65536 MiB, got " + at(r, "checkpoint.chunk_mb").dump());
  // "none", "auto" (latest under checkpoint.dir, if any) or the path of a checkpoint.
  p.checkpoint.resume = get_str(r, "checkpoint.resume");
  if (p.checkpoint.resume.empty())
    bad("checkpoint.resume", "must be \"none\", \"auto\" or the path of a checkpoint, got \"\"");

  p.run.steps = get_int(r, "run.steps", 1);
  p.run.eval_every = get_int(r, "run.eval_every", 0);
  p.run.eval_batches = get_int(r, "run.eval_batches", 1);
  p.run.sample_every = get_int(r, "run.sample_every", 0);
  p.run.sample_tokens = get_int(r, "run.sample_tokens", 1);
  p.run.log_every = get_int(r, "run.log_every", 1);
  {
    const json& v = at(r, "run.seed");
    if (!v.is_number_integer()) bad("run.seed", "expected an integer, got " + describe(v));
    if (!v.is_number_unsigned() && v.get<int64_t>() < 0) bad("run.seed", "must be >= 0, got " + v.dump());
    p.run.seed = v.get<uint64_t>();
  }
  p.run.log = get_str(r, "run.log");
  if (p.run.log.empty()) bad("run.log", "must not be empty (the metrics JSONL path, e.g. \"runs/x/metrics.jsonl\")");
  p.run.threads = get_int(r, "run.threads", 0);
  // Legal (a short smoke run of a long plan does it), so a warning, not an error.
  if (p.optim.warmup_steps > p.run.steps)
    p.warnings.push_back("optim.warmup_steps (" + std::to_string(p.optim.warmup_steps) + ") is larger than run.steps (" +
                         std::to_string(p.run.steps) +
                         "): the learning rate never reaches optim.lr and the schedule never decays");
  p.run.final_weights = get_str(r, "run.final_weights");
  p.run.trace = get_str(r, "run.trace");

  p.device = get_choice(r, "device", {"auto", "cpu", "cuda"});

  check_combinations(p);
  check_pipeline(p);
  check_supported_by_this_build(p);
  if (check_files) {
    check_machine(p);
    check_data_files(p);
  }
  return p;
}

uint64_t plan_hash(const std::string& text) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : text) h = (h ^ c) * 1099511628211ull;
  return h;
}

Plan load_plan(const std::string& path, const std::vector<std::string>& overrides, bool check_files) {
  std::vector<std::string> files;
  Plan p = plan_from_json(resolve_plan(path, overrides, &files), check_files);
  p.source = path;
  p.files = std::move(files);
  return p;
}

}  // namespace zt
