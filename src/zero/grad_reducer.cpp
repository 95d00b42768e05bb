#include "zero/grad_reducer.h"

#include <algorithm>
#include <utility>

#include "backend/ops_cpu.h"
#if ZT_HAVE_CUDA
#include "backend/ops_cuda.h"
#endif
#include "comm/comm_ptr.h"

namespace zt {

template <class Ops>
GradReducer<Ops>::GradReducer(GPT<Ops>& model, const Partition& part, StateStore& store, Comm& comm, Comm* replicas)
    : model_(model), layout_(model.layout()), part_(part), store_(store), comm_(comm), replicas_(replicas),
      rules_(part.rules()) {
  ZT_ASSERT((replicas != nullptr) == (part.config().replicas > 1));
  ZT_ASSERT(!replicas || replicas->world() == part.config().replicas);
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
  shard_ = std::make_unique<GradShardSink<Ops>>(layout_, part, store);
  if (part.embedding_staging_numel() == 0) return;  // the embedding's chunks use the bucket slots
  s0_.buf = store.get<T>(StateId::embedding_staging);
  s0_.recv = recv + part.staging_slots() * (slot / N);
  s0_.bucket = int(part.buckets().size()) - 1;  // a one-unit embedding's own bucket is the last
  slot_of_bucket_.back() = &s0_;
}

template <class Ops>
void GradReducer<Ops>::begin_step(bool full_grads_zero) {
  if (rules_.full_grads && !full_grads_zero) model_.zero_grad();
  if (shard_) shard_->begin_step();  // stages 2-3: wherever the shard lives
  else if (T* shard = store_.get<T>(StateId::grad_shard)) Ops::zero(shard, part_.shard_total());
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
    if (replicas_) replicas_->test(CommHandle{});
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
  // The add below reads the result on the compute stream: it waits for it there (NCCL), the host
  // goes on; begin_pass / finish wait for it on the host. A shard on disk is added by the host, one
  // in pinned host memory has its squares summed for the host; the naive path waits on the spot.
  if (shard_->host_reads() || !part_.config().overlap) {
    comm_.wait_all(s.hs);
  } else {
    for (CommHandle h : s.hs) comm_.order_compute_after(h);
    ordered_.insert(ordered_.end(), s.hs.begin(), s.hs.end());
    s.hs.clear();
  }
  // My gradient shard += the bucket's reduce-scatter result, wherever the shard lives.
  shard_->add(s.bucket, s.buf, s.recv, s.micro);
  if (s.micro == part_.config().grad_accum - 1) shard_final(s.bucket);
  if (&s != &s0_) s.bucket = -1;
}

template <class Ops>
void GradReducer<Ops>::shard_final(int b) {
  if (!replicas_) {
    if (on_final_) on_final_(part_.buckets()[size_t(b)].units);
    return;
  }
  // The other replicas' sums of the same shard: the collective follows the add above on the
  // compute stream (comm.h), and the shard is final when it is done.
  const auto [off, n] = part_.replica_all_reduces()[size_t(b)];
  tag(b, -1);
  replica_sums_.push_back({replicas_->all_reduce(comm_ptr(store_.get<T>(StateId::grad_shard) + off), n), b});
}

template <class Ops>
bool GradReducer<Ops>::replicas_arrived(bool wait) {
  while (!replica_sums_.empty()) {
    const auto [h, b] = replica_sums_.front();
    if (wait) replicas_->wait(h);
    else if (!replicas_->test(h)) return false;
    replica_sums_.erase(replica_sums_.begin());
    if (on_final_) on_final_(part_.buckets()[size_t(b)].units);
  }
  return true;
}

template <class Ops>
void GradReducer<Ops>::complete_arrived() {
  for (bool arrived = true; arrived;) {
    StagingSlot* oldest = nullptr;
    for (StagingSlot& s : slots_)
      if (s.bucket >= 0 && !s.hs.empty() && (!oldest || s.taken < oldest->taken)) oldest = &s;
    arrived = oldest != nullptr;
    for (size_t i = 0; arrived && i < oldest->hs.size(); ++i) arrived = comm_.test(oldest->hs[i]);
    if (arrived) complete(*oldest);
  }
  if (replicas_) replicas_arrived(false);  // with replicas a shard is final once their sum is done
}

template <class Ops>
void GradReducer<Ops>::add_to_reduced_embedding(EmbeddingAdd add) {
  if (rules_.full_grads) {  // stages 0-1: added once the embedding's reduction is done (finish)
    lookup_add_ = std::move(add);
    return;
  }
  // Stage 2: the embedding's reduce-scatter (started at the top of backward) into my shard first.
  complete(s0_);
  add(store_.get<T>(StateId::grad_shard) + part_.unit_shard_flat(0), part_.unit_shard_begin(0),
      part_.unit_shard_begin(0) + part_.unit_shard_numel(0));
}

template <class Ops>
void GradReducer<Ops>::finish() {
  if (!rules_.staged_grads) {
    comm_.wait_all(inflight_);
    if (replicas_ && rules_.optimizer_sharded) {  // stage 1: the whole shard at once, now complete
      const auto [off, n] = part_.replica_all_reduces().front();
      tag(-1, -1);
      replicas_->wait(replicas_->all_reduce(comm_ptr(store_.get<T>(StateId::grad_shard) + off), n));
    }
    if (lookup_add_) {
      const EmbeddingAdd add = std::move(lookup_add_);
      lookup_add_ = nullptr;
      if (!rules_.optimizer_sharded)
        add(store_.get<T>(StateId::grads) + layout_.units()[0].offset, 0, part_.unit_padded(0));
      else
        add(store_.get<T>(StateId::grad_shard) + part_.unit_shard_flat(0), part_.unit_shard_begin(0),
            part_.unit_shard_begin(0) + part_.unit_shard_numel(0));
    }
    return;
  }
  for (StagingSlot& s : slots_) complete(s);
  if (s0_.buf) complete(s0_);
  shard_->flush();  // the optimizer reads the gradient shard next
  comm_.wait_all(ordered_);
  if (replicas_) replicas_arrived(true);
}

template class GradReducer<CpuOps<float>>;
#if ZT_HAVE_CUDA
template class GradReducer<CudaOps<float>>;
template class GradReducer<CudaOps<bf16>>;
#endif

}  // namespace zt
