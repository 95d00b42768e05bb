#include "zero/grad_reducer.h"

#include <algorithm>

#include "backend/ops_cpu.h"
#if ZT_HAVE_CUDA
#include "backend/ops_cuda.h"
#endif
#include "zero/comm_ptr.h"

namespace zt {

template <class Ops>
GradReducer<Ops>::GradReducer(GPT<Ops>& model, const Partition& part, StateStore& store, Comm& comm,
                              EmbeddingExchange<Ops>& lookup)
    : model_(model), layout_(model.layout()), part_(part), store_(store), comm_(comm), rules_(part.rules()),
      lookup_(lookup) {
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
  if (offload::SwapFile* file = store.file(StateId::grad_shard)) {
    // Through param_io's gradient buffer (a bucket's shard, in whole blocks) and the optimizer
    // pipeline's pool, idle until finish(): a bucket's write-back overlaps the next one's backward
    // where the pool holds its blocks, without memory of its own.
    const StateBuffer& io = store.info(StateId::param_io);
    const StateBuffer& pool = store.info(StateId::swap_buffers);
    const size_t grad_at = param_io_offset(part, part.gather_slots());
    // (The pool holds the optimizer state's fp32 elements; as bytes it serves a bf16 gradient alike.)
    shard_ = offload::ShardSource<T>(file, {}, {store.get<T>(StateId::param_io) + grad_at, static_cast<T*>(store.raw(StateId::swap_buffers))},
                                     store.swap().queue_depth, {(io.numel - grad_at) * sizeof(T), pool.bytes()});
    unit_ss_.assign(size_t(layout_.num_units()), 0.0);
  } else {
    shard_ = offload::ShardSource<T>(store.get<T>(StateId::grad_shard), {});
  }
  host_shard_ = store.info(StateId::grad_shard).tier == Tier::pinned;
  if (host_shard_) unit_ss_.assign(size_t(layout_.num_units()), 0.0);
  if (part.embedding_staging_numel() == 0) return;  // the embedding's chunks use the bucket slots
  s0_.buf = store.get<T>(StateId::embedding_staging);
  s0_.recv = recv + part.staging_slots() * (slot / N);
  s0_.bucket = int(part.buckets().size()) - 1;  // a one-unit embedding's own bucket is the last
  slot_of_bucket_.back() = &s0_;
}

template <class Ops>
void GradReducer<Ops>::begin_step(bool full_grads_zero) {
  if (rules_.full_grads && !full_grads_zero) model_.zero_grad();
  // (A gradient shard on disk or in host memory is overwritten by each bucket's first micro-step instead.)
  if (T* shard = store_.get<T>(StateId::grad_shard); shard && !host_shard_) Ops::zero(shard, part_.shard_total());
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
  // The add below reads the result on the compute stream: it waits for it there (NCCL), the host
  // goes on; begin_pass / finish wait for it on the host. A shard on disk is added by the host, one
  // in pinned host memory has its squares summed for the host; the naive path waits on the spot.
  if (shard_.on_disk() || host_shard_ || !part_.config().overlap) {
    comm_.wait_all(s.hs);
  } else {
    for (CommHandle h : s.hs) comm_.order_compute_after(h);
    ordered_.insert(ordered_.end(), s.hs.begin(), s.hs.end());
    s.hs.clear();
  }
  const Bucket& bk = part_.buckets()[size_t(s.bucket)];
  // My gradient shard += the bucket's reduce-scatter result (the first micro-step of a shard on
  // disk adds to zeros: begin_step zeroed the one in memory). A shard on disk sums each unit's
  // squares on the last micro-step, while the values are in memory, for the gradient norm.
  const size_t flat0 = part_.unit_shard_flat(bk.units.back());
  const bool last_micro = s.micro == part_.config().grad_accum - 1;
  if (host_shard_) add_to_host(s, flat0, last_micro, store_.get<T>(StateId::grad_shard) + flat0, false);
  else shard_.accumulate(flat0, bk.shard_numel, s.micro == 0, [&](T* shard) {
    // The CUDA backend's shard on disk: summed on the device, back in the read buffer before it is written.
    if (Ops::tier == Tier::device && shard_.on_disk()) return add_to_host(s, flat0, last_micro, shard, true);
    Ops::residual_forward(shard, shard, s.recv, bk.shard_numel);  // in the backend's memory
    if (shard_.on_disk() && last_micro)
      for (int v : bk.units)
        unit_ss_[size_t(v)] = Ops::sum_squares(shard + (part_.unit_shard_flat(v) - flat0), part_.unit_shard_numel(v));
  });
  if (last_micro && on_final_) on_final_(bk.units);
  if (&s != &s0_) s.bucket = -1;
}

template <class Ops>
void GradReducer<Ops>::complete_arrived() {
  for (;;) {
    StagingSlot* oldest = nullptr;
    for (StagingSlot& s : slots_)
      if (s.bucket >= 0 && !s.hs.empty() && (!oldest || s.taken < oldest->taken)) oldest = &s;
    if (!oldest) return;
    for (CommHandle h : oldest->hs)
      if (!comm_.test(h)) return;
    complete(*oldest);
  }
}

template <class Ops>
void GradReducer<Ops>::add_to_host(const StagingSlot& s, size_t flat0, bool last_micro, T* host, bool sync) {
#if ZT_HAVE_CUDA
  if constexpr (Ops::tier == Tier::device) {
    // The same sum as in device memory (zeros, or the shard so far, + the result), by the same
    // kernel, in the slot its reduce-scatter has finished reading; copies on the compute stream,
    // so the slot is reused in order. sync: the host reads `host` next (to write it to disk).
    const Bucket& bk = part_.buckets()[size_t(s.bucket)];
    T* sum = s.buf;
    const size_t bytes = bk.shard_numel * sizeof(T);
    if (s.micro == 0) Ops::zero(sum, bk.shard_numel);
    else ZT_CHECK_CUDA(cudaMemcpyAsync(sum, host, bytes, cudaMemcpyHostToDevice, Ops::stream()));
    Ops::residual_forward(sum, sum, s.recv, bk.shard_numel);
    if (last_micro)
      for (int v : bk.units)
        unit_ss_[size_t(v)] = Ops::sum_squares(sum + (part_.unit_shard_flat(v) - flat0), part_.unit_shard_numel(v));
    ZT_CHECK_CUDA(cudaMemcpyAsync(host, sum, bytes, cudaMemcpyDeviceToHost, Ops::stream()));
    if (sync) ZT_CHECK_CUDA(cudaStreamSynchronize(Ops::stream()));
    return;
  }
#endif
  (void)s, (void)flat0, (void)last_micro, (void)host, (void)sync;
  ZT_ASSERT(false);  // only the CUDA backend keeps the shard in pinned memory
}

template <class Ops>
void GradReducer<Ops>::lookup_deferred() {
  lookup_.gather_gradient();
  if (rules_.full_grads) {  // stages 0-1: added once the embedding's reduction is done (finish)
    lookup_pending_ = true;
    return;
  }
  // Stage 2: the embedding's reduce-scatter (started at the top of backward) into my shard first.
  complete(s0_);
  lookup_.add_gradient(store_.get<T>(StateId::grad_shard) + part_.unit_shard_flat(0), part_.unit_shard_begin(0),
                       part_.unit_shard_begin(0) + part_.unit_shard_numel(0));
}

template <class Ops>
void GradReducer<Ops>::finish() {
  if (!rules_.staged_grads) {
    comm_.wait_all(inflight_);
    if (lookup_pending_) {
      lookup_pending_ = false;
      if (!rules_.optimizer_sharded)
        lookup_.add_gradient(store_.get<T>(StateId::grads) + layout_.units()[0].offset, 0, part_.unit_padded(0));
      else
        lookup_.add_gradient(store_.get<T>(StateId::grad_shard) + part_.unit_shard_flat(0), part_.unit_shard_begin(0),
                             part_.unit_shard_begin(0) + part_.unit_shard_numel(0));
    }
    return;
  }
  for (StagingSlot& s : slots_) complete(s);
  if (s0_.buf) complete(s0_);
  shard_.flush();  // the optimizer reads the gradient shard next
  comm_.wait_all(ordered_);
}

template class GradReducer<CpuOps<float>>;
#if ZT_HAVE_CUDA
template class GradReducer<CudaOps<float>>;
template class GradReducer<CudaOps<bf16>>;
#endif

}  // namespace zt
