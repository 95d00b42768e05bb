// DataLoader: global sequence numbering over token shards (see loader.h for the contract).
//
//   shard k, n_k tokens  ->  (n_k - 1) / T sequences, sequence j = tokens [j*T, j*T + T + 1)
//   all shards, in file order  ->  sequences 0 .. N-1 (seq_index_)
//   global sequence g  ->  epoch g / N, position g % N  ->  (shuffle ? perm_epoch[pos] : pos)
//
// The permutation comes from our own PRNG (splitmix64) and Fisher-Yates, not std::shuffle or
// std::uniform_int_distribution, whose outputs differ between standard libraries: a run must see
// the same batches on every machine and every rank.
#include "data/loader.h"

#include <algorithm>
#include <limits>

#include "runtime/error.h"

namespace zt {

namespace {

// splitmix64 (Steele, Lea, Flood 2014): a tiny, well-mixed 64-bit generator.
uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

}  // namespace

DataLoader::DataLoader(const std::string& pattern, int B, int T, int rank, int world, uint64_t seed, bool shuffle)
    : B_(B), T_(T), rank_(rank), world_(world), seed_(seed), shuffle_(shuffle) {
  ZT_REQUIRE(B > 0, "data loader: micro batch must be > 0, got " << B);
  ZT_REQUIRE(T > 0, "data loader: sequence length must be > 0, got " << T);
  ZT_REQUIRE(world > 0 && rank >= 0 && rank < world,
             "data loader: rank " << rank << " is not in [0, world=" << world << ")");
  files_ = data_files(pattern);
  for (uint32_t k = 0; k < files_.size(); ++k) {
    shards_.push_back(std::make_unique<TokenShard>(files_[k]));
    const TokenShard& s = *shards_.back();
    const uint64_t nseq = s.size() > 0 ? (s.size() - 1) / uint64_t(T) : 0;
    ZT_REQUIRE(nseq > 0, "data file " << s.path() << ": " << s.size() << " tokens hold no sequence at seq_len " << T
                                      << " (a sequence needs " << (int64_t(T) + 1) << " tokens)");
    for (uint64_t j = 0; j < nseq; ++j) seq_index_.emplace_back(k, j * uint64_t(T));
  }
  ZT_REQUIRE(seq_index_.size() < uint64_t(std::numeric_limits<uint32_t>::max()),
             "data files " << pattern << ": " << seq_index_.size() << " sequences; at most 2^32-1 are supported");
}

size_t DataLoader::num_tokens() const {
  size_t n = 0;
  for (const auto& s : shards_) n += s->size();
  return n;
}

std::optional<DataLoader::TokenAt> DataLoader::first_token_at_least(int limit) const {
  for (const auto& s : shards_) {
    const size_t i = s->first_token_at_least(uint32_t(std::max(limit, 0)));
    if (i < s->size()) return TokenAt{s->path(), i, int(s->tokens()[i])};
  }
  return std::nullopt;
}

int64_t DataLoader::permuted(int64_t global_seq) {
  const int64_t N = int64_t(seq_index_.size());
  const int64_t epoch = global_seq / N;
  const int64_t pos = global_seq % N;
  if (!shuffle_) return pos;
  if (epoch != perm_epoch_) {
    // State from (seed, epoch) only: any rank, any step order, any restart builds the same permutation.
    uint64_t state = seed_ ^ (0xD1B54A32D192ED03ull * (uint64_t(epoch) + 1));
    splitmix64(state);
    perm_.resize(size_t(N));
    for (int64_t i = 0; i < N; ++i) perm_[size_t(i)] = uint32_t(i);
    for (int64_t i = N - 1; i > 0; --i) {
      // j uniform in [0, i]; the modulo bias is below N / 2^64, far beneath anything observable.
      const int64_t j = int64_t(splitmix64(state) % uint64_t(i + 1));
      std::swap(perm_[size_t(i)], perm_[size_t(j)]);
    }
    perm_epoch_ = epoch;
  }
  return perm_[size_t(pos)];
}

void DataLoader::fill(int64_t global_seq, int* inputs, int* targets) {
  ZT_REQUIRE(global_seq >= 0, "data loader: negative sequence number " << global_seq);
  const auto& [shard, offset] = seq_index_[size_t(permuted(global_seq))];
  const uint16_t* tok = shards_[shard]->tokens() + offset;
  for (int t = 0; t < T_; ++t) {
    inputs[t] = tok[t];
    targets[t] = tok[t + 1];
  }
}

void DataLoader::train_batch(int64_t step, int micro, int grad_accum, int* inputs, int* targets) {
  ZT_REQUIRE(grad_accum > 0 && micro >= 0 && micro < grad_accum,
             "data loader: micro step " << micro << " is not in [0, grad_accum=" << grad_accum << ")");
  ZT_REQUIRE(step >= 0, "data loader: negative step " << step);
  const int64_t G = int64_t(world_) * grad_accum * B_;
  const int64_t first = step * G + (int64_t(micro) * world_ + rank_) * B_;
  for (int b = 0; b < B_; ++b) fill(first + b, inputs + size_t(b) * T_, targets + size_t(b) * T_);
}

int64_t DataLoader::num_eval_batches() const { return int64_t(seq_index_.size()) / (int64_t(world_) * B_); }

void DataLoader::eval_batch(int64_t i, int* inputs, int* targets) {
  ZT_REQUIRE(i >= 0 && i < num_eval_batches(),
             "data loader: eval batch " << i << " is out of range: " << files_.front() << (files_.size() > 1 ? " ..." : "")
                                        << " holds " << num_eval_batches() << " batches of world*B = " << world_ * B_
                                        << " sequences of " << T_ << " tokens");
  const int64_t first = (i * world_ + rank_) * B_;
  for (int b = 0; b < B_; ++b) {
    const auto& [shard, offset] = seq_index_[size_t(first + b)];  // in order: never shuffled
    const uint16_t* tok = shards_[shard]->tokens() + offset;
    int* in = inputs + size_t(b) * T_;
    int* tg = targets + size_t(b) * T_;
    for (int t = 0; t < T_; ++t) {
      in[t] = tok[t];
      tg[t] = tok[t + 1];
    }
  }
}

}  // namespace zt
