#include "zero/engine.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <future>
#include <memory>
#include <type_traits>
#include <vector>

#include "backend/ops_cpu.h"
#if ZT_HAVE_CUDA
#include "backend/ops_cuda.h"
#endif
#include "runtime/error.h"

namespace zt {

template <class Ops>
ZeroEngine<Ops>::ZeroEngine(GPT<Ops>& model, const Partition& part, StateStore& store, Comm& comm,
                            const OptimSection& optim)
    : model_(model), part_(part), store_(store), comm_(comm), rules_(part.rules()),
      lookup_(model, part, store, comm), reducer_(model, part, store, comm, lookup_), gatherer_(model, part, store, comm),
      optimizer_(model.layout(), part, store, comm, optim) {
  ZT_ASSERT(comm.world() == part.config().world && comm.rank() == part.config().rank);
  // Device buffers go only to a comm that takes device buffers of their type (NCCL, or MPI through
  // host staging; zero/comm_ptr.h).
  ZT_ASSERT(comm.device_elem_bytes() == (Ops::tier == Tier::device ? int(sizeof(T)) : 0));
  const ParamLayout& layout = model.layout();
  T* params = store.get<T>(StateId::params);
  T* grads = store.get<T>(StateId::grads);
  for (int u = 0; u < layout.num_units(); ++u) {
    const size_t off = layout.units()[size_t(u)].offset;
    model_.set_unit_params(u, params ? params + off : nullptr);
    model_.set_unit_grads(u, grads ? grads + off : nullptr);
  }
  model_.set_hooks(this);
  // offload.optimizer "cpu" on the CUDA backend: a unit's shards go to the CPU AdamW as soon as its
  // gradient shard is final (zero/host_optimizer.cpp).
  if (optimizer_.host_overlaps())
    reducer_.on_shards_final([this](const std::vector<int>& units) { optimizer_.host_units_final(units); });
  if (optimizer_.updates_in_backward()) {
    // The edge starts at the end of the last unit's shard (the shard's padding beyond is nobody's).
    for (int u = 0; u < model.layout().num_units(); ++u)
      units_end_ = std::max(units_end_, part.unit_shard_flat(u) + part.unit_shard_numel(u));
    reducer_.leave_pool_to_optimizer();
    reducer_.on_shards_final([this](const std::vector<int>& units) {
      FinalRange r{SIZE_MAX, 0, reducer_.shard_writes_queued()};
      for (int u : units) {
        r.lo = std::min(r.lo, part_.unit_shard_flat(u));
        r.hi = std::max(r.hi, part_.unit_shard_flat(u) + part_.unit_shard_numel(u));
      }
      final_ranges_.push_back(r);
    });
  }
}

template <class Ops>
ZeroEngine<Ops>::~ZeroEngine() {
  model_.set_hooks(nullptr);
}

template <class Ops>
void ZeroEngine<Ops>::init_parameters(uint64_t seed, const std::string& llmc_path) {
  if (rules_.full_params) {
    // Every rank computes the same values (counter-based RNG, or the same file).
    if (llmc_path.empty()) model_.init_gpt2(seed);
    else model_.load_llmc(llmc_path);
  } else {
    // Stage 3: my shard's ranges only (StateBuffer::holds), written where the shard keeps them.
    const StateBuffer& shard = store_.info(StateId::param_shard);
    T* dst = store_.get<T>(StateId::param_shard);
    using M = typename Ops::M;
    offload::SwapFile* file = store_.file(StateId::param_shard);  // offload.params nvme: write the file
    // offload.params "cpu" (CUDA backend): the shard is pinned host memory, written in place.
    auto put = [pinned = shard.tier == Tier::pinned](T* to, const M* values, size_t n) {
      if (!pinned) return GPT<Ops>::upload(to, values, n);
      for (size_t i = 0; i < n; ++i) to[i] = T(values[i]);
    };
    // Into the swap file at element `at`: as T (the CUDA backend's bf16, rounded as put() rounds).
    std::vector<T> narrow;
    auto put_file = [&](size_t at, const M* values, size_t n) {
      if constexpr (std::is_same_v<T, M>) {
        file->write_at(values, n * sizeof(M), at * sizeof(T));
      } else {
        narrow.resize(n);
        for (size_t i = 0; i < n; ++i) narrow[i] = T(values[i]);
        file->write_at(narrow.data(), n * sizeof(T), at * sizeof(T));
      }
    };
    if (file && llmc_path.empty()) {
      init_file(seed, *file);
    } else if (llmc_path.empty()) {
      std::vector<M> host;
      for (const TensorRange& r : shard.holds) {
        host.resize(r.count);
        model_.init_gpt2_values(seed, r.tensor, r.offset, r.count, host.data());
        put(dst + r.at, host.data(), r.count);
      }
    } else {
      model_.read_llmc(llmc_path, [&](int k, const M* values) {
        for (const TensorRange& r : shard.holds) {
          if (r.tensor != k) continue;
          if (file) put_file(r.at, values + r.offset, r.count);
          else put(dst + r.at, values + r.offset, r.count);
        }
      });
    }
  }
  optimizer_.init_master();
}

template <class Ops>
void ZeroEngine<Ops>::init_file(uint64_t seed, offload::SwapFile& file) {
  // The file in whole aligned pieces, each holding every range of my shard that falls in it (zeros
  // between them, as the file was created), written (O_DIRECT, no bounce buffer) while the next
  // piece is computed on the OpenMP threads: the values depend only on (seed, tensor, element), so
  // the pieces' order changes nothing, and no tensor range of the largest model is a transient of
  // its own (wte: V x C).
  using M = typename Ops::M;
  constexpr size_t kPiece = size_t(1) << 20;  // elements, a whole number of blocks
  static_assert(kPiece * sizeof(T) % offload::kIoAlign == 0);
  const std::vector<TensorRange>& holds = store_.info(StateId::param_shard).holds;
  struct Free {
    void operator()(T* p) const { std::free(p); }
  };
  std::unique_ptr<T, Free> bufs[2] = {
      std::unique_ptr<T, Free>(static_cast<T*>(std::aligned_alloc(offload::kIoAlign, kPiece * sizeof(T)))),
      std::unique_ptr<T, Free>(static_cast<T*>(std::aligned_alloc(offload::kIoAlign, kPiece * sizeof(T))))};
  ZT_REQUIRE(bufs[0] && bufs[1], "out of memory for the parameter file's initialisation buffers");
  std::vector<M> narrow(std::is_same_v<T, M> ? 0 : kPiece);  // the CUDA backend's bf16: values before rounding
  std::future<void> writing[2];
  const size_t file_bytes = file.file_bytes();
  for (size_t p = 0; p * kPiece * sizeof(T) < file_bytes; ++p) {
    T* buf = bufs[p % 2].get();
    if (writing[p % 2].valid()) writing[p % 2].get();  // the buffer's previous piece is on disk
    const size_t lo = p * kPiece, hi = lo + kPiece, len = std::min(kPiece * sizeof(T), file_bytes - lo * sizeof(T));
    std::memset(buf, 0, len);
    for (const TensorRange& r : holds) {
      const size_t a = std::max(lo, r.at), b = std::min(hi, r.at + r.count);
      if (a >= b) continue;
      if constexpr (std::is_same_v<T, M>) {
        model_.init_gpt2_values(seed, r.tensor, r.offset + (a - r.at), b - a, buf + (a - lo));
      } else {
        model_.init_gpt2_values(seed, r.tensor, r.offset + (a - r.at), b - a, narrow.data());
        for (size_t i = 0; i < b - a; ++i) buf[a - lo + i] = T(narrow[i]);
      }
    }
    writing[p % 2] = std::async(std::launch::async, [&file, buf, len, lo] { file.write_blocks(buf, len, lo * sizeof(T)); });
  }
  for (std::future<void>& w : writing)
    if (w.valid()) w.get();
}

template <class Ops>
void ZeroEngine<Ops>::save_llmc(const std::string& path, bool writer) {
  // One unit at a time: the gatherer hands each unit whole (stage 3: gathered into a slot), the
  // model writes its tensors at their places in the file.
  model_.save_llmc_units(path, writer, [&](int u) { return gatherer_.whole_unit(u); });
}

template <class Ops>
void ZeroEngine<Ops>::set_tracer(Tracer* t) {
  tr_ = t;
  reducer_.set_tracer(t);
  optimizer_.set_tracer(t);
  gatherer_.set_tracer(t);
  lookup_.set_tracer(t);
  if constexpr (Ops::tier == Tier::host) Ops::tracer = t;  // the CPU backend's ops track (ops_cpu.h)
  traced_.reset(t ? new TracedHooks(*this, *t, micro_) : nullptr);
  model_.set_hooks(traced_ ? static_cast<UnitHooks*>(traced_.get()) : this);
}

// ---- the step: gradients complete, norm, update, parameters back --------------------------------

template <class Ops>
void ZeroEngine<Ops>::begin_step(int64_t step) {
  comm_.begin_step(step);
  reducer_.begin_step(optimizer_.take_grads_cleared());
}

template <class Ops>
void ZeroEngine<Ops>::begin_pass(int micro, bool with_backward) {
  micro_ = micro;
  lookup_.begin_pass(micro, with_backward);
  reducer_.begin_pass(micro);
  gatherer_.begin_pass(with_backward);
}

template <class Ops>
void ZeroEngine<Ops>::finish_gradients() {
  TraceSpan s(tr_, "finish gradients", Tracer::kCompute);
  reducer_.finish();
}

template <class Ops>
double ZeroEngine<Ops>::grad_norm() {
  TraceSpan s(tr_, "grad norm", Tracer::kOptimizer);
  return optimizer_.grad_norm(reducer_.unit_sum_squares());
}

// The queue on the link after the update (stages 1-2, prepared lookup, overlap on):
//
//   comm thread | ids AG (prepared) | rows RS | AG u0 (embedding) ... AG u1 | AG u2 | ... |
//   training    | grad norm | AdamW | rows | fwd: lookup (waits RS) | block 0 (waits u1) | ...
//
// Without the preparation the lookup's two collectives would be issued by the forward, behind
// every all-gather, and the forward's first unit would wait for the whole embedding to cross.
template <class Ops>
void ZeroEngine<Ops>::optimizer_step(double lr, double grad_scale) {
  {
    TraceSpan s(tr_, "adamw", Tracer::kOptimizer);
    const auto t0 = std::chrono::steady_clock::now();
    optimizer_.step(lr, grad_scale);
    last_update_s_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (tr_) s.args = "\"steps_taken\":" + std::to_string(optimizer_.steps_taken());
  }
  // With overlap only started here (waited in the next forward).
  TraceSpan s(rules_.gather_params ? tr_ : nullptr, "parameter all-gather", Tracer::kOptimizer);
  lookup_.after_update();  // a prepared lookup's rows, from the updated shard
  gatherer_.after_optimizer_step();
}

// ---- hooks: stage 3 gathers around each use; the others progress what is in flight ----------

template <class Ops>
void ZeroEngine<Ops>::gather_or_progress(int u) {
  if (rules_.gather_units) {
    gatherer_.use(u);
    return;
  }
  if (gatherer_.params_pending()) gatherer_.wait_unit(u);  // stages 1-2: the last step's all-gather
  comm_.test(CommHandle{});
}

template <class Ops>
void ZeroEngine<Ops>::before_forward(int u) {
  if (u == 0 && lookup_.forward_lookup()) comm_.test(CommHandle{});  // the lookup from the shards
  else gather_or_progress(u);
}

template <class Ops>
void ZeroEngine<Ops>::after_forward(int u) {
  if (rules_.gather_units) gatherer_.release(u);
}

template <class Ops>
void ZeroEngine<Ops>::before_backward(int u) {
  if (!final_ranges_.empty()) publish_final();
  gather_or_progress(u);
  in_backward_ = true;
}

template <class Ops>
void ZeroEngine<Ops>::before_grads(int u) {
  reducer_.before_grads(u);
  if (!in_backward_) comm_.test(CommHandle{});  // gradients without parameters: the embedding's, last
}

template <class Ops>
void ZeroEngine<Ops>::grads_ready(int u) {
  reducer_.grads_ready(u);
  if (optimizer_.updates_in_backward()) {
    reducer_.complete_arrived();
    publish_final();
  }
  if (optimizer_.host_overlaps()) optimizer_.host_progress();  // the CPU AdamW beside backward
}

template <class Ops>
void ZeroEngine<Ops>::update_args_known(double lr) {
  if (optimizer_.host_overlaps()) optimizer_.host_update_args(lr, 1.0);
  if (optimizer_.updates_in_backward()) {
    final_ranges_.clear();
    final_edge_ = units_end_;
    optimizer_.start_update(lr);
    optimizer_.grads_final_from(final_edge_);
  }
}

template <class Ops>
void ZeroEngine<Ops>::publish_final() {
  // Backward completes buckets from the shard's end, but a range counts only once the one above it
  // does (and its writes are on disk): the optimizer is told one edge, below which nothing is.
  bool moved = false;
  for (bool found = true; found;) {
    found = false;
    for (size_t i = 0; i < final_ranges_.size(); ++i) {
      const FinalRange& r = final_ranges_[i];
      if (r.lo < final_edge_ && r.hi >= final_edge_ && reducer_.shard_written(r.writes)) {
        final_edge_ = r.lo, moved = found = true;
        final_ranges_.erase(final_ranges_.begin() + std::ptrdiff_t(i));
        break;
      }
    }
  }
  if (moved) optimizer_.grads_final_from(final_edge_);
}

template <class Ops>
void ZeroEngine<Ops>::embedding_lookup_deferred() {
  reducer_.lookup_deferred();
}

template <class Ops>
void ZeroEngine<Ops>::after_backward(int u) {
  in_backward_ = false;
  if (rules_.gather_units) gatherer_.release(u);
}

template class ZeroEngine<CpuOps<float>>;
#if ZT_HAVE_CUDA
template class ZeroEngine<CudaOps<float>>;
template class ZeroEngine<CudaOps<bf16>>;
#endif

}  // namespace zt
