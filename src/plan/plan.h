// The training plan: typed, sectioned configuration loaded from JSON (docs/design.md §4).
//
// Every default lives in plans/base.json (embedded into the binary at build time, see
// base_plan.cpp.in); a plan file is merged over it. base.json is also the schema: a key it does
// not have is unknown, and the JSON type of its value is the type a plan must use
// (an integer default demands an integer; a floating default accepts any number).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace zt {

struct ModelSection {
  int n_layer = 0;        // L
  int n_head = 0;         // NH
  int n_embd = 0;         // C
  int seq_len = 0;        // T: trained sequence length = size of the position table
  int vocab_size = 0;     // V (real vocabulary; padded to Vp = multiple of 128 inside)
  std::string init;       // "" = random GPT-2 init from run.seed; else an llm.c model .bin (fp32, version 3)
};

struct DataSection {
  std::string train;      // glob of llm.c token shards
  std::string val;        // one llm.c token shard (or a glob)
  std::string tokenizer;  // llm.c tokenizer table (gpt2_tokenizer.bin) for decoding samples; "" = no samples
  bool shuffle = true;    // shuffle sequence order each epoch (deterministic from run.seed)
};

struct BatchSection {
  int micro_batch = 0;    // B sequences per rank per micro-step
  int grad_accum = 0;     // micro-steps per optimizer step
  // The ranks the plan is for (./train plan writes it), 0 = any: the global batch is micro_batch x
  // grad_accum x ranks, so a run at another world would train another batch; it is refused.
  int world = 0;
};

struct OptimSection {
  double lr = 0, beta1 = 0, beta2 = 0, eps = 0, weight_decay = 0, grad_clip = 0;  // grad_clip 0 = off
  int warmup_steps = 0;
  std::string schedule;   // "cosine" | "constant"
  double min_lr_ratio = 0;
};

struct PrecisionSection {
  std::string compute;    // "auto" | "fp32" | "bf16"  (auto: fp32 on the CPU backend)
  bool master_weights = true;
};

struct ZeroSection {
  int stage = 0;
  double bucket_mb = 0;
  bool overlap_comm = true;
  int prefetch_units = 1;
  // The ranks the model state is sharded over (docs/design.md §3.12, zero/data_mesh.h): "world", "host"
  // (the ranks of one host) or a number of consecutive ranks ("2"); the groups so formed replicate
  // each other's shards (hybrid sharding).
  std::string shard_group = "world";
};

// The ranks' mesh (docs/design.md §3.13): `tensor` adjacent ranks split every block's matrices and
// the vocabulary (tensor parallelism, model/tensor_parallel.h); the data axis (zero.*) is the rest.
struct MeshSection {
  // Pipeline parallelism (docs/design.md §3.14, docs/pipeline.md): the blocks cut into `pipeline`
  // stages, outermost on the mesh; micro-batches (batch.grad_accum of them) run by `schedule`
  // ("gpipe" | "1f1b" | "interleaved"); under "interleaved" each rank holds `chunks` model chunks
  // (virtual stages: chunk c of rank s is stage c x pipeline + s of pipeline x chunks).
  int pipeline = 1;
  std::string schedule = "1f1b";
  int chunks = 1;
  int tensor = 1;
  // Sequence parallelism (Korthikanti et al. 2022): the LayerNorm / residual regions split along the
  // positions across the tensor group (reduce-scatter + all-gather instead of all-reduce).
  bool sequence_parallel = false;
};

struct CommSection {
  // "auto" | "nccl" | "mpi" (train/backend_choice.h): NCCL on device buffers, one GPU per rank; or MPI
  // (host buffers; the CUDA backend host-stages them, comm/host_mirror_comm.h). Written back as the one that runs.
  std::string backend = "auto";
  double timeout_s = 300;     // a collective not done after this long is a hang: diagnose and abort all ranks
  int fault_skip_rank = -1;   // fault injection for tests: this rank skips its first collective
  int fault_skip_step = -1;   // ... of this training step (-1 = off)
  // The MPI backend's communication thread (docs/design.md §3.4; zt::CommOptions, which train.cu
  // fills from these; ZT_COMM_THREAD / _COLLECTIVES / _INFLIGHT / _POLL_US override them).
  bool thread = true;         // collectives started and progressed by a thread of their own
  std::string collectives = "ring";  // large float collectives on that thread: "ring" | "mpi" | "mpi_blocking"
  int inflight = 2;           // collectives in flight at once, in issue order (0 = no limit, at most 1024)
  int poll_us = 50;           // microseconds between polls while any is in flight (0 = yield, at most 100000)
};

struct RecomputeSection {
  std::string policy;     // "none" | "selective" | "block" (docs/design.md §3.11)
  int every = 1;          // block: blocks 0, every, 2*every, ... are recomputed, the others keep everything
  int classifier_chunk = -1;  // positions per LM-head + loss chunk; 0 = whole, -1 = auto (one block's activations, >= 256)
};

// docs/design.md §3.6. optimizer "nvme": AdamW moments in swap files under nvme_dir (stages 1-3),
// streamed in sub-groups of subgroup_mb MiB per state through buffer_count buffer sets, with up to
// queue_depth io_uring requests in flight. overlap_update: with optim.grad_clip 0 at stage 3 (CPU
// backend) that step runs inside backward, each sub-group once its gradient is final.
struct OffloadSection {
  std::string optimizer = "none", params = "none", nvme_dir;
  int queue_depth = 1024;
  int buffer_count = 3;
  double subgroup_mb = 4.0;
  bool overlap_update = true;
};

// Sharded checkpoints (docs/design.md §3.7; docs/checkpoints.md).
struct CheckpointSection {
  std::string dir;     // where step_NNNNNNNN/ directories and `latest` go; "" = no checkpoints
  int every = 0;       // save every this many steps (and after the last); 0 = only on SIGTERM/SIGINT/SIGUSR1
  int keep = 3;        // newest checkpoints kept (>= 1); older ones are removed after each save
  std::string resume;  // "none" | "auto" (latest under dir, fresh start if none) | a checkpoint path
  double chunk_mb = 64;  // a range larger than this is saved in pieces (datasets) of this size; a save
                         // or load streams through one host buffer of one piece
};

struct RunSection {
  int steps = 0;
  int eval_every = 0;     // 0 = only at the end
  int eval_batches = 0;
  int sample_every = 0;   // 0 = only at the end
  int sample_tokens = 0;
  int log_every = 1;
  uint64_t seed = 0;
  std::string log;        // metrics JSONL path (rank 0); the resolved plan is written beside it
  int threads = 0;        // CPU threads per rank (OpenMP + BLAS); 0 = cores / ranks on this host
  std::string final_weights;  // "" = none; else write the final weights there as an llm.c .bin (rank 0)
  std::string trace;          // "" = off; else a Chrome/Perfetto JSON trace per rank (runtime/trace.h)
};

struct Plan {
  ModelSection model;
  DataSection data;
  BatchSection batch;
  OptimSection optim;
  PrecisionSection precision;
  ZeroSection zero;
  MeshSection mesh;
  CommSection comm;
  RecomputeSection recompute;
  OffloadSection offload;
  CheckpointSection checkpoint;
  RunSection run;
  std::string device;     // "auto" | "cpu" | "cuda"

  nlohmann::json resolved;  // the fully merged plan, as printed at start and written beside the log
  std::string source;       // path of the plan file it came from
  std::vector<std::string> files;  // that file and every file its "extends" chain named, in order (inputs of the command)
  std::vector<std::string> warnings;  // legal but probably unintended settings (one line each, no "warning:" prefix)
};

// Nesting deeper than this is refused while parsing, in plan files and --set values: printing or
// walking a JSON value recurses once per level (a plan itself nests 3 levels).
constexpr int kMaxJsonDepth = 64;

// The embedded plans/base.json as parsed JSON.
const nlohmann::json& base_plan_json();

// Reads `path`, follows "extends" chains (paths relative to the file that names them; cycles are
// errors), merges over the defaults, applies `overrides` ("a.b=v", v parsed as JSON when it parses,
// else taken as a string; type-checked against the schema) and returns the resolved JSON.
// Throws zt::Error naming the file and JSON path on any problem. `files`, when given, receives
// `path` and the files of its "extends" chain, in order.
nlohmann::json resolve_plan(const std::string& path, const std::vector<std::string>& overrides,
                            std::vector<std::string>* files = nullptr);

// Validates a resolved plan (types, unknown keys with close-match suggestions, ranges,
// combinations, options this build does not implement) and fills the typed struct.
// With check_files (a run on this machine, not an estimate for another), also checks what depends
// on the machine: the data files exist (relative data paths are relative to the current working
// directory, not to the plan file) and run.threads is at most 4 x its cores.
Plan plan_from_json(const nlohmann::json& resolved, bool check_files);

// Writes the backend that will run ("cpu-fp32", "cpu-bf16", "cuda-fp32", "cuda-bf16", from choose_backend)
// into the plan, typed fields and `resolved` alike, so the published plan names the device and
// precision that ran instead of "auto".
void record_backend(Plan& plan, const std::string& backend);
// Writes the comm backend that runs ("nccl" or "mpi") into plan.comm.backend and plan.resolved.
void record_comm_backend(Plan& plan, const std::string& comm_backend);
// zero.shard_group "host" as the number of ranks it is at launch (zero/data_mesh.h); others stay.
void record_shard_group(Plan& plan, int ranks);

// `s` cut to at most `max` bytes (on a UTF-8 boundary) with "..." appended when cut: error
// messages quote values, keys and overrides, which may be megabytes long. What cannot be seen
// (control characters, zero-width and other invisible code points, bytes that are not UTF-8) is
// written as \uXXXX / \xNN, so "optim.lr\u200b" does not read as the key it was mistaken for.
std::string clip(const std::string& s, size_t max = 60);

// The candidate closest to `bad` (case-insensitive edit distance, or one containing the other),
// or "" when none is close enough. Used for "did you mean" in unknown-key errors.
std::string suggest_key(const std::string& bad, const std::vector<std::string>& candidates);

// FNV-1a of `text`: the plan hash (of plan.resolved.dump(), plus the version in train.cu's check that
// every rank runs the same plan) that checkpoints record.
uint64_t plan_hash(const std::string& text);

// resolve_plan + plan_from_json.
Plan load_plan(const std::string& path, const std::vector<std::string>& overrides, bool check_files = true);

}  // namespace zt
