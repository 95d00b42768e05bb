#include "zero/grad_shard_sink.h"

#include "backend/ops_cpu.h"
#if ZT_HAVE_CUDA
#include "backend/ops_cuda.h"
#endif

namespace zt {

template <class Ops>
GradShardSink<Ops>::GradShardSink(const ParamLayout& layout, const Partition& part, StateStore& store)
    : layout_(layout), part_(part), store_(store) {
  if (offload::SwapFile* file = store.file(StateId::grad_shard)) {
    // Through param_io's gradient buffer (a bucket's shard, in whole blocks) and the optimizer
    // pipeline's pool, idle until finish(): a bucket's write-back overlaps the next one's backward
    // where the pool holds its blocks, without memory of its own.
    const StateBuffer& io = store.info(StateId::param_io);
    const StateBuffer& pool = store.info(StateId::swap_buffers);
    const size_t grad_at = param_io_offset(part, part.gather_slots());
    // (The pool holds the optimizer state's fp32 elements; as bytes it serves a bf16 gradient alike.)
    std::vector<T*> bufs = {store.get<T>(StateId::param_io) + grad_at, static_cast<T*>(store.raw(StateId::swap_buffers))};
    shard_ = offload::ShardSource<T>(file, {}, std::move(bufs), store.swap_spec().queue_depth,
                                     {(io.numel - grad_at) * sizeof(T), pool.bytes()});
    unit_ss_.assign(size_t(layout.num_units()), GradSquares{});
  } else {
    shard_ = offload::ShardSource<T>(store.get<T>(StateId::grad_shard), {});
  }
  pinned_ = store.info(StateId::grad_shard).tier == Tier::pinned;
  if (pinned_) unit_ss_.assign(size_t(layout.num_units()), GradSquares{});
}

template <class Ops>
void GradShardSink<Ops>::sum_on_device(int b, T* slot, const T* recv, int micro, T* host, bool sync) {
#if ZT_HAVE_CUDA
  if constexpr (Ops::tier == Tier::device) {
    // The same sum as in device memory (zeros, or the shard so far, + the result), by the same
    // kernel, in the slot its reduce-scatter has finished reading; copies on the compute stream,
    // so the slot is reused in order.
    const Bucket& bk = part_.buckets()[size_t(b)];
    const size_t flat0 = part_.unit_shard_flat(bk.units.back());
    const size_t bytes = bk.shard_numel * sizeof(T);
    if (micro == 0) Ops::zero(slot, bk.shard_numel);
    else ZT_CHECK_CUDA(cudaMemcpyAsync(slot, host, bytes, cudaMemcpyHostToDevice, Ops::stream()));
    Ops::residual_forward(slot, slot, recv, bk.shard_numel);
    if (micro == part_.config().grad_accum - 1)
      for (int v : bk.units) unit_ss_[size_t(v)] = unit_squares(v, slot + (part_.unit_shard_flat(v) - flat0));
    ZT_CHECK_CUDA(cudaMemcpyAsync(host, slot, bytes, cudaMemcpyDeviceToHost, Ops::stream()));
    if (sync) ZT_CHECK_CUDA(cudaStreamSynchronize(Ops::stream()));
    return;
  }
#endif
  (void)b, (void)slot, (void)recv, (void)micro, (void)host, (void)sync;
  ZT_ASSERT(false);  // only the CUDA backend keeps the shard in pinned memory
}

template <class Ops>
GradSquares GradShardSink<Ops>::unit_squares(int v, const T* x) const {
  return unit_grad_squares<Ops>(layout_, v, part_.unit_shard_begin(v), part_.unit_shard_numel(v), x,
                                part_.config().tensor > 1);
}

template <class Ops>
void GradShardSink<Ops>::begin_step() {
  if (T* shard = store_.get<T>(StateId::grad_shard); shard && !pinned_) Ops::zero(shard, part_.shard_total());
}

template <class Ops>
void GradShardSink<Ops>::add(int b, T* slot, const T* recv, int micro) {
  const Bucket& bk = part_.buckets()[size_t(b)];
  const size_t flat0 = part_.unit_shard_flat(bk.units.back());
  const bool last_micro = micro == part_.config().grad_accum - 1;
  if (pinned_) return sum_on_device(b, slot, recv, micro, store_.get<T>(StateId::grad_shard) + flat0, false);
  shard_.accumulate(flat0, bk.shard_numel, micro == 0, [&](T* shard) {
    // The CUDA backend's shard on disk: summed on the device, back in the read buffer before it is written.
    if (Ops::tier == Tier::device && shard_.on_disk()) return sum_on_device(b, slot, recv, micro, shard, true);
    Ops::residual_forward(shard, shard, recv, bk.shard_numel);  // in the backend's memory
    if (shard_.on_disk() && last_micro)
      for (int v : bk.units) unit_ss_[size_t(v)] = unit_squares(v, shard + (part_.unit_shard_flat(v) - flat0));
  });
}

template <class Ops>
void GradShardSink<Ops>::flush() {
  shard_.flush();
}

template class GradShardSink<CpuOps<float>>;
#if ZT_HAVE_CUDA
template class GradShardSink<CudaOps<float>>;
template class GradShardSink<CudaOps<bf16>>;
#endif

}  // namespace zt
