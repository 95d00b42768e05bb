#include "zero/grad_reducer.h"

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
GradReducer<Ops>::GradReducer(GPT<Ops>& model, const Partition& part, StateStore& store, Comm& comm)
    : model_(model), layout_(model.layout()), part_(part), store_(store), comm_(comm), rules_(part.rules()) {
  exchange_ = store.get<T>(StateId::lookup_exchange);
  if (!rules_.staged_grads) return;
  // Carve the staging and receive buffers into slots: bucket slots first, the embedding's last.
  const size_t slot = part.staging_slot_numel(), N = size_t(part.config().world);
  T* staging = store.get<T>(StateId::bucket_staging);
  T* recv = store.get<T>(StateId::rs_receive);
  for (size_t i = 0; i < part.staging_slots(); ++i) {
    StagingSlot s;
    s.buf = staging + i * slot;
    s.recv = recv + i * (slot / N);
    slots_.push_back(s);
  }
  slot_of_bucket_.assign(part.buckets().size(), nullptr);
  if ((gfile_ = store.file(StateId::grad_shard))) {
    ZT_ASSERT(Ops::tier == Tier::host && sizeof(T) == 4);
    gbuf_ = store.get<T>(StateId::param_io) + param_io_offset(part, part.gather_slots());
    unit_ss_.assign(size_t(layout_.num_units()), 0.0);
  }
  if (part.embedding_staging_numel() == 0) return;  // the embedding's chunks use the bucket slots
  s0_.buf = store.get<T>(StateId::embedding_staging);
  s0_.recv = recv + part.staging_slots() * (slot / N);
  s0_.bucket = int(part.buckets().size()) - 1;  // a one-unit embedding's own bucket is the last
  slot_of_bucket_.back() = &s0_;
}

template <class Ops>
void GradReducer<Ops>::begin_step() {
  if (rules_.full_grads) model_.zero_grad();
  // (A gradient shard on disk is overwritten by each bucket's first micro-step instead.)
  if (T* shard = store_.get<T>(StateId::grad_shard)) Ops::zero(shard, part_.shard_total());
}

template <class Ops>
typename GradReducer<Ops>::StagingSlot* GradReducer<Ops>::take_slot() {
  // A free slot, or the one taken longest ago (it may hold a bucket of the previous micro-step):
  // slots are used round-robin.
  for (StagingSlot& s : slots_)
    if (s.bucket < 0) return &s;
  StagingSlot* slot = &*std::min_element(slots_.begin(), slots_.end(),
                                         [](const StagingSlot& a, const StagingSlot& c) { return a.taken < c.taken; });
  complete(*slot);
  return slot;
}

template <class Ops>
void GradReducer<Ops>::before_grads(int u) {
  if (!rules_.staged_grads) return;
  // Point the unit's gradients at a staging slot and zero it (no full gradient buffer).
  if (u == 0 && s0_.buf) {
    complete(s0_);
    Ops::zero(s0_.buf, part_.unit_padded(0));
    model_.set_unit_grads(0, s0_.buf);
    return;
  }
  const int b = part_.bucket_of(u);
  const Bucket& bk = part_.buckets()[size_t(b)];
  if (bk.units.front() != u) return;  // slot already assigned when the bucket's first unit started
  StagingSlot* slot = take_slot();
  slot->bucket = b;
  slot->taken = ++slots_taken_;
  slot_of_bucket_[size_t(b)] = slot;
  Ops::zero(slot->buf, bk.numel);
  for (int v : bk.units) model_.set_unit_grads(v, slot->buf + (layout_.units()[size_t(v)].offset - bk.offset));
}

template <class Ops>
void GradReducer<Ops>::grads_ready(int u) {
  const int b = part_.bucket_of(u);
  if (part_.buckets()[size_t(b)].units.back() != u) {  // the bucket is not complete yet
    comm_.test(CommHandle{});  // progress what is in flight
    return;
  }
  const bool last_micro = micro_ == part_.config().grad_accum - 1;
  if (rules_.full_grads && !last_micro) return;  // accumulate locally; communicate once per step
  launch(b);
}

template <class Ops>
void GradReducer<Ops>::launch(int b) {
  const Bucket& bk = part_.buckets()[size_t(b)];
  const bool overlap = part_.config().overlap;
  T* shard = store_.get<T>(StateId::grad_shard);
  if (rules_.full_grads) {
    T* grads = store_.get<T>(StateId::grads);
    if (!rules_.optimizer_sharded) {  // stage 0
      if (part_.config().world == 1) return;  // a world of one has nothing to reduce
      tag(b, -1);
      inflight_.push_back(comm_.all_reduce(comm_ptr(grads + bk.offset), bk.numel));
    } else {  // stage 1
      for (int v : bk.units) {
        tag(b, v);
        inflight_.push_back(comm_.reduce_scatter(comm_ptr(grads + layout_.units()[size_t(v)].offset),
                                                 comm_ptr(shard + part_.unit_shard_flat(v)), part_.unit_shard_numel(v)));
      }
    }
    if (!overlap) comm_.wait_all(inflight_);
    return;
  }
  StagingSlot* slot = slot_of_bucket_[size_t(b)];
  ZT_ASSERT(slot && slot->bucket == b && slot->hs.empty());
  slot->micro = micro_;
  const int lowest = bk.units.back();
  for (int v : bk.units) {
    const size_t in_bucket = layout_.units()[size_t(v)].offset - bk.offset;
    const size_t in_recv = part_.unit_shard_flat(v) - part_.unit_shard_flat(lowest);
    tag(b, v);
    slot->hs.push_back(
        comm_.reduce_scatter(comm_ptr(slot->buf + in_bucket), comm_ptr(slot->recv + in_recv), part_.unit_shard_numel(v)));
  }
  if (!overlap) complete(*slot);
}

template <class Ops>
void GradReducer<Ops>::complete(StagingSlot& s) {
  if (s.bucket < 0 || s.hs.empty()) {
    if (&s != &s0_) s.bucket = -1;
    return;
  }
  comm_.wait_all(s.hs);
  const Bucket& bk = part_.buckets()[size_t(s.bucket)];
  if (gfile_) {
    add_to_file(bk, s.recv, s.micro);
    if (&s != &s0_) s.bucket = -1;
    return;
  }
  T* shard = store_.get<T>(StateId::grad_shard) + part_.unit_shard_flat(bk.units.back());
  Ops::residual_forward(shard, shard, s.recv, bk.shard_numel);  // shard += recv, in the backend's memory
  if (&s != &s0_) s.bucket = -1;
}

template <class Ops>
bool GradReducer<Ops>::defer_lookup(int micro) const {
  return part_.lookup_numel() > 0 && (rules_.staged_grads || micro == part_.config().grad_accum - 1);
}

template <class Ops>
void GradReducer<Ops>::lookup_deferred() {
  if constexpr (Ops::tier == Tier::host) {
    const int C = layout_.config().C;
    const size_t slice = part_.lookup_numel(), max_tokens = slice / size_t(C + 1);
    lookup_B_ = model_.last_batch();
    lookup_T_ = model_.last_seq_len();
    const size_t n = size_t(lookup_B_) * size_t(lookup_T_);
    ZT_ASSERT(n <= max_tokens && exchange_);
    // My slice: the gradient of the embedding's output, then the token ids as int32 bits (an
    // all-gather only moves bytes); positions past this micro-step's are marked -1.
    T* mine = exchange_ + size_t(part_.config().rank) * slice;
    std::memcpy(mine, model_.lookup_grad_out(), n * size_t(C) * sizeof(T));
    int32_t* ids = reinterpret_cast<int32_t*>(mine + max_tokens * size_t(C));
    std::memcpy(ids, model_.lookup_inputs(), n * sizeof(int32_t));
    for (size_t i = n; i < max_tokens; ++i) ids[i] = -1;
    if (tr_) tr_->tag_next("lookup", 1);
    CommHandle h = comm_.all_gather(comm_ptr(mine), comm_ptr(exchange_), slice);
    comm_.wait(h);
    if (rules_.full_grads) {  // stages 0-1: added once the embedding's reduction is done (finish)
      lookup_pending_ = true;
      return;
    }
    // Stage 2: the embedding's reduce-scatter (started at the top of backward) into my shard first.
    complete(s0_);
    add_lookup(store_.get<T>(StateId::grad_shard) + part_.unit_shard_flat(0), part_.unit_shard_begin(0),
               part_.unit_shard_begin(0) + part_.unit_shard_numel(0));
  } else {
    ZT_ASSERT(false);  // Partition::lookup_numel() is 0 for device backends
  }
}

template <class Ops>
void GradReducer<Ops>::add_lookup(T* dst, size_t lo, size_t hi) const {
  if constexpr (Ops::tier == Tier::host) {
    const size_t C = size_t(layout_.config().C), slice = part_.lookup_numel(), max_tokens = slice / (C + 1);
    const size_t wpe = layout_.slot(ParamId::wpe).offset - layout_.units()[0].offset;  // within the unit
    const size_t n = size_t(lookup_B_) * size_t(lookup_T_);
    auto add_row = [&](size_t at, const T* g) {  // unit elements [at, at + C) += g, clipped to [lo, hi)
      const size_t a = std::max(at, lo), b = std::min(at + C, hi);
      for (size_t x = a; x < b; ++x) dst[x - lo] += g[x - at];
    };
    for (int r = 0; r < part_.config().world; ++r) {
      const T* slice_r = exchange_ + size_t(r) * slice;
      const int32_t* ids = reinterpret_cast<const int32_t*>(slice_r + max_tokens * C);
      for (size_t i = 0; i < n; ++i) {
        if (ids[i] < 0) continue;
        const T* g = slice_r + i * C;
        add_row(size_t(ids[i]) * C, g);                          // wte[token]
        add_row(wpe + (i % size_t(lookup_T_)) * C, g);           // wpe[position]
      }
    }
  } else {
    (void)dst, (void)lo, (void)hi;
    ZT_ASSERT(false);
  }
}

template <class Ops>
void GradReducer<Ops>::add_to_file(const Bucket& bk, const T* recv, int micro) {
  // The bucket's shard is one flat range; the blocks around it may hold its neighbours' shards.
  constexpr size_t kBlock = offload::kIoAlign;
  const size_t flat0 = part_.unit_shard_flat(bk.units.back()), n = bk.shard_numel;
  const size_t off = flat0 * sizeof(T), a0 = off / kBlock * kBlock, a1 = offload::io_round_up(off + n * sizeof(T));
  // data sits at the same address modulo the block as in a shard in memory, so sum_squares reads
  // it in the same vector lanes (the norm is bit for bit that of the in-memory run).
  T* data = gbuf_ + (off - a0) / sizeof(T);
  if (micro == 0) {
    // shard = 0 + recv, exactly what the in-memory run computes (begin_step zeroed it).
    gfile_->read_blocks(gbuf_, kBlock, a0);
    if (a1 - kBlock > a0) gfile_->read_blocks(reinterpret_cast<unsigned char*>(gbuf_) + (a1 - kBlock - a0), kBlock, a1 - kBlock);
    Ops::zero(data, n);
  } else {
    gfile_->read_blocks(gbuf_, a1 - a0, a0);
  }
  Ops::residual_forward(data, data, recv, n);  // shard += recv
  if (micro == part_.config().grad_accum - 1)
    for (int v : bk.units)
      unit_ss_[size_t(v)] = Ops::sum_squares(data + (part_.unit_shard_flat(v) - flat0), part_.unit_shard_numel(v));
  gfile_->write_blocks(gbuf_, a1 - a0, a0);
}

template <class Ops>
void GradReducer<Ops>::finish() {
  if (!rules_.staged_grads) {
    comm_.wait_all(inflight_);
    if (lookup_pending_) {
      lookup_pending_ = false;
      if (!rules_.optimizer_sharded) add_lookup(store_.get<T>(StateId::grads) + layout_.units()[0].offset, 0, part_.unit_padded(0));
      else
        add_lookup(store_.get<T>(StateId::grad_shard) + part_.unit_shard_flat(0), part_.unit_shard_begin(0),
                   part_.unit_shard_begin(0) + part_.unit_shard_numel(0));
    }
    return;
  }
  for (StagingSlot& s : slots_) complete(s);
  if (s0_.buf) complete(s0_);
}

template class GradReducer<CpuOps<float>>;
#if ZT_HAVE_CUDA
template class GradReducer<CudaOps<float>>;
template class GradReducer<CudaOps<bf16>>;
#endif

}  // namespace zt
