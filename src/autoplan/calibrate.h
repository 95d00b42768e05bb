// Calibration for the planner (docs/autoplan.md): the rates the cost model multiplies by, measured
// on this machine, by every rank at once (ranks share cores, memory bandwidth and the disk as they
// will in training), and cached per machine.
//
// Each probe is collective: every rank of the communicator calls the same probes in the same order
// and gets the slowest rank's number (the step waits for the slowest). A probe already in the
// cache for the same key is not run again. The cache is one JSON file naming the machine it was
// measured on (host, CPU model, CPUs, memory, ranks per host, zerotrain version); a file from
// another machine is replaced, said in one line.
#pragma once
#include <cstddef>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "comm/comm.h"
#include "model/config.h"
#include "model/recompute.h"

namespace zt::autoplan {

// Seconds = alpha + bytes / bytes_per_s, bytes under the comm layer's ring byte model (comm/comm.h).
struct LinkCost {
  double alpha_s = 0;
  double bytes_per_s = 0;
  double seconds(double bytes, double collectives) const { return collectives * alpha_s + bytes / bytes_per_s; }
};

// One forward + backward of one micro-batch on the CPU backend, split as the model is: the part
// every block repeats and the rest (embedding, final norm, LM head and loss).
struct MicroStepCost {
  double block_s = 0;  // one block, forward + backward (recomputation included for its policy)
  double fixed_s = 0;  // embedding, final norm, classifier
};

class Calibration {
 public:
  // Loads `cache_path` when it holds a calibration of this machine (rank 0 reads it; every rank
  // gets the same contents). `threads`: compute threads per rank. `notes` gets one line per thing
  // worth saying (a cache from another machine, a probe that ran).
  // `version`: the build's, part of what names the machine.
  Calibration(Comm& comm, std::string cache_path, int threads, const std::string& version,
              std::vector<std::string>& notes);

  // Per micro-batch b at the model's T, every block under `policy` (every 1): a block and the rest
  // from models of 1 and 3 blocks without recomputation, and the policy's extra from a 3-block
  // model under it (docs/autoplan.md, "Calibration"). classifier_chunk as the plan has it;
  // embedding_rows as the engine splits the embedding (stage 3 at N > 1: the chunked LM head then
  // recomputes each chunk's logits in backward, GPT::classifier_regathers).
  MicroStepCost micro_step(const GPTConfig& cfg, int b, int T, Recompute::Policy policy, int classifier_chunk,
                           int embedding_rows);
  // CPU AdamW over a shard, seconds per parameter.
  double adamw_s_per_param();
  // The collective `op` ("all_reduce", "reduce_scatter", "all_gather") on the ranks of the
  // communicator at full-buffer sizes around `bytes` (fp32): alpha and bandwidth from two sizes.
  LinkCost link(const std::string& op, size_t bytes);
  // What overlap leaves exposed where ranks share the cores: one block's forward + backward run
  // while the comm thread all-gathers messages of `bytes`, against each alone; the share of the
  // shorter of the two not hidden, 0 (all hidden) to 1. 0 at one rank.
  double overlap_exposed_share(const GPTConfig& cfg, int T, size_t bytes);
  // io_uring reads and writes at once (O_DIRECT where the filesystem takes it) in `dir`, every
  // rank of this host at once: bytes per second per rank, reads and writes together. direct: the
  // directory takes O_DIRECT (offload::check_nvme_dir), as the swap files will use it.
  double disk_bytes_per_s(const std::string& dir, bool direct);

  // Writes the cache (rank 0); throws one line when it cannot.
  void save();
  // The numbers this calibration used, for the report written beside the plan.
  const nlohmann::json& used() const { return used_; }
  const nlohmann::json& machine() const { return machine_; }
  int threads() const { return threads_; }
  int measured() const { return measured_; }

 private:
  // The cached value of `key`, or measures it with `probe` (on every rank; the largest is kept).
  double cached(const std::string& key, const std::function<double()>& probe);

  Comm& comm_;
  std::string path_;
  int threads_;
  nlohmann::json machine_;
  nlohmann::json entries_ = nlohmann::json::object();
  nlohmann::json used_ = nlohmann::json::object();
  std::vector<std::string>& notes_;
  int measured_ = 0;
};

// The default cache: $XDG_CACHE_HOME/zerotrain/calibration.json, else ~/.cache/zerotrain/calibration.json.
std::string default_cache_path();

}  // namespace zt::autoplan
