// Calibration for the planner (docs/autoplan.md): the rates the cost model multiplies by, measured
// on this machine, by every rank at once (ranks share cores, memory bandwidth and the disk as they
// will in training), and cached per machine.
//
// Each probe is collective: every rank of the communicator calls the same probes in the same order
// and gets the slowest rank's number (the step waits for the slowest). A probe already in the
// cache for the same key is not run again. The cache is one JSON file naming the machine it was
// measured on (host, CPU model, CPUs, memory, ranks per host, zerotrain version); a file from
// another machine is replaced, said in one line. Each value is checked on load (a number in its
// kind's range); one that is not is measured again, said in one line naming the file and key.
// Rank 0 holds an flock on FILE.lock from load to save: a second planner on the same cache waits
// (said in one line) rather than measure while the first does and overwrite its entries.
#pragma once
#include <cstddef>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "comm/comm.h"
#include "model/config.h"
#include "model/recompute.h"
#include "offload/swap_file.h"

namespace zt::autoplan {

// Seconds = alpha + bytes / bytes_per_s, bytes under the comm layer's ring byte model (comm/comm.h).
struct LinkCost {
  double alpha_s = 0;
  double bytes_per_s = 0;
  double seconds(double bytes, double collectives) const { return collectives * alpha_s + bytes / bytes_per_s; }
};

// One timing of a link probe: bytes sent (under the ring byte model) and seconds per collective.
struct LinkPoint {
  double bytes = 0, seconds = 0;
};
// alpha and bandwidth fitted to `points` (least squares); where they do not tell the two apart
// (no positive slope), all of it bandwidth at the largest.
LinkCost fit_link(const std::vector<LinkPoint>& points);

// One forward + backward of one micro-batch on the CPU backend, split as the model is: the part
// every block repeats and the rest (embedding, final norm, LM head and loss).
struct MicroStepCost {
  double block_s = 0;  // one block, forward + backward (recomputation included for its policy)
  double fixed_s = 0;  // embedding, final norm, classifier
};

// Parameter offload's transfers per micro-step (Calibration::pass_io).
struct PassCost {
  double first_s = 0;   // the first micro-step's (gradients written, not read)
  double next_s = 0;    // each later one's (gradients read, added to, written)
  double exposed = 1;   // the share of the overlap with compute not hidden, 0 (all) to 1 (none)
};

class Calibration {
 public:
  // Loads `cache_path` when it holds a calibration of this machine (rank 0 reads it; every rank
  // gets the same contents). `threads`: compute threads per rank. `notes` gets one line per thing
  // worth saying (a cache from another machine, a probe that ran).
  // `version`: the build's, part of what names the machine. `comm_settings`: what the comm layer
  // runs ("comm ring thread1 inflight2 poll_us50"; "" at one rank), part of the key of every probe
  // that communicates (link, overlap, engine runs): a link measured on the ring says nothing of
  // mpi_blocking without the thread.
  Calibration(Comm& comm, std::string cache_path, int threads, const std::string& version,
              std::string comm_settings, std::vector<std::string>& notes);
  ~Calibration();
  Calibration(const Calibration&) = delete;
  Calibration& operator=(const Calibration&) = delete;

  // For each micro-batch b in bs at the model's T, every block under `policy` (every 1): a block
  // and the rest from models of 1 and 3 blocks without recomputation, and the policy's extra from a
  // 3-block model under it (docs/autoplan.md, "Calibration"). classifier_chunk as the plan has it;
  // embedding_rows as the engine splits the embedding (stage 3 at N > 1: the chunked LM head then
  // recomputes each chunk's logits in backward, GPT::classifier_regathers).
  // tp > 1: the model as one tensor rank holds it (cfg.split(tp, rank % tp, sp)), its tensor
  // collectives left out (each rank alone: they are the tensor link's, priced apart).
  std::map<int, MicroStepCost> micro_steps(const GPTConfig& cfg, const std::set<int>& bs, int T, Recompute::Policy policy,
                                           int classifier_chunk, int embedding_rows, int tp = 1, bool sp = false);
  // CPU AdamW over a shard, seconds per parameter.
  double adamw_s_per_param();
  // The collective `op` ("all_reduce", "reduce_scatter", "all_gather") on the ranks of the
  // communicator at full-buffer sizes around `bytes` (fp32): alpha and bandwidth from two sizes,
  // each timed per collective of a run of them back to back (as training sends them).
  // On `group` (one of a split the caller made, every rank in one at once; null: every rank), its
  // name ("data P2T1": which groups of the mesh) part of the key.
  // `points`: where given, the two timings are appended to it (for a fit over more sizes).
  LinkCost link(const std::string& op, size_t bytes, Comm* group = nullptr, const std::string& group_name = "",
                std::vector<LinkPoint>* points = nullptr);
  // A message and its reply at once between neighbouring pipeline stages (stage s with s ^ 1, of P
  // stages cut from the ranks in order, as the mesh cuts them): latency and bandwidth of one
  // stage boundary, around `bytes`.
  LinkCost stage_link(int P, size_t bytes);
  // What overlap leaves exposed where ranks share the cores: one block's forward + backward run
  // while the comm thread all-gathers messages of `bytes`, against each alone; the share of the
  // shorter of the two not hidden, 0 (all hidden) to 1. 0 at one rank.
  double overlap_exposed_share(const GPTConfig& cfg, int T, size_t bytes);
  // Where a pipeline's P stages share this host's cores: the last stage's ranks running a
  // micro-step of the 1-block model at micro-batch b while the other stages' ranks wait in a
  // receive from them (as a light stage waits for its next micro-batch), over every rank running
  // it at once (what the micro-step probes measure). Below 1 as far as the waiting ranks leave
  // their cores to the busy ones: a receive that polls leaves less than one that sleeps.
  double stage_idle_share(const GPTConfig& cfg, int P, int b, int T);
  // io_uring reads and writes at once (O_DIRECT where the filesystem takes it) in `dir`, every
  // rank of this host at once: bytes per second per rank, reads and writes together. direct: the
  // directory takes O_DIRECT (offload::check_nvme_dir), as the swap files will use it.
  double disk_bytes_per_s(const std::string& dir, bool direct);
  // The offloaded optimizer step itself: offload::SwapPipeline over m and v in swap files in
  // spec.dir with the plan's sub-groups, buffer sets and queue depth, the CPU AdamW as its update,
  // every rank of this host at once, over min(shard_numel, 64M) parameters. Seconds per byte moved
  // (m and v read and written: 16 a parameter), the median of 3 after one untimed. The planner's
  // fallback without training data (with data, a short run of the engine itself measures it).
  double optimizer_pipeline_s_per_byte(const offload::SwapSpec& spec, size_t shard_numel);
  // Parameter offload's transfers in one micro-step, in the order the engine makes them
  // (ParamGatherer's schedule): the embedding's E units, the blocks, the embedding again for the
  // LM head (its backward reuses that read), the blocks in reverse, and the embedding once more
  // where the chunked classifier regathers; each unit's shard read one hook ahead into one of two
  // buffers, and in backward each unit's gradient added into the gradient file through two
  // buffers (read first unless fresh, the first micro-step's; the write-back overlaps what
  // follows). unit_shard_numel: this rank's shard of each unit; past 128M parameters in all they
  // are measured at two smaller scales and extrapolated. Then the same with compute at
  // every hook, as much as the transfers take in all, in proportion to each unit's size (what a
  // unit's forward or backward costs): the share of the overlap not hidden.
  // transfers false: only pass_exposed is measured (the transfers come from elsewhere), first_s and
  // next_s are left 0.
  PassCost pass_io(const offload::SwapSpec& spec, const std::vector<size_t>& unit_shard_numel, int embedding_units,
                   bool regather, bool transfers);

  // The cached value of `key`, or measures it with `probe` (on every rank; the largest is kept).
  double cached(const std::string& key, const std::function<double()>& probe);
  bool has(const std::string& key) const { return entries_.contains(key); }

  // Writes the cache (rank 0; once) and lets the next planner have it; throws one line when it cannot.
  void save();
  // The numbers this calibration used, for the report written beside the plan.
  const nlohmann::json& used() const { return used_; }
  const nlohmann::json& machine() const { return machine_; }
  int threads() const { return threads_; }
  const std::string& comm_settings() const { return comm_settings_; }
  int measured() const { return measured_; }

 private:
  // Stores the largest of every rank's `mine` as `key` (collective), and says it with the
  // seconds measuring it took (where 0.05 or more: a probe's later keys come with its first).
  void record(const std::string& key, double mine, double took_s);

  Comm& comm_;
  std::string path_;
  int threads_;
  std::string comm_settings_;
  int lock_fd_ = -1;  // rank 0's, on path_ + ".lock"
  bool saved_ = false;
  nlohmann::json machine_;
  nlohmann::json entries_ = nlohmann::json::object();
  nlohmann::json used_ = nlohmann::json::object();
  std::vector<std::string>& notes_;
  int measured_ = 0;
};

// `dir` made absolute and free of symlinks where it exists (else as given): a probe's cache key.
std::string canonical_dir(const std::string& dir);

// Waits until the filesystem of `dir` has written back and trimmed what earlier probes or runs left
// (syncfs), so that the next measurement of the disk is not disturbed by them. Best effort.
void settle_disk(const std::string& dir);

// The default cache: $XDG_CACHE_HOME/zerotrain/calibration.json, else ~/.cache/zerotrain/calibration.json.
std::string default_cache_path();

}  // namespace zt::autoplan
