// Deterministic batches of (inputs, targets) sequences of length T from token shards.
//
// The shards are cut into sequences of T+1 tokens (T inputs, targets shifted by one) at stride T.
// Sequences are numbered globally; an optimizer step consumes G = world * grad_accum * B of them.
// Rank r at micro-step m of step s takes global sequences
//     s*G + (m*world + r)*B + [0, B)
// so ranks read disjoint data, and the set of sequences in a step depends only on G, never on how
// it is split across ranks and micro-steps (what makes loss curves comparable across plans).
// Past the end, a new epoch starts; with shuffle, each epoch visits sequences in a permutation
// drawn from (seed, epoch).
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "data/shard.h"

namespace zt {

class DataLoader {
 public:
  DataLoader(const std::string& pattern, int B, int T, int rank, int world, uint64_t seed, bool shuffle);

  // inputs and targets: (B, T) each.
  void train_batch(int64_t step, int micro, int grad_accum, int* inputs, int* targets);
  // Validation batches: sequential and never shuffled; batch i for this rank.
  void eval_batch(int64_t i, int* inputs, int* targets);
  // How many eval batches of world*B sequences the data holds.
  int64_t num_eval_batches() const;

  size_t num_tokens() const;
  // The first token id >= limit in file order, or nullopt: one pass over the mapped tokens.
  struct TokenAt {
    std::string file;
    size_t position;  // index among the file's tokens
    int id;
  };
  std::optional<TokenAt> first_token_at_least(int limit) const;
  size_t num_sequences() const { return seq_index_.size(); }
  const std::vector<std::string>& files() const { return files_; }

 private:
  void fill(int64_t global_seq, int* inputs, int* targets);  // one sequence
  int64_t permuted(int64_t global_seq);

  int B_, T_, rank_, world_;
  uint64_t seed_;
  bool shuffle_;
  std::vector<std::string> files_;
  std::vector<std::unique_ptr<TokenShard>> shards_;
  std::vector<std::pair<uint32_t, uint64_t>> seq_index_;  // (shard, offset) of every sequence
  int64_t perm_epoch_ = -1;
  std::vector<uint32_t> perm_;
};

}  // namespace zt
