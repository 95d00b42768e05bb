// The CUDA backend's optimizer on the host (offload.optimizer "cpu" / "nvme", docs/design.md §3.6):
// the moments and master weights stay in pinned host memory (or swap files), the multi-threaded CPU
// AdamW (kernels/adamw.cpp) updates them, and my shard of the gradients and parameters crosses the
// bus each step. With "cpu" the update overlaps backward, unit by unit, as ZeRO-Offload's does:
//
//   compute   bwd L-1 ─ reduce ─ bwd L-2 ─ reduce ─ ... ─ bwd 0 ─ finish ─ norm ───────── wait ─ fwd
//   copy             D2H(L-1)          D2H(L-2)      ...    H2D(L-1)  H2D(L-2) ... D2H(0) H2D(0)
//   CPU worker            AdamW(L-1)         AdamW(L-2)  ...                           AdamW(0)
//
// A unit's shards leave the device once the reducer has made its gradient shard final (the last
// micro-step's reduction of its bucket: stages 2-3 during backward, stages 0-1 in finish()); the
// CPU worker updates it when its copy has arrived AND the update's arguments are known. With
// optim.grad_clip 0 they are known at the start of the step (scale 1), so AdamW runs beside
// backward; with clipping the scale needs the global gradient norm, i.e. every gradient, so the
// copies overlap backward and AdamW follows the norm (updating early would change the result:
// AdamW is not linear in the gradient scale). The embedding units always go last (the deferred
// lookup adds to their gradient at the end of backward). Every CUDA call stays on the training
// thread (progress(), at each unit of backward, hands arrived units to the worker and queues
// the copies back of updated ones); the worker touches only pinned host memory.
//
// With "nvme" the state is streamed through offload::SwapPipeline after every unit has arrived.
// The update is the per-tensor AdamW of adamw_unit_range with the CPU functions of the CUDA
// kernel's arithmetic: fp32 exactly the kernel's formula (cpu::adamw_update), bf16 the kernel's
// stochastic rounding bit for bit (cpu::adamw_update_bf16_master), so a run matches the same plan
// without offload bit for bit (under emulation and on an H100: neither side contracts into FMAs,
// CMakeLists.txt), whenever each unit is updated.
#include <chrono>
#include <condition_variable>
#include <functional>
#include <deque>
#include <exception>
#include <mutex>
#include <thread>
#include <type_traits>
#include <vector>

#include "backend/ops_cpu.h"
#include "zero/adamw_shard.h"
#include "zero/host_optimizer.h"
#if ZT_HAVE_CUDA
#include "backend/ops_cuda.h"
#include "runtime/cuda_context.h"
#endif

namespace zt {

#if ZT_HAVE_CUDA
namespace {
// The op table adamw_unit_range calls, on host memory.
template <class TT>
struct HostAdamW {
  using T = TT;
  using M = float;
  static void adamw(T* p, M* master, T* g, M* m, M* v, size_t n, const cpu::AdamWArgs& a, uint32_t seed,
                    uint64_t first) {
    ZT_ASSERT(!a.clear_grad);  // the gradient shard here is overwritten by the next step's copy
    if constexpr (std::is_same_v<T, float>) {
      ZT_ASSERT(!master);
      cpu::adamw_update<float>(p, g, m, v, n, a);
    } else {
      ZT_ASSERT(master);
      cpu::adamw_update_bf16_master(reinterpret_cast<uint16_t*>(p), master, reinterpret_cast<const uint16_t*>(g), m,
                                    v, n, a, seed, first);
    }
  }
};
}  // namespace
#endif

template <class Ops>
struct HostOptimizer<Ops>::Copies {
#if ZT_HAVE_CUDA
  cudaStream_t stream = nullptr;
  std::vector<cudaEvent_t> arrived;  // per unit: its params and grads are on the host
  cudaEvent_t mark = nullptr;
  // Per unit, this step: 0 on the device, 1 copies queued, 2 with the worker, 3 updated, 4 sent back.
  std::vector<int> state;
  int sent_back = 0;

  // The CPU worker. Guarded by mu: jobs, updated, args, failure, stop.
  std::mutex mu;
  std::condition_variable cv;
  std::deque<int> jobs;     // units whose shards are on the host, to update
  std::vector<int> updated; // units updated, not yet sent back
  struct Args {
    bool known = false;
    double lr = 0, scale = 0;
    int t = 0;  // AdamW's step
  } args;
  std::exception_ptr failure;
  bool stop = false;
  struct Span {
    int unit;
    double ts_us, dur_us;
  };
  std::vector<Span> spans;  // the worker's updates this step (run.trace), guarded by mu
  std::thread worker;

  Copies(int units, std::function<void(int, double, double, int)> update)
      : arrived(size_t(units)), state(size_t(units), 0) {
    ZT_CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    for (cudaEvent_t& e : arrived) ZT_CHECK_CUDA(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    ZT_CHECK_CUDA(cudaEventCreateWithFlags(&mark, cudaEventDisableTiming));
    worker = std::thread([this, update] {
      std::unique_lock<std::mutex> lk(mu);
      for (;;) {
        cv.wait(lk, [&] { return stop || (args.known && !jobs.empty()); });
        if (stop) return;
        const int u = jobs.front();
        jobs.pop_front();
        const Args a = args;
        lk.unlock();
        const double t0 = Tracer::now_us();
        try {
          update(u, a.lr, a.scale, a.t);
        } catch (...) {
          lk.lock();
          failure = std::current_exception();
          cv.notify_all();
          continue;
        }
        const double t1 = Tracer::now_us();
        lk.lock();
        updated.push_back(u);
        spans.push_back({u, t0, t1 - t0});
        cv.notify_all();
      }
    });
  }
  ~Copies() {
    {
      std::lock_guard<std::mutex> lk(mu);
      stop = true;
    }
    cv.notify_all();
    worker.join();
    (void)cudaStreamSynchronize(stream);
    for (cudaEvent_t e : arrived) (void)cudaEventDestroy(e);
    (void)cudaEventDestroy(mark);
    (void)cudaStreamDestroy(stream);
  }
#endif
};

template <class Ops>
HostOptimizer<Ops>::HostOptimizer(const ShardView<Ops>& shard, const OptimSection& optim, bool shards_on_host,
                                  offload::SwapPipeline* swap, SwapSlots at)
    : shard_(shard), optim_(optim), shards_on_host_(shards_on_host), swap_(swap), at_(at) {}

template <class Ops>
HostOptimizer<Ops>::~HostOptimizer() = default;

template <class Ops>
typename HostOptimizer<Ops>::T* HostOptimizer<Ops>::host_params() const {
  return shard_.store.template get<T>(shards_on_host_ ? StateId::param_shard : StateId::host_params);
}

template <class Ops>
typename HostOptimizer<Ops>::T* HostOptimizer<Ops>::host_grads() const {
  return shard_.store.template get<T>(shards_on_host_ ? StateId::grad_shard : StateId::host_grads);
}

template <class Ops>
void HostOptimizer<Ops>::init_master() {
#if ZT_HAVE_CUDA
  if constexpr (Ops::tier == Tier::device) {
    if constexpr (!kMixed) return;  // fp32: the parameters are the master
    // Master = my shard of the parameters, widened on the host (exact), into pinned memory or the file.
    T* hp = host_params();
    for (int u = 0; u < shard_.layout.num_units() && !shards_on_host_; ++u)
      Ops::d2h(hp + shard_.part.unit_shard_flat(u), shard_.params(u), shard_.part.unit_shard_numel(u) * sizeof(T));
    auto widen = [&](float* dst, const T* src, size_t n) {
      for (size_t i = 0; i < n; ++i) dst[i] = float(src[i]);
    };
    if (at_.master >= 0 || at_.param >= 0) {  // through the pipeline: what passes unchanged is written back as read
      M* master = shard_.store.template get<M>(StateId::master);
      swap_->for_each_subgroup([&](size_t begin, size_t n, M* const* bufs) {
        const T* p = at_.param >= 0 ? reinterpret_cast<const T*>(bufs[at_.param]) : hp + begin;
        widen(at_.master >= 0 ? bufs[at_.master] : master + begin, p, n);
      });
    } else {
      widen(shard_.store.template get<M>(StateId::master), hp, shard_.part.shard_total());
    }
    return;
  }
#endif
  ZT_ASSERT(false);  // only the CUDA backend keeps host copies
}

namespace {
bool is_embedding(const Unit& u) { return u.name.rfind("embedding", 0) == 0; }
}  // namespace

template <class Ops>
typename HostOptimizer<Ops>::Copies& HostOptimizer<Ops>::copies() {
#if ZT_HAVE_CUDA
  if constexpr (Ops::tier == Tier::device) {
    if (!copies_)
      copies_ = std::make_unique<Copies>(shard_.layout.num_units(), [this](int u, double lr, double scale, int t) {
        update_unit(u, lr, scale, t);
      });
    return *copies_;
  }
#endif
  ZT_ASSERT(false);  // only the CUDA backend keeps host copies
  return *copies_;
}

template <class Ops>
void HostOptimizer<Ops>::update_unit(int u, double lr, double grad_scale, int t) {
  T* hp = host_params();
  T* hg = host_grads();
  const size_t f = shard_.part.unit_shard_flat(u);
#if ZT_HAVE_CUDA
  const Partition& part = shard_.part;
  adamw_unit_range<HostAdamW<T>>(shard_.layout, u, part.unit_shard_begin(u), part.unit_shard_numel(u), hp + f,
                                 shard_.state(StateId::master, u), hg + f, shard_.state(StateId::adam_m, u),
                                 shard_.state(StateId::adam_v, u), optim_, lr, grad_scale, t);
#else
  (void)hp, (void)hg, (void)f, (void)lr, (void)grad_scale, (void)t;
#endif
}

template <class Ops>
void HostOptimizer<Ops>::units_final(const std::vector<int>& units) {
  std::vector<int> blocks;
  for (int u : units)
    if (!is_embedding(shard_.layout.units()[size_t(u)])) blocks.push_back(u);
  send(blocks);
}

template <class Ops>
void HostOptimizer<Ops>::send(const std::vector<int>& units) {
#if ZT_HAVE_CUDA
  if constexpr (Ops::tier == Tier::device) {
    Copies& c = copies();
    T* hp = host_params();
    T* hg = host_grads();
    bool marked = false;
    for (int u : units) {
      if (c.state[size_t(u)] != 0) continue;  // already on its way
      if (!marked) {  // after what the compute stream has queued: the reduction into the shard
        ZT_CHECK_CUDA(cudaEventRecord(c.mark, Ops::stream()));
        ZT_CHECK_CUDA(cudaStreamWaitEvent(c.stream, c.mark, 0));
        marked = true;
      }
      const size_t f = shard_.part.unit_shard_flat(u), bytes = shard_.part.unit_shard_numel(u) * sizeof(T);
      if (!shards_on_host_) {  // else the reducer's copies out, queued before the mark, are what arrives
        ZT_CHECK_CUDA(cudaMemcpyAsync(hp + f, shard_.params(u), bytes, cudaMemcpyDeviceToHost, c.stream));
        ZT_CHECK_CUDA(cudaMemcpyAsync(hg + f, shard_.grads(u), bytes, cudaMemcpyDeviceToHost, c.stream));
      }
      ZT_CHECK_CUDA(cudaEventRecord(c.arrived[size_t(u)], c.stream));
      c.state[size_t(u)] = 1;
    }
    return;
  }
#endif
  (void)units;
}

template <class Ops>
void HostOptimizer<Ops>::update_args(double lr, double grad_scale, int t) {
#if ZT_HAVE_CUDA
  if constexpr (Ops::tier == Tier::device) {
    Copies& c = copies();
    {
      std::lock_guard<std::mutex> lk(c.mu);
      ZT_ASSERT(!c.args.known);
      c.args = {true, lr, grad_scale, t};
    }
    c.cv.notify_all();
    return;
  }
#endif
  (void)lr, (void)grad_scale, (void)t;
}

template <class Ops>
void HostOptimizer<Ops>::progress() {
#if ZT_HAVE_CUDA
  if constexpr (Ops::tier == Tier::device) {
    if (!copies_ || swap_) return;
    Copies& c = *copies_;
    std::vector<int> back;
    {
      std::lock_guard<std::mutex> lk(c.mu);
      if (c.failure) std::rethrow_exception(c.failure);
      back.swap(c.updated);
    }
    bool handed = false;
    for (int u = 0; u < shard_.layout.num_units(); ++u) {
      if (c.state[size_t(u)] != 1) continue;
      const cudaError_t q = cudaEventQuery(c.arrived[size_t(u)]);
      if (q == cudaErrorNotReady) continue;
      ZT_CHECK_CUDA(q);
      std::lock_guard<std::mutex> lk(c.mu);
      c.jobs.push_back(u);
      c.state[size_t(u)] = 2;
      handed = true;
    }
    if (handed) c.cv.notify_all();
    for (int u : back) {  // the updated parameters back to the device, on the copy stream
      const size_t f = shard_.part.unit_shard_flat(u), bytes = shard_.part.unit_shard_numel(u) * sizeof(T);
      if (!shards_on_host_)
        ZT_CHECK_CUDA(cudaMemcpyAsync(shard_.params(u), host_params() + f, bytes, cudaMemcpyHostToDevice, c.stream));
      c.state[size_t(u)] = 4;
      ++c.sent_back;
    }
  }
#endif
}

template <class Ops>
void HostOptimizer<Ops>::step(double lr, double grad_scale, int t) {
#if ZT_HAVE_CUDA
  if constexpr (Ops::tier == Tier::device) {
    const int U = shard_.layout.num_units();
    Copies& c = copies();
    T* hp = host_params();
    T* hg = host_grads();
    std::vector<int> all(static_cast<size_t>(U));
    for (int u = 0; u < U; ++u) all[size_t(u)] = u;
    send(all);  // what backward did not send (stages 0-1: everything; the embedding units)
    if (swap_) {
      for (int u = 0; u < U; ++u) ZT_CHECK_CUDA(cudaEventSynchronize(c.arrived[size_t(u)]));
      // Each state from its sub-group buffer where it is swapped, else from pinned memory.
      M* master = shard_.store.template get<M>(StateId::master);
      M* m = shard_.store.template get<M>(StateId::adam_m);
      M* v = shard_.store.template get<M>(StateId::adam_v);
      swap_->for_each_subgroup([&](size_t lo, size_t n, M* const* bufs) {
        const size_t hi = lo + n;
        auto state_at = [&](int i, M* mem, size_t a) -> M* {
          return i >= 0 ? bufs[i] + (a - lo) : mem ? mem + a : nullptr;
        };
        auto shard_at = [&](int i, T* mem, size_t a) -> T* {
          return i >= 0 ? reinterpret_cast<T*>(bufs[i]) + (a - lo) : mem + a;
        };
        for (int u = 0; u < U; ++u) {
          const size_t f = shard_.part.unit_shard_flat(u), a = std::max(lo, f), b = std::min(hi, f + shard_.part.unit_shard_numel(u));
          if (a >= b) continue;
          const size_t k = a - f;
          adamw_unit_range<HostAdamW<T>>(shard_.layout, u, shard_.part.unit_shard_begin(u) + k, b - a, shard_at(at_.param, hp, a),
                                         state_at(at_.master, master, a), shard_at(at_.grad, hg, a),
                                         state_at(at_.m, m, a), state_at(at_.v, v, a), optim_, lr, grad_scale, t);
        }
      });
      for (int u = 0; u < U && !shards_on_host_; ++u) {
        const size_t f = shard_.part.unit_shard_flat(u), bytes = shard_.part.unit_shard_numel(u) * sizeof(T);
        ZT_CHECK_CUDA(cudaMemcpyAsync(shard_.params(u), hp + f, bytes, cudaMemcpyHostToDevice, c.stream));
      }
    } else {
      {
        std::lock_guard<std::mutex> lk(c.mu);
        if (c.args.known)  // given before backward ended: the same update (update_args)
          ZT_ASSERT(c.args.lr == lr && c.args.scale == grad_scale && c.args.t == t);
        else
          c.args = {true, lr, grad_scale, t};
      }
      c.cv.notify_all();
      // Until every unit is back: hand over what arrived, send back what is updated.
      for (;;) {
        progress();
        if (c.sent_back == U) break;
        std::unique_lock<std::mutex> lk(c.mu);
        c.cv.wait_for(lk, std::chrono::milliseconds(1), [&] { return !c.updated.empty() || c.failure; });
      }
      std::lock_guard<std::mutex> lk(c.mu);
      if (tr_)
        for (const auto& sp : c.spans)
          tr_->complete("adamw " + shard_.layout.units()[size_t(sp.unit)].name, Tracer::kHostOptimizer, sp.ts_us, sp.dur_us,
                        "\"unit\":" + std::to_string(sp.unit));
      c.spans.clear();
      c.args = {};
    }
    std::fill(c.state.begin(), c.state.end(), 0);
    c.sent_back = 0;
    // In: the compute stream (the parameter all-gather, the next forward) waits for the copies back.
    ZT_CHECK_CUDA(cudaEventRecord(c.mark, c.stream));
    ZT_CHECK_CUDA(cudaStreamWaitEvent(Ops::stream(), c.mark, 0));
    return;
  }
#endif
  (void)lr, (void)grad_scale, (void)t;
  ZT_ASSERT(false);  // only the CUDA backend keeps host copies
}

template class HostOptimizer<CpuOps<float>>;
#if ZT_HAVE_CUDA
template class HostOptimizer<CudaOps<float>>;
template class HostOptimizer<CudaOps<bf16>>;
#endif

}  // namespace zt
