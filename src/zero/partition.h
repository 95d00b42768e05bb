// ZeRO partitioning, written as data (docs/design.md §3.3: "stages are data layouts").
//
// Every unit is padded to a multiple of lcm(world, 128) elements, so it splits into `world` equal
// shards; rank r owns elements [r*P_u/N, (r+1)*P_u/N) of each unit u. The rank's shards of all
// units, concatenated in unit order, form its flat SHARD buffers (optimizer moments, gradient
// shard, and for stage 3 the parameter shard), Ψ/N elements each.
//
// What each stage keeps per rank (Ψ = padded parameter count, P_u = padded size of unit u):
//
//            params            grads                       optimizer (m, v)   comm buffers
//   stage 0  Ψ                 Ψ                           2Ψ                 -
//   stage 1  Ψ                 Ψ + Ψ/N (reduced shard)     2Ψ/N               -
//   stage 2  Ψ                 Ψ/N                         2Ψ/N               embedding staging P_0, bucket staging, RS receive
//   stage 3  Ψ/N               Ψ/N                         2Ψ/N               bucket staging, RS receive, gathered-unit
//                                                                             slots: (prefetch + 1) x max(block, chunk)
//
// Stage 3 splits the tied embedding into block-sized row chunks (zero_embedding_rows, model/
// layout.h), so no buffer is embedding-sized there. Stages 0-2, and stage 3 at one rank (which
// shards nothing), keep it one unit (unit 0).
//
// Gradient buckets follow the order backward produces gradients (final norm, blocks L-1..0,
// embedding units E-1..0: the model computes the embedding's gradients last, LM head and lookup
// together, model/gpt.h). A bucket is a run of consecutive blocks (and the final norm) of at least
// bucket_mb MiB (the last may be smaller); each embedding unit is a bucket of its own. A one-unit
// embedding has a staging slot of its own (it is much larger than a block, so the bucket slots are
// not sized by it); stage 3's block-sized chunks go through the bucket slots.
//
// This header sizes everything from the plan and a world size without allocating; zero/store.h
// lists the buffers from it, the store allocates exactly that list, and `train estimate` prints it.
#pragma once
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "model/layout.h"
#include "runtime/memory.h"

namespace zt {

size_t zero_pad_multiple(int world);  // lcm(world, 128)
// The layout's wte rows per embedding unit for a stage: block-sized chunks at stage 3 with more
// than one rank, one unit (0) otherwise.
int zero_embedding_rows(const GPTConfig& cfg, int stage, int world);

struct Bucket {
  std::vector<int> units;  // in backward order (descending unit index)
  size_t offset = 0;       // element offset of the bucket's lowest unit in the full flat buffer
  size_t numel = 0;        // padded elements, contiguous in the full flat buffer
  size_t shard_numel = 0;  // numel / world
};

struct ZeroConfig {
  int stage = 0;
  int world = 1;  // the shard group's size (the world unless hybrid sharding: zero/data_mesh.h)
  int rank = 0;   // this rank's place in the shard group
  // Shard groups holding the same shards (hybrid sharding, zero/data_mesh.h): after the group's
  // reduce-scatter each rank's gradient shard is summed over the R replicas, once per step.
  int replicas = 1;
  // Tensor-parallel ranks each holding a part of every unit (docs/design.md §3.13): the partition is
  // of this rank's part; the embedding's lookup exchange is off with more than one.
  int tensor = 1;
  // Pipeline stages (docs/design.md §3.14): the partition is of this stage's units; the embedding's
  // lookup exchange is off with more than one (the lookup and the head are on different stages).
  int pipeline = 1;
  bool overlap = true;
  double bucket_mb = 25;
  int prefetch_units = 1;
  int grad_accum = 1;
  size_t elem_bytes = 4;  // bytes of one parameter / gradient element (fp32 on the CPU backend)
  // Tokens of one micro-step (micro_batch x seq_len) and whether the backend keeps its buffers in
  // host memory: together they decide the deferred embedding lookup gradient (lookup_numel()).
  size_t micro_tokens = 0;
  bool host = true;
  // Stage 3, split embedding, chunked classifier: backward gathers the embedding's units once
  // more for their gradients (GPT::classifier_regathers, docs/design.md §3.11).
  bool classifier_regather = false;
};

// What a stage does, as data (docs/design.md §3.3): the engine's parts read these flags instead of
// comparing stage numbers.
struct StageRules {
  bool full_params;        // stages 0-2: every rank holds all parameters
  bool full_grads;         // stages 0-1: a full gradient buffer, reduced once per step
  bool optimizer_sharded;  // stages 1-3: AdamW runs on my shard only
  bool gather_params;      // stages 1-2: all-gather the updated shards after the optimizer step
  bool staged_grads;       // stages 2-3: gradients go through staging slots, reduce-scattered every micro-step
  bool gather_units;       // stage 3: units are gathered before use and released after
  static StageRules of(int stage) {
    return {stage <= 2, stage <= 1, stage >= 1, stage == 1 || stage == 2, stage >= 2, stage == 3};
  }
};

class Partition {
 public:
  Partition(const ParamLayout& layout, const ZeroConfig& zc);

  const ZeroConfig& config() const { return zc_; }
  StageRules rules() const { return StageRules::of(zc_.stage); }
  size_t total() const { return total_; }              // Ψ (padded)
  size_t shard_total() const { return total_ / size_t(zc_.world); }  // Ψ/N
  size_t unit_shard_numel(int u) const { return unit_padded_[size_t(u)] / size_t(zc_.world); }
  size_t unit_shard_begin(int u) const { return unit_shard_numel(u) * size_t(zc_.rank); }  // within the unit
  size_t unit_shard_flat(int u) const { return shard_flat_[size_t(u)]; }  // offset in the flat shard buffers
  size_t unit_padded(int u) const { return unit_padded_[size_t(u)]; }
  size_t max_unit_padded() const;
  const std::vector<Bucket>& buckets() const { return buckets_; }
  int bucket_of(int u) const { return bucket_of_[size_t(u)]; }

  // The buffers themselves are listed in zero/store.h (list_model_state), sized by these rules.
  size_t staging_slots() const { return zc_.overlap ? 2 : 1; }  // bucket staging slots (stages 2-3)
  size_t staging_slot_numel() const;                            // largest bucket but a one-unit embedding's
  // A one-unit embedding's own gradient staging (P_0), 0 when it is split into chunks.
  size_t embedding_staging_numel() const { return embedding_units_ == 1 ? unit_padded_[0] : 0; }
  // Stage 3 gathered-unit slots: at most gather_slots() units alive at once. Slot 0 holds any unit
  // (sized by the largest); the others hold any unit but a one-unit embedding, so they are sized
  // by the largest block, final norm or embedding chunk.
  size_t gather_slots() const { return size_t(zc_.overlap ? zc_.prefetch_units : 0) + 1; }
  size_t gather_slot_numel(size_t slot) const { return slot == 0 ? max_unit_padded() : max_other_unit_padded(); }
  size_t gather_slots_numel() const;  // all slots together
  size_t max_other_unit_padded() const;  // the largest unit but a one-unit embedding

  // Stage 3: elements gathered per micro-step beyond 2Ψ: every embedding unit but the last
  // (Pe - Pl in docs/zero.md; 0 for a one-unit embedding).
  size_t embedding_gathered_again() const;
  // Stages 0-2 with N > 1 on the CPU backend (docs/design.md §3.4, "the embedding's gradient"):
  // the wte gradient's LM-head part is reduced from the start of backward, its lookup part (rows
  // of the batch's tokens, and wpe) after every rank's output gradient and tokens are all-gathered
  // at the end: per rank micro_tokens x (C + 1) elements (the token ids ride as the int32 bits of
  // one more float per position). 0 = off (stage 3; one rank; a device backend; or when N such
  // slices would be larger than the embedding P0, where reducing the embedding whole is cheaper).
  size_t lookup_numel() const { return lookup_numel_; }
  size_t lookup_exchange_numel() const { return lookup_numel_ * size_t(zc_.world); }  // X: all ranks' slices
  // Bytes this rank sends per optimizer step under the Comm byte model (comm.h): within the shard
  // group, across the replicas (the shard all-reduce, 2(R-1)/R x Ψ/N, once per step), and both.
  uint64_t bytes_per_step_shard_group() const;
  // The shard all-reduces across replicas, as (offset, count) in my flat shard buffers: stage 1 one of
  // the whole shard once the step's reduce-scatters are done; stages 2-3 one per bucket, started as
  // the bucket's last micro-step result lands in the shard. Empty without replicas.
  std::vector<std::pair<size_t, size_t>> replica_all_reduces() const;
  uint64_t bytes_per_step_replicas() const;
  uint64_t bytes_per_step() const;
  // The same, spelled as a formula with its numbers, for `train estimate`.
  std::string bytes_formula() const;

 private:
  ZeroConfig zc_;
  size_t total_ = 0;
  int embedding_units_ = 1;
  size_t lookup_numel_ = 0;
  std::vector<size_t> unit_padded_, shard_flat_;
  std::vector<Bucket> buckets_;
  std::vector<int> bucket_of_;
};

}  // namespace zt
