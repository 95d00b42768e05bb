#include "zero/param_gatherer.h"

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "backend/ops_cpu.h"
#if ZT_HAVE_CUDA
#include "backend/ops_cuda.h"
#endif
#include "zero/comm_ptr.h"

namespace zt {

template <class Ops>
ParamGatherer<Ops>::ParamGatherer(GPT<Ops>& model, const Partition& part, StateStore& store, Comm& comm)
    : model_(model), layout_(model.layout()), part_(part), store_(store), comm_(comm), rules_(part.rules()) {
  if (!rules_.gather_units) return;
  T* base = store.get<T>(StateId::gathered_units);
  if ((pfile_ = store.file(StateId::param_shard))) {
    ZT_ASSERT(Ops::tier == Tier::host && sizeof(T) == 4);
    ring_ = std::make_unique<offload::Uring>(store.swap().queue_depth);
  }
  for (size_t i = 0; i < part.gather_slots(); ++i) {
    GatherSlot g;
    g.buf = base;
    g.numel = part.gather_slot_numel(i);
    base += g.numel;
    if (pfile_) g.rbuf = store.get<T>(StateId::param_io) + param_io_offset(part, i);
    slots_.push_back(g);
  }
}

template <class Ops>
const typename ParamGatherer<Ops>::T* ParamGatherer<Ops>::read_shard(int u, T* rbuf, int tag) {
  // Whole blocks around the shard (O_DIRECT); the file is only written by the optimizer step,
  // never while a pass reads it.
  const size_t off = part_.unit_shard_flat(u) * sizeof(T), n = part_.unit_shard_numel(u) * sizeof(T);
  const size_t a0 = off / offload::kIoAlign * offload::kIoAlign, a1 = offload::io_round_up(off + n);
  ring_->read(pfile_->fd(), rbuf, a1 - a0, a0, tag, pfile_->path().c_str());
  return rbuf + (off - a0) / sizeof(T);
}

template <class Ops>
void ParamGatherer<Ops>::launch_gather(GatherSlot& s, const T* src) {
  if (tr_) {
    tr_->tag_next("unit", s.unit);
    tr_->tag_next("prefetch", s.first != pos_);
  }
  s.h = gather(s.unit, src, s.buf);
}

template <class Ops>
void ParamGatherer<Ops>::pump(GatherSlot* target) {
  bool through = target && target->queued_at >= 0;
  while (!reading_.empty()) {
    GatherSlot* g = reading_.front();
    if (!through && g->queued_at >= hook_) break;
    ring_->wait(int(g - slots_.data()));
    g->queued_at = -1;
    reading_.pop_front();
    launch_gather(*g, g->send);
    if (g == target) through = false;
  }
}

template <class Ops>
typename ParamGatherer<Ops>::GatherSlot* ParamGatherer<Ops>::free_slot_for(int u) {
  GatherSlot* best = nullptr;
  for (GatherSlot& g : slots_)
    if (g.unit < 0 && g.numel >= part_.unit_padded(u) && (!best || g.numel < best->numel)) best = &g;
  return best;
}

template <class Ops>
CommHandle ParamGatherer<Ops>::gather(int u, const T* src, T* dst) {
  return comm_.all_gather(comm_ptr(src), comm_ptr(dst), part_.unit_shard_numel(u));
}

template <class Ops>
void ParamGatherer<Ops>::begin_pass(bool with_backward) {
  if (!rules_.gather_units) return;
  // The order in which the model reads units' parameters (UnitHooks, model/gpt.h): forward E-1..0
  // (lookup), blocks, final norm, 0..E-1 (LM head); backward E-1..0 (LM head), final norm, blocks
  // in reverse. The embedding's gradients need no parameters, so nothing is gathered for them
  // (unless the classifier is chunked, below).
  const int U = layout_.num_units(), E = layout_.embedding_units();
  sched_.clear();
  for (int u = E - 1; u >= 0; --u) sched_.push_back(u);
  for (int u = E; u < U; ++u) sched_.push_back(u);
  for (int u = 0; u < E; ++u) sched_.push_back(u);
  if (with_backward) {
    for (int u = E - 1; u >= 0; --u) sched_.push_back(u);
    for (int u = U - 1; u >= E; --u) sched_.push_back(u);
    // A chunked classifier over a split embedding recomputes each unit's logits for its gradient
    // (model/gpt.h): E-1..0 once more, at the end.
    if (part_.config().classifier_regather)
      for (int u = E - 1; u >= 0; --u) sched_.push_back(u);
  }
  pos_ = 0;
  for (GatherSlot& g : slots_) ZT_ASSERT(g.unit < 0);
}

template <class Ops>
void ParamGatherer<Ops>::start(int pos, GatherSlot& s) {
  const int u = sched_[size_t(pos)];
  s.unit = u;
  s.first = s.last = pos;
  while (s.last + 1 < int(sched_.size()) && sched_[size_t(s.last + 1)] == u) ++s.last;
  if (pfile_) {
    s.send = read_shard(u, s.rbuf, int(&s - slots_.data()));
    s.queued_at = hook_;
    reading_.push_back(&s);
  } else {
    launch_gather(s, store_.get<T>(StateId::param_shard) + part_.unit_shard_flat(u));
  }
  int alive = 0;
  for (const GatherSlot& g : slots_) alive += g.unit >= 0;
  max_alive_ = std::max(max_alive_, alive);
}

template <class Ops>
void ParamGatherer<Ops>::prefetch() {
  if (!part_.config().overlap) return;
  // Next positions not yet covered by a slot, up to prefetch_units gathers ahead.
  int covered = pos_;
  for (const GatherSlot& g : slots_)
    if (g.unit >= 0) covered = std::max(covered, g.last);
  // In schedule order: a unit with no free slot that fits stops the prefetch (so the positions
  // covered are always a prefix, and an uncovered use finds every slot free).
  for (int j = covered + 1; j < int(sched_.size());) {
    GatherSlot* free_slot = free_slot_for(sched_[size_t(j)]);
    if (!free_slot) break;
    start(j, *free_slot);
    j = free_slot->last + 1;
  }
}

template <class Ops>
void ParamGatherer<Ops>::use(int u) {
  ZT_ASSERT(pos_ < int(sched_.size()) && sched_[size_t(pos_)] == u);
  ++hook_;
  auto it = std::find_if(slots_.begin(), slots_.end(),
                         [&](const GatherSlot& g) { return g.unit == u && g.first <= pos_ && pos_ <= g.last; });
  if (it == slots_.end()) {
    GatherSlot* g = free_slot_for(u);
    ZT_ASSERT(g);
    start(pos_, *g);
    it = slots_.begin() + (g - slots_.data());
  }
  prefetch();  // start the next gathers before blocking on this one
  if (pfile_) pump(&*it);
  comm_.wait(it->h);
  it->h = CommHandle{};
  model_.set_unit_params(u, it->buf);
}

template <class Ops>
void ParamGatherer<Ops>::release(int u) {
  ++hook_;
  if (pfile_) pump(nullptr);
  for (GatherSlot& g : slots_) {
    if (g.unit == u && g.first <= pos_ && pos_ <= g.last) {
      if (pos_ == g.last) {
        g.unit = -1;
        model_.set_unit_params(u, nullptr);
        if (tr_) tr_->instant("release u" + std::to_string(u), Tracer::kCompute, Tracer::now_us(), "\"unit\":" + std::to_string(u));
      }
      break;
    }
  }
  ++pos_;
}

template <class Ops>
void ParamGatherer<Ops>::after_optimizer_step() {
  if (!rules_.gather_params) return;
  // Everyone updated its shard of the full parameters in place; all-gather them back, unit by
  // unit in the order forward uses them (the comm thread starts them in that order, a few at a
  // time, comm/mpi_thread.h). Where the lookup reads the shards (lookup_rows), forward needs the
  // embedding (unit 0, the largest) only at the LM head, after every block: it goes last, so the
  // first block does not wait for it to cross the link.
  ZT_ASSERT(!params_pending());
  const int U = layout_.num_units();
  const bool embedding_last = part_.lookup_numel() > 0 && part_.config().overlap && U > 1;
  T* params = store_.get<T>(StateId::params);
  ag_.assign(size_t(U), CommHandle{});
  for (int k = 0; k < U; ++k) {
    const int u = embedding_last ? (k + 1) % U : k;
    T* full = params + layout_.units()[size_t(u)].offset;
    if (tr_) tr_->tag_next("unit", u);
    ag_[size_t(u)] = comm_.all_gather(comm_ptr(full + part_.unit_shard_begin(u)), comm_ptr(full), part_.unit_shard_numel(u));
    if (!part_.config().overlap) comm_.wait(ag_[size_t(u)]);  // the naive path: waited on the spot
  }
  // Only handles still to wait count: a backend may finish a collective on the spot and hand back
  // an empty handle (the staged CUDA path at one rank).
  pending_ = 0;
  if (part_.config().overlap)
    for (const CommHandle& h : ag_) pending_ += h.valid() ? 1 : 0;
  if (!pending_) ag_.clear();
}

template <class Ops>
void ParamGatherer<Ops>::wait_unit(int u) {
  if (!params_pending() || !ag_[size_t(u)].valid()) return;  // nothing in flight for u
  comm_.wait(ag_[size_t(u)]);
  ag_[size_t(u)] = CommHandle{};
  --pending_;
}

template <class Ops>
void ParamGatherer<Ops>::wait_all() {
  for (int u = 0; params_pending() && u < int(ag_.size()); ++u) wait_unit(u);
  // A lookup prepared for the next forward: its collectives complete here too (nothing may be in
  // flight at a checkpoint or the end of the run); its rows stay for lookup_finish.
  if (lk_stage_ == LookupStage::ids) lookup_start_rows();
  if (lk_stage_ == LookupStage::rows) {
    comm_.wait(lk_h_);
    lk_h_ = CommHandle{};
  }
}

template <class Ops>
void ParamGatherer<Ops>::lookup_rows(const int* tokens, int B, int Tn, T* encoded) {
  lookup_begin(tokens, B, Tn);
  lookup_start_rows();
  lookup_finish(encoded);
}

template <class Ops>
void ParamGatherer<Ops>::lookup_begin(const int* tokens, int B, int Tn) {
  if constexpr (Ops::tier == Tier::host) {
    ZT_ASSERT(lk_stage_ == LookupStage::idle);
    const size_t C = size_t(layout_.config().C), slice = part_.lookup_numel(), max_tokens = slice / (C + 1);
    const size_t N = size_t(part_.config().world), rank = size_t(part_.config().rank), n = size_t(B) * size_t(Tn);
    ZT_ASSERT(n <= max_tokens);
    T* rows = store_.get<T>(StateId::lookup_exchange);  // (N, max_tokens, C), then (N, max_tokens) ids
    int32_t* ids = reinterpret_cast<int32_t*>(rows + N * max_tokens * C);
    int32_t* mine = ids + rank * max_tokens;
    std::memcpy(mine, tokens, n * sizeof(int32_t));
    for (size_t i = n; i < max_tokens; ++i) mine[i] = -1;
    // Every rank's token ids (an all-gather only moves bytes: int32 in float slots).
    if (tr_) tr_->tag_next("lookup", 1);
    lk_h_ = comm_.all_gather(comm_ptr(reinterpret_cast<T*>(mine)), comm_ptr(reinterpret_cast<T*>(ids)), max_tokens);
    lk_B_ = B, lk_T_ = Tn, lk_stage_ = LookupStage::ids;
  } else {
    (void)tokens, (void)B, (void)Tn;
    ZT_ASSERT(false);  // Partition::lookup_numel() is 0 for device backends
  }
}

template <class Ops>
void ParamGatherer<Ops>::lookup_start_rows() {
  if constexpr (Ops::tier == Tier::host) {
    ZT_ASSERT(lk_stage_ == LookupStage::ids);
    const size_t C = size_t(layout_.config().C), slice = part_.lookup_numel(), max_tokens = slice / (C + 1);
    const size_t N = size_t(part_.config().world), rank = size_t(part_.config().rank);
    T* rows = store_.get<T>(StateId::lookup_exchange);
    const int32_t* ids = reinterpret_cast<const int32_t*>(rows + N * max_tokens * C);
    comm_.wait(lk_h_);
    // Each rank writes, for every rank's positions, the parts of wte[token] and wpe[t] in its own
    // (updated) shard, zero elsewhere; the reduce-scatter's sum is then exactly encoder_forward's
    // wte + wpe (each element has one owner; adding zeros is exact).
    const T* P = store_.get<T>(StateId::params) + layout_.units()[0].offset;
    const size_t lo = part_.unit_shard_begin(0), hi = lo + part_.unit_shard_numel(0);
    const size_t wpe = layout_.slot(ParamId::wpe).offset - layout_.units()[0].offset;
    for (size_t r = 0; r < N; ++r)
      for (size_t i = 0; i < max_tokens; ++i) {
        T* out = rows + (r * max_tokens + i) * C;
        const int32_t tk = ids[r * max_tokens + i];
        if (tk < 0) {
          std::memset(out, 0, C * sizeof(T));
          continue;
        }
        const size_t w = size_t(tk) * C, p = wpe + (i % size_t(lk_T_)) * C;
        for (size_t c = 0; c < C; ++c) {
          const bool ow = w + c >= lo && w + c < hi, op = p + c >= lo && p + c < hi;
          out[c] = ow && op ? P[w + c] + P[p + c] : ow ? P[w + c] : op ? P[p + c] : T(0);
        }
      }
    T* recv = rows + rank * max_tokens * C;
    if (tr_) tr_->tag_next("lookup", 1);
    lk_h_ = comm_.reduce_scatter(comm_ptr(rows), comm_ptr(recv), max_tokens * C);
    lk_stage_ = LookupStage::rows;
  } else {
    ZT_ASSERT(false);
  }
}

template <class Ops>
void ParamGatherer<Ops>::lookup_finish(T* encoded) {
  if constexpr (Ops::tier == Tier::host) {
    if (lk_stage_ == LookupStage::ids) lookup_start_rows();
    ZT_ASSERT(lk_stage_ == LookupStage::rows);
    const size_t C = size_t(layout_.config().C), max_tokens = part_.lookup_numel() / (C + 1);
    const size_t rank = size_t(part_.config().rank), n = size_t(lk_B_) * size_t(lk_T_);
    comm_.wait(lk_h_);
    lk_h_ = CommHandle{};
    std::memcpy(encoded, store_.get<T>(StateId::lookup_exchange) + rank * max_tokens * C, n * C * sizeof(T));
    lk_stage_ = LookupStage::idle;
  } else {
    (void)encoded;
    ZT_ASSERT(false);
  }
}

template <class Ops>
const typename ParamGatherer<Ops>::T* ParamGatherer<Ops>::whole_unit(int u) {
  if (rules_.full_params) {
    wait_all();
    return store_.get<T>(StateId::params) + layout_.units()[size_t(u)].offset;
  }
  ZT_ASSERT(slots_[0].unit < 0);  // between passes every slot is free
  const T* src = store_.get<T>(StateId::param_shard) + part_.unit_shard_flat(u);
  if (pfile_) {
    src = read_shard(u, slots_[0].rbuf, 0);
    ring_->wait(0);
  }
  CommHandle h = gather(u, src, slots_[0].buf);
  comm_.wait(h);
  return slots_[0].buf;
}

template class ParamGatherer<CpuOps<float>>;
#if ZT_HAVE_CUDA
template class ParamGatherer<CudaOps<float>>;
template class ParamGatherer<CudaOps<bf16>>;
#endif

}  // namespace zt
