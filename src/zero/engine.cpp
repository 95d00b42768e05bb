#include "zero/engine.h"

#include <algorithm>
#include <cmath>
#include <type_traits>

#include "backend/ops_cpu.h"
#if ZT_HAVE_CUDA
#include "backend/ops_cuda.h"
#endif
#include "runtime/error.h"
#include "train/optimizer.h"

namespace zt {

namespace {
// Collectives carry fp32 (the CPU backend, and the CUDA fp32 parity mode over NCCL). Mixed-precision
// (bf16) collectives come with multi-GPU training; until then a bf16 model runs on one rank, where
// stage 0 sends nothing (see launch_bucket) and the trainer refuses every other combination.
template <class X>
float* comm_ptr(X* p) {
  if constexpr (std::is_same_v<std::remove_const_t<X>, float>) {
    return const_cast<float*>(p);
  } else {
    (void)p;
    ZT_REQUIRE(false, "ZeRO: collectives on bf16 buffers are not supported by this build yet (bf16 trains on "
                             "one rank, zero.stage 0)");
    return nullptr;
  }
}
}  // namespace

template <class Ops>
ZeroEngine<Ops>::ZeroEngine(GPT<Ops>& model, const Partition& part, Comm& comm, MemoryTracker& mem,
                            const OptimSection& optim)
    : model_(model), layout_(model.layout()), part_(part), comm_(comm), optim_(optim), stage_(part.config().stage),
      world_(part.config().world), accum_(part.config().grad_accum), overlap_(part.config().overlap) {
  ZT_ASSERT(comm.world() == world_ && comm.rank() == part.config().rank);
  // Allocate exactly what Partition::buffers() lists beyond the model's own buffers.
  for (const Partition::Buffer& b : part.buffers()) {
    const bool fp32_state = b.name == "AdamW first moment" || b.name == "AdamW second moment";
    const size_t bytes = b.numel * (fp32_state ? sizeof(M) : sizeof(T));
    Allocation* dst = nullptr;
    if (b.name == "parameter shard") dst = &param_shard_;
    else if (b.name == "gradient shard") dst = &grad_shard_;
    else if (b.name == "AdamW first moment") dst = &m_;
    else if (b.name == "AdamW second moment") dst = &v_;
    else if (b.name == "embedding gradient staging") dst = &g0_;
    else if (b.name == "bucket gradient staging") dst = &staging_;
    else if (b.name == "reduce-scatter receive") dst = &recv_;
    else if (b.name == "gathered units") dst = &gathered_;
    if (dst) *dst = mem.alloc(bytes, Ops::tier, b.cat, b.name);
  }
  if constexpr (kMixed) {
    // The optimizer updates an fp32 copy of the parameters it owns; the T parameters are its rounding.
    const size_t n = stage_ == 0 ? layout_.total() : part.shard_total();
    master_ = mem.alloc(n * sizeof(M), Ops::tier, Category::master, "master weights");
  }
  if (stage_ >= 2) {
    const size_t slot = part.staging_slot_numel();
    for (size_t i = 0; i < part.staging_slots(); ++i) {
      StagingSlot s;
      s.buf = staging_.as<T>() + i * slot;
      s.recv = recv_.as<T>() + i * (slot / size_t(world_));
      sslots_.push_back(s);
    }
    s0_.buf = g0_.as<T>();
    s0_.recv = recv_.as<T>() + part.staging_slots() * (slot / size_t(world_));
    s0_.bucket = int(part.buckets().size()) - 1;  // unit 0's own bucket is the last
    slot_of_bucket_.assign(part.buckets().size(), nullptr);
    slot_of_bucket_.back() = &s0_;
  }
  if (stage_ == 3) {
    for (size_t i = 0; i < part.gather_slots(); ++i) {
      GatherSlot g;
      g.buf = gathered_.as<T>() + i * part.max_unit_padded();
      gslots_.push_back(g);
    }
  }
  model_.set_hooks(this);
}

template <class Ops>
ZeroEngine<Ops>::~ZeroEngine() {
  model_.set_hooks(nullptr);
}

template <class Ops>
typename ZeroEngine<Ops>::T* ZeroEngine<Ops>::unit_full_params(int u) {
  return model_.params() + layout_.units()[size_t(u)].offset;
}

// ---- parameters ------------------------------------------------------------------------------

template <class Ops>
void ZeroEngine<Ops>::init_parameters(uint64_t seed, const std::string& llmc_path) {
  if (stage_ <= 2) {
    // Every rank computes the same values (counter-based RNG, or the same file).
    if (llmc_path.empty()) model_.init_gpt2(seed);
    else model_.load_llmc(llmc_path);
    init_master();
    return;
  }
  // Stage 3: build the full parameters once in a temporary buffer, keep my shard, free it.
  MemoryTracker scratch_mem;
  Allocation full = scratch_mem.alloc(layout_.total() * sizeof(T), Ops::tier, Category::staging, "parameter init");
  for (int u = 0; u < layout_.num_units(); ++u) model_.set_unit_params(u, full.as<T>() + layout_.units()[size_t(u)].offset);
  if (llmc_path.empty()) model_.init_gpt2(seed);
  else model_.load_llmc(llmc_path);
  for (int u = 0; u < layout_.num_units(); ++u) {
    Ops::copy(param_shard_.as<T>() + part_.unit_shard_flat(u),
              full.as<T>() + layout_.units()[size_t(u)].offset + part_.unit_shard_begin(u), part_.unit_shard_numel(u));
    model_.set_unit_params(u, nullptr);
  }
  init_master();
}

template <class Ops>
void ZeroEngine<Ops>::init_master() {
  if constexpr (kMixed) {
    // Master = the initial parameters, widened (exact: every bf16 value is an fp32 value).
    if (stage_ == 0) {
      Ops::widen(master_.as<M>(), model_.params(), layout_.total());
      return;
    }
    for (int u = 0; u < layout_.num_units(); ++u) {
      const size_t flat = part_.unit_shard_flat(u);
      const T* src = stage_ == 3 ? param_shard_.as<T>() + flat : unit_full_params(u) + part_.unit_shard_begin(u);
      Ops::widen(master_.as<M>() + flat, src, part_.unit_shard_numel(u));
    }
  }
}

template <class Ops>
void ZeroEngine<Ops>::gather_full_parameters(T* out) {
  if (stage_ <= 2) {
    Ops::copy(out, model_.params(), layout_.total());
    return;
  }
  std::vector<CommHandle> hs;
  for (int u = 0; u < layout_.num_units(); ++u)
    hs.push_back(comm_.all_gather(comm_ptr(param_shard_.as<T>() + part_.unit_shard_flat(u)),
                                  comm_ptr(out + layout_.units()[size_t(u)].offset), part_.unit_shard_numel(u)));
  comm_.wait_all(hs);
}

// ---- step structure --------------------------------------------------------------------------

template <class Ops>
void ZeroEngine<Ops>::begin_step(int64_t step) {
  comm_.begin_step(step);
  if (stage_ <= 1) model_.zero_grad();
  if (stage_ >= 1) Ops::zero(grad_shard_.as<T>(), part_.shard_total());
}

template <class Ops>
void ZeroEngine<Ops>::begin_pass(int micro, bool with_backward) {
  micro_ = micro;
  backward_pass_ = with_backward;
  head_seen_ = false;
  if (stage_ != 3) return;
  // The order in which the model uses units (see UnitHooks): forward 0 (lookup), 1..L, L+1, 0 (head);
  // backward 0 (head), L+1, L..1, 0 (lookup). Consecutive uses of one unit share one gather.
  const int U = layout_.num_units();
  sched_.clear();
  for (int u = 0; u < U; ++u) sched_.push_back(u);
  sched_.push_back(0);
  if (with_backward) {
    sched_.push_back(0);
    for (int u = U - 1; u >= 1; --u) sched_.push_back(u);
    sched_.push_back(0);
  }
  pos_ = 0;
  for (GatherSlot& g : gslots_) ZT_ASSERT(g.unit < 0);
}

template <class Ops>
void ZeroEngine<Ops>::finish_gradients() {
  if (stage_ <= 1) {
    comm_.wait_all(inflight_);
    return;
  }
  for (StagingSlot& s : sslots_) complete_staging(s);
  complete_staging(s0_);
}

template <class Ops>
double ZeroEngine<Ops>::grad_norm() {
  double ss = 0.0;
  if (stage_ == 0) {
    // Every rank holds the same all-reduced gradients.
    for (const Unit& u : layout_.units()) ss += Ops::sum_squares(model_.grads() + u.offset, u.padded);
    return std::sqrt(ss);
  }
  ss = Ops::sum_squares(grad_shard_.as<T>(), part_.shard_total());
  comm_.all_reduce_sum(&ss, 1);
  return std::sqrt(ss);
}

template <class Ops>
void ZeroEngine<Ops>::optimizer_step(double lr, double grad_scale) {
  ++steps_taken_;
  for (int u = 0; u < layout_.num_units(); ++u) {
    const Unit& unit = layout_.units()[size_t(u)];
    M* master = master_.as<M>();  // nullptr unless mixed precision
    if (stage_ == 0) {
      adamw_unit_range<Ops>(layout_, u, 0, unit.padded, model_.params() + unit.offset, master ? master + unit.offset : nullptr,
                            model_.grads() + unit.offset, m_.as<M>() + unit.offset, v_.as<M>() + unit.offset, optim_, lr,
                            grad_scale, steps_taken_);
      continue;
    }
    const size_t begin = part_.unit_shard_begin(u), n = part_.unit_shard_numel(u), flat = part_.unit_shard_flat(u);
    T* param = stage_ == 3 ? param_shard_.as<T>() + flat : unit_full_params(u) + begin;
    adamw_unit_range<Ops>(layout_, u, begin, n, param, master ? master + flat : nullptr, grad_shard_.as<T>() + flat,
                          m_.as<M>() + flat, v_.as<M>() + flat, optim_, lr, grad_scale, steps_taken_);
  }
  if (stage_ == 1 || stage_ == 2) {
    // Everyone updated its shard of the full parameters in place; all-gather them back.
    for (int u = 0; u < layout_.num_units(); ++u) {
      T* full = unit_full_params(u);
      inflight_.push_back(comm_.all_gather(comm_ptr(full + part_.unit_shard_begin(u)), comm_ptr(full), part_.unit_shard_numel(u)));
      if (!overlap_) comm_.wait_all(inflight_);
    }
    comm_.wait_all(inflight_);
  }
}

// ---- stage 3: gathered units -----------------------------------------------------------------

template <class Ops>
void ZeroEngine<Ops>::start_gather(int pos, GatherSlot& s) {
  const int u = sched_[size_t(pos)];
  s.unit = u;
  s.first = s.last = pos;
  while (s.last + 1 < int(sched_.size()) && sched_[size_t(s.last + 1)] == u) ++s.last;
  s.h = comm_.all_gather(comm_ptr(param_shard_.as<T>() + part_.unit_shard_flat(u)), comm_ptr(s.buf), part_.unit_shard_numel(u));
  int alive = 0;
  for (const GatherSlot& g : gslots_) alive += g.unit >= 0;
  max_alive_ = std::max(max_alive_, alive);
}

template <class Ops>
void ZeroEngine<Ops>::prefetch() {
  if (!overlap_) return;
  // Next positions not yet covered by a slot, up to prefetch_units gathers ahead.
  int covered = pos_;
  for (const GatherSlot& g : gslots_)
    if (g.unit >= 0) covered = std::max(covered, g.last);
  for (int j = covered + 1; j < int(sched_.size()); ) {
    auto free_slot = std::find_if(gslots_.begin(), gslots_.end(), [](const GatherSlot& g) { return g.unit < 0; });
    if (free_slot == gslots_.end()) break;
    start_gather(j, *free_slot);
    j = free_slot->last + 1;
  }
}

template <class Ops>
void ZeroEngine<Ops>::use_unit(int u) {
  ZT_ASSERT(pos_ < int(sched_.size()) && sched_[size_t(pos_)] == u);
  auto it = std::find_if(gslots_.begin(), gslots_.end(),
                         [&](const GatherSlot& g) { return g.unit == u && g.first <= pos_ && pos_ <= g.last; });
  if (it == gslots_.end()) {
    it = std::find_if(gslots_.begin(), gslots_.end(), [](const GatherSlot& g) { return g.unit < 0; });
    ZT_ASSERT(it != gslots_.end());
    start_gather(pos_, *it);
  }
  prefetch();  // start the next gathers before blocking on this one
  comm_.wait(it->h);
  it->h = CommHandle{};
  model_.set_unit_params(u, it->buf);
}

template <class Ops>
void ZeroEngine<Ops>::release_unit(int u) {
  for (GatherSlot& g : gslots_) {
    if (g.unit == u && g.first <= pos_ && pos_ <= g.last) {
      if (pos_ == g.last) {
        g.unit = -1;
        model_.set_unit_params(u, nullptr);
      }
      break;
    }
  }
  ++pos_;
}

// ---- hooks -----------------------------------------------------------------------------------

template <class Ops>
void ZeroEngine<Ops>::before_forward(int u) {
  if (stage_ == 3) use_unit(u);
  else progress();
}

template <class Ops>
void ZeroEngine<Ops>::after_forward(int u) {
  if (stage_ == 3) release_unit(u);
}

template <class Ops>
void ZeroEngine<Ops>::before_backward(int u) {
  if (stage_ == 3) use_unit(u);
  else progress();
  if (stage_ < 2) return;
  // Point the unit's gradients at a staging slot and zero it (stages 2-3: no full gradient buffer).
  if (u == 0) {
    if (head_seen_) return;  // second use (token lookup): keep accumulating into the same staging
    head_seen_ = true;
    complete_staging(s0_);
    Ops::zero(s0_.buf, part_.unit_padded(0));
    model_.set_unit_grads(0, s0_.buf);
    return;
  }
  const int b = part_.bucket_of(u);
  const Bucket& bk = part_.buckets()[size_t(b)];
  if (bk.units.front() != u) return;  // slot already assigned when the bucket's first unit started
  // Take a free slot, or wait for the oldest one in flight (slots are used round-robin).
  StagingSlot* slot = nullptr;
  for (StagingSlot& s : sslots_)
    if (s.bucket < 0) { slot = &s; break; }
  if (!slot) {  // the one taken longest ago (it may hold a bucket of the previous micro-step)
    slot = &*std::min_element(sslots_.begin(), sslots_.end(),
                              [](const StagingSlot& a, const StagingSlot& c) { return a.taken < c.taken; });
    complete_staging(*slot);
  }
  slot->bucket = b;
  slot->taken = ++slots_taken_;
  slot_of_bucket_[size_t(b)] = slot;
  Ops::zero(slot->buf, bk.numel);
  for (int v : bk.units) model_.set_unit_grads(v, slot->buf + (layout_.units()[size_t(v)].offset - bk.offset));
}

template <class Ops>
void ZeroEngine<Ops>::after_backward(int u) {
  if (stage_ == 3) release_unit(u);
}

template <class Ops>
void ZeroEngine<Ops>::grads_ready(int u) {
  const int b = part_.bucket_of(u);
  const Bucket& bk = part_.buckets()[size_t(b)];
  const bool last_micro = micro_ == accum_ - 1;
  if (bk.units.back() != u) {  // the bucket is not complete yet
    progress();
    return;
  }
  if (stage_ <= 1 && !last_micro) return;  // accumulate locally; communicate once per step
  launch_bucket(b);
}

template <class Ops>
void ZeroEngine<Ops>::launch_bucket(int b) {
  const Bucket& bk = part_.buckets()[size_t(b)];
  if (stage_ == 0) {
    if (world_ == 1) return;  // a world of one has nothing to reduce
    inflight_.push_back(comm_.all_reduce(comm_ptr(model_.grads() + bk.offset), bk.numel));
  } else if (stage_ == 1) {
    for (int v : bk.units)
      inflight_.push_back(comm_.reduce_scatter(comm_ptr(model_.grads() + layout_.units()[size_t(v)].offset),
                                               comm_ptr(grad_shard_.as<T>() + part_.unit_shard_flat(v)),
                                               part_.unit_shard_numel(v)));
  } else {
    StagingSlot* slot = slot_of_bucket_[size_t(b)];
    ZT_ASSERT(slot && slot->bucket == b && slot->hs.empty());
    const int lowest = bk.units.back();
    for (int v : bk.units) {
      const size_t in_bucket = layout_.units()[size_t(v)].offset - bk.offset;
      const size_t in_recv = part_.unit_shard_flat(v) - part_.unit_shard_flat(lowest);
      slot->hs.push_back(
          comm_.reduce_scatter(comm_ptr(slot->buf + in_bucket), comm_ptr(slot->recv + in_recv), part_.unit_shard_numel(v)));
    }
    if (!overlap_) complete_staging(*slot);
    return;
  }
  if (!overlap_) comm_.wait_all(inflight_);
}

template <class Ops>
void ZeroEngine<Ops>::complete_staging(StagingSlot& s) {
  if (s.bucket < 0 || s.hs.empty()) {
    if (&s != &s0_) s.bucket = -1;
    return;
  }
  comm_.wait_all(s.hs);
  const Bucket& bk = part_.buckets()[size_t(s.bucket)];
  T* shard = grad_shard_.as<T>() + part_.unit_shard_flat(bk.units.back());
  Ops::residual_forward(shard, shard, s.recv, bk.shard_numel);  // shard += recv, in the backend's memory
  if (&s != &s0_) s.bucket = -1;
}

template class ZeroEngine<CpuOps<float>>;
#if ZT_HAVE_CUDA
template class ZeroEngine<CudaOps<float>>;
template class ZeroEngine<CudaOps<bf16>>;
#endif

}  // namespace zt
