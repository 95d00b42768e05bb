#include "zero/partition.h"

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <sstream>

#include "runtime/checked.h"
#include "runtime/error.h"

namespace zt {

size_t zero_pad_multiple(int world) { return std::lcm(size_t(world), size_t(128)); }

int zero_embedding_rows(const GPTConfig& cfg, int stage, int world) {
  // A world of one shards nothing: its stage 3 keeps stage 0's layout, and so stays bit for bit
  // the single-rank result (summing the LM head's input gradient over chunks would not).
  return stage == 3 && world > 1 ? ParamLayout::block_sized_rows(cfg, zero_pad_multiple(world)) : 0;
}

Partition::Partition(const ParamLayout& layout, const ZeroConfig& zc) : zc_(zc) {
  ZT_ASSERT(zc.world >= 1 && zc.rank >= 0 && zc.rank < zc.world && zc.replicas >= 1);
  ZT_REQUIRE(layout.pad_multiple() % size_t(zc.world) == 0,
             "layout padded to " << layout.pad_multiple() << " elements cannot be split over " << zc.world << " ranks");
  const int U = layout.num_units();
  size_t flat = 0;
  for (const Unit& u : layout.units()) {
    unit_padded_.push_back(u.padded);
    shard_flat_.push_back(flat);
    flat += u.padded / size_t(zc.world);
  }
  total_ = layout.total();
  embedding_units_ = layout.embedding_units();
  const size_t per_rank = checked_mul(zc.micro_tokens, size_t(layout.config().C) + 1, "zero: lookup exchange");
  // Off with replicas: the exchange would have to span both groups (the rows are added after the
  // shard group's reduction, before the replicas'), for a few MB of traffic. Off with tensor
  // parallelism: each tensor rank's lookup is of its vocabulary rows, summed over the tensor group.
  if (zc.world > 1 && zc.replicas == 1 && zc.tensor == 1 && zc.pipeline == 1 && zc.stage <= 2 && zc.host && embedding_units_ == 1 &&
      checked_mul(per_rank, size_t(zc.world), "zero: lookup exchange") <= unit_padded_[0])
    lookup_numel_ = per_rank;

  // Buckets in backward order: blocks and final norm by bucket_mb, then the embedding's units. A
  // bucket past 2^63 bytes (zero.bucket_mb is any positive number) would not convert to size_t: it
  // is as good as one bucket for all.
  const double bucket_bytes = zc.bucket_mb * 1024.0 * 1024.0;
  const size_t bucket_elems =
      std::max<size_t>(1, (bucket_bytes < 0x1p63 ? size_t(bucket_bytes) : SIZE_MAX) / zc.elem_bytes);
  bucket_of_.assign(size_t(U), -1);
  Bucket cur;
  auto close = [&] {
    if (cur.units.empty()) return;
    cur.offset = layout.units()[size_t(cur.units.back())].offset;
    cur.shard_numel = cur.numel / size_t(zc.world);
    for (int u : cur.units) bucket_of_[size_t(u)] = int(buckets_.size());
    buckets_.push_back(cur);
    cur = Bucket{};
  };
  for (int u = U - 1; u >= embedding_units_; --u) {
    cur.units.push_back(u);
    cur.numel += unit_padded_[size_t(u)];
    // Naive path: one collective per unit, no bucketing.
    if (!zc.overlap || cur.numel >= bucket_elems) close();
  }
  close();
  // Each embedding unit is a bucket of its own: bucketed together the chunks would make the
  // staging slots embedding-sized again, which is what splitting the embedding removes.
  for (int u = embedding_units_ - 1; u >= 0; --u) {
    cur.units.push_back(u);
    cur.numel = unit_padded_[size_t(u)];
    close();
  }
}

size_t Partition::max_unit_padded() const { return *std::max_element(unit_padded_.begin(), unit_padded_.end()); }

size_t Partition::max_other_unit_padded() const {
  const size_t first = embedding_units_ == 1 ? 1 : 0;
  return unit_padded_.size() > first ? *std::max_element(unit_padded_.begin() + first, unit_padded_.end()) : 0;
}

size_t Partition::gather_slots_numel() const {
  size_t n = 0;
  for (size_t i = 0; i < gather_slots(); ++i) n = checked_add(n, gather_slot_numel(i), "model: gathered-unit slots (elements)");
  return n;
}

size_t Partition::staging_slot_numel() const {
  size_t m = 0;
  for (const Bucket& b : buckets_)
    if (b.units.front() != 0 || embedding_units_ > 1) m = std::max(m, b.numel);
  return m;
}

uint64_t Partition::bytes_per_step() const {
  return checked_add(bytes_per_step_shard_group(), bytes_per_step_replicas(), "zero: bytes sent per step");
}

uint64_t Partition::bytes_per_step_replicas() const {
  // Each all-reduce of n elements over R ranks sends (2 e n) / R bytes, rounded down as the
  // Comm byte model counts it (comm.h): a shard need not be a multiple of R.
  const uint64_t R = uint64_t(zc_.replicas), e = zc_.elem_bytes;
  const std::string what = "zero: bytes sent per step";
  uint64_t sum = 0;
  for (const auto& [off, n] : replica_all_reduces())
    sum = checked_add(sum, checked_mul(checked_mul(2 * (R - 1), e, what), uint64_t(n), what) / R, what);
  return sum;
}

std::vector<std::pair<size_t, size_t>> Partition::replica_all_reduces() const {
  std::vector<std::pair<size_t, size_t>> out;
  if (zc_.replicas == 1 || zc_.stage == 0) return out;
  if (zc_.stage == 1) return {{0, shard_total()}};
  for (const Bucket& b : buckets_) out.push_back({unit_shard_flat(b.units.back()), b.shard_numel});
  return out;
}

uint64_t Partition::bytes_per_step_shard_group() const {
  const uint64_t N = uint64_t(zc_.world), e = zc_.elem_bytes, A = uint64_t(zc_.grad_accum);
  const uint64_t psi = total_, again = embedding_gathered_again();
  // Every count below is a multiple of N (units are padded to lcm(N, 128)), so dividing first is
  // exact, and keeps the products below 2^64 whenever the result is.
  ZT_ASSERT(psi % N == 0 && again % N == 0);
  const std::string what = "zero: bytes sent per step";
  auto mul = [&](uint64_t a, uint64_t b) { return checked_mul(a, b, what); };
  const uint64_t one_pass = mul(mul(psi / N, N - 1), e);  // one reduce-scatter or all-gather of everything
  const uint64_t lookup = mul(mul(lookup_numel_, N - 1), e);  // one all-gather of the lookup slices
  // Stages 1-2 add the lookup's rows once per step (EmbeddingExchange::forward_lookup: the same bytes).
  switch (zc_.stage) {
    case 0: return checked_add(mul(2, one_pass), lookup, what);  // all-reduce = reduce-scatter + all-gather
    case 1: return mul(2, checked_add(one_pass, lookup, what));  // reduce-scatter once, all-gather params
    case 2:  // reduce-scatter every micro-step, all-gather params
      return mul(checked_add(A, 1, what), checked_add(one_pass, lookup, what));
    default:  // per micro-step: gather fwd + bwd, RS; the LM head's chunks gathered once more
      return mul(A, checked_add(mul(3, one_pass), mul(mul(again / N, N - 1), e), what));
  }
}

size_t Partition::embedding_gathered_again() const {
  // Forward gathers the embedding for the lookup and again for the LM head; backward's head
  // (units E-1..0) starts with the unit the forward head ended with, still gathered, and the
  // embedding's gradients need no parameters (model/gpt.h).
  // A chunked classifier (zc_.classifier_regather) gathers every unit once more for its gradient.
  size_t n = 0;
  for (int u = 0; u + 1 < embedding_units_; ++u) n += unit_padded_[size_t(u)];
  if (zc_.classifier_regather && zc_.stage == 3)
    for (int u = 0; u < embedding_units_; ++u) n += unit_padded_[size_t(u)];
  return n;
}

std::string Partition::bytes_formula() const {
  std::ostringstream os;
  const double psi = double(total_), N = zc_.world;
  os << "Ψ = " << total_ << " padded parameters, N = " << zc_.world << ", grad_accum A = " << zc_.grad_accum << ": ";
  switch (zc_.stage) {
    case 0: os << "all-reduce 2Ψ(N-1)/N"; break;
    case 1: os << "reduce-scatter Ψ(N-1)/N + all-gather Ψ(N-1)/N"; break;
    case 2: os << "A x reduce-scatter Ψ(N-1)/N + all-gather Ψ(N-1)/N"; break;
    default:
      os << "A x (gather 2Ψ + LM head's embedding units again " << embedding_gathered_again()
         << " + reduce-scatter Ψ)(N-1)/N";
  }
  if (lookup_numel_)  // X = N x lookup_numel
    os << (zc_.stage == 0 ? " + " : zc_.stage == 1 ? " + 2 x " : " + (A+1) x ") << "embedding lookup exchange X(N-1)/N, X = "
       << lookup_exchange_numel();
  if (zc_.replicas > 1)
    os << "; across the " << zc_.replicas << " replicas: all-reduce of my shard 2(R-1)/R x Ψ/N = "
       << bytes_per_step_replicas() / zc_.elem_bytes;
  os << " elements x " << zc_.elem_bytes << " bytes";
  (void)psi; (void)N;
  return os.str();
}

}  // namespace zt
