#include "zero/param_shard_source.h"

#include "backend/ops_cpu.h"
#if ZT_HAVE_CUDA
#include "backend/ops_cuda.h"
#endif

namespace zt {

template <class Ops>
struct ParamShardSource<Ops>::CopyStream {
#if ZT_HAVE_CUDA
  cudaStream_t stream = nullptr;
  cudaEvent_t mark = nullptr;       // the compute stream's progress when a copy is queued
  std::vector<cudaEvent_t> ready;   // per slot: its shard is on the device
  explicit CopyStream(size_t slots) : ready(slots) {
    ZT_CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    ZT_CHECK_CUDA(cudaEventCreateWithFlags(&mark, cudaEventDisableTiming));
    for (cudaEvent_t& e : ready) ZT_CHECK_CUDA(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  }
  ~CopyStream() {
    (void)cudaStreamSynchronize(stream);
    for (cudaEvent_t e : ready) (void)cudaEventDestroy(e);
    (void)cudaEventDestroy(mark);
    (void)cudaStreamDestroy(stream);
  }
#endif
};

template <class Ops>
ParamShardSource<Ops>::ParamShardSource(const ParamLayout& layout, const Partition& part, StateStore& store,
                                        std::vector<T*> slots, Launch launch)
    : part_(part), store_(store), slots_(std::move(slots)), unit_of_(slots_.size(), -1) {
  std::vector<typename offload::ShardSource<T>::Range> units;
  for (int u = 0; u < layout.num_units(); ++u) units.push_back({part.unit_shard_flat(u), part.unit_shard_numel(u)});
  if (offload::SwapFile* file = store.file(StateId::param_shard)) {
    std::vector<T*> reads;  // one read buffer per slot
    for (size_t i = 0; i < slots_.size(); ++i) reads.push_back(store.get<T>(StateId::param_io) + param_io_offset(part, i));
    shards_ = offload::ShardSource<T>(file, std::move(units), std::move(reads), store.swap_spec().queue_depth);
    read_to_device_ = Ops::tier == Tier::device;  // the CUDA backend: a read goes on to the device
  } else if (store.info(StateId::param_shard).tier == Tier::pinned) {
    use_copy_stream();
  } else {
    shards_ = offload::ShardSource<T>(store.get<T>(StateId::param_shard), std::move(units));
  }
#if ZT_HAVE_CUDA
  if (read_to_device_) copies_ = std::make_unique<CopyStream>(slots_.size());
#endif
  arrived_ = [this, launch = std::move(launch)](int slot, const T* shard) {
    launch(slot, read_to_device_ ? to_device(slot, unit_of_[size_t(slot)], shard) : shard);
  };
}

template <class Ops>
ParamShardSource<Ops>::~ParamShardSource() = default;

template <class Ops>
void ParamShardSource<Ops>::request(int u, int slot) {
  unit_of_[size_t(slot)] = u;
#if ZT_HAVE_CUDA
  // The read buffer's previous shard must have left for the device before the read overwrites it.
  if (read_to_device_) ZT_CHECK_CUDA(cudaEventSynchronize(copies_->ready[size_t(slot)]));
#endif
  shards_.request(u, slot, arrived_);  // in memory: the all-gather starts now
}

template <class Ops>
void ParamShardSource<Ops>::deliver(int through) {
  shards_.deliver(through, arrived_);
}

template <class Ops>
const typename ParamShardSource<Ops>::T* ParamShardSource<Ops>::now(int u, int slot) {
  const T* shard = shards_.now(u, slot);
  return read_to_device_ ? to_device(slot, u, shard) : shard;
}

// nvme on the CUDA backend: unit u's shard, read into slot i's pinned read buffer, is copied on the
// copy stream into the slot's upload buffer (a world of one: the slot itself), after what the
// compute stream has queued (the buffer's previous contents may still be read); the compute stream
// is ordered after the copy. The read buffer is not read into again before this copy is done
// (request()).
template <class Ops>
const typename ParamShardSource<Ops>::T* ParamShardSource<Ops>::to_device(int i, int u, const T* shard) {
#if ZT_HAVE_CUDA
  if constexpr (Ops::tier == Tier::device) {
    CopyStream& cs = *copies_;
    T* upload = store_.get<T>(StateId::param_upload);
    T* dst = upload ? upload + param_upload_offset(part_, size_t(i)) : slots_[size_t(i)];
    ZT_CHECK_CUDA(cudaEventRecord(cs.mark, Ops::stream()));
    ZT_CHECK_CUDA(cudaStreamWaitEvent(cs.stream, cs.mark, 0));
    ZT_CHECK_CUDA(cudaMemcpyAsync(dst, shard, part_.unit_shard_numel(u) * sizeof(T), cudaMemcpyHostToDevice, cs.stream));
    ZT_CHECK_CUDA(cudaEventRecord(cs.ready[size_t(i)], cs.stream));
    ZT_CHECK_CUDA(cudaStreamWaitEvent(Ops::stream(), cs.ready[size_t(i)], 0));
    return dst;
  }
#endif
  (void)i, (void)u;
  ZT_ASSERT(false);  // only the CUDA backend copies a read on to the device
  return shard;
}

template <class Ops>
void ParamShardSource<Ops>::use_copy_stream() {
#if ZT_HAVE_CUDA
  if constexpr (Ops::tier == Tier::device) {
    copies_ = std::make_unique<CopyStream>(slots_.size());
    typename offload::ShardSource<T>::Copier c;
    c.queue = [this](int u, int i) -> const T* {
      CopyStream& cs = *copies_;
      const T* src = store_.get<T>(StateId::param_shard) + part_.unit_shard_flat(u);
      const size_t bytes = part_.unit_shard_numel(u) * sizeof(T);
      // A world of one has no all-gather: the shard is the unit, copied into its slot itself.
      T* upload = store_.get<T>(StateId::param_upload);
      T* dst = upload ? upload + param_upload_offset(part_, size_t(i)) : slots_[size_t(i)];
      // The buffer's previous contents may still be read by what the compute stream has queued: an
      // all-gather it waits for, or (a world of one) the kernels of the slot's previous unit, whose
      // last use was queued before its release, hence before this copy.
      ZT_CHECK_CUDA(cudaEventRecord(cs.mark, Ops::stream()));
      ZT_CHECK_CUDA(cudaStreamWaitEvent(cs.stream, cs.mark, 0));
      ZT_CHECK_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, cs.stream));
      ZT_CHECK_CUDA(cudaEventRecord(cs.ready[size_t(i)], cs.stream));
      return dst;
    };
    c.wait = [this](int i) { ZT_CHECK_CUDA(cudaStreamWaitEvent(Ops::stream(), copies_->ready[size_t(i)], 0)); };
    shards_ = offload::ShardSource<T>(std::move(c), slots_.size());
    return;
  }
#endif
  ZT_ASSERT(false);  // only the CUDA backend keeps the shard in pinned memory
}

template class ParamShardSource<CpuOps<float>>;
#if ZT_HAVE_CUDA
template class ParamShardSource<CudaOps<float>>;
template class ParamShardSource<CudaOps<bf16>>;
#endif

}  // namespace zt
