// The CUDA backend's optimizer on the host (offload.optimizer "cpu" / "nvme", docs/design.md §3.6):
// the moments and master weights stay in pinned host memory (or swap files), the multi-threaded CPU
// AdamW (kernels/adamw.cpp) updates them, and my shard of the gradients and parameters crosses the
// bus each step:
//
//   copy stream   wait compute ─ D2H(params u, grads u) for every unit ─ ... ─ H2D(params u) ...
//   host (CPU)                   wait unit u's copies ─ AdamW(u) ─ queue H2D(u) ─ wait u+1 ─ ...
//   compute       ... backward ─ grad norm ─────────────────────────────────── wait copies ─ forward
//
// Unit u's update overlaps the copies of units u+1.. down and of u-1 up. With "nvme" the state is
// streamed through offload::SwapPipeline after every unit has arrived. The update is the per-tensor
// AdamW of adamw_unit_range with the CPU functions of the CUDA kernel's arithmetic: fp32 exactly the
// kernel's formula (cpu::adamw_update), bf16 the kernel's stochastic rounding bit for bit
// (cpu::adamw_update_bf16_master), so a run matches the same plan without offload (tested under
// emulation; on a GPU nvcc's fused multiply-adds may differ in the last bit).
#include <type_traits>
#include <vector>

#include "backend/ops_cpu.h"
#include "zero/adamw_shard.h"
#include "zero/optimizer.h"
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
  static void adamw(T* p, M* master, const T* g, M* m, M* v, size_t n, const cpu::AdamWArgs& a, uint32_t seed) {
    if constexpr (std::is_same_v<T, float>) {
      ZT_ASSERT(!master);
      cpu::adamw_update<float>(p, g, m, v, n, a);
    } else {
      ZT_ASSERT(master);
      cpu::adamw_update_bf16_master(reinterpret_cast<uint16_t*>(p), master, reinterpret_cast<const uint16_t*>(g), m,
                                    v, n, a, seed);
    }
  }
};
}  // namespace
#endif

template <class Ops>
struct ShardedOptimizer<Ops>::HostCopies {
#if ZT_HAVE_CUDA
  cudaStream_t stream = nullptr;
  std::vector<cudaEvent_t> arrived;  // per unit: its params and grads are on the host
  cudaEvent_t mark = nullptr;
  explicit HostCopies(int units) : arrived(size_t(units)) {
    ZT_CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    for (cudaEvent_t& e : arrived) ZT_CHECK_CUDA(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    ZT_CHECK_CUDA(cudaEventCreateWithFlags(&mark, cudaEventDisableTiming));
  }
  ~HostCopies() {
    (void)cudaStreamSynchronize(stream);
    for (cudaEvent_t e : arrived) (void)cudaEventDestroy(e);
    (void)cudaEventDestroy(mark);
    (void)cudaStreamDestroy(stream);
  }
#endif
};

template <class Ops>
void ShardedOptimizer<Ops>::host_init_master() {
#if ZT_HAVE_CUDA
  if constexpr (Ops::tier == Tier::device) {
    if constexpr (!kMixed) return;  // fp32: the parameters are the master
    // Master = my shard of the parameters, widened on the host (exact), into pinned memory or the file.
    T* hp = store_.get<T>(StateId::host_params);
    for (int u = 0; u < layout_.num_units(); ++u)
      Ops::d2h(hp + part_.unit_shard_flat(u), params(u), part_.unit_shard_numel(u) * sizeof(T));
    auto widen = [&](float* dst, const T* src, size_t n) {
      for (size_t i = 0; i < n; ++i) dst[i] = float(src[i]);
    };
    if (at_master_ >= 0) {  // through the pipeline: the moments pass unchanged, the master is written
      swap_->for_each_subgroup([&](size_t begin, size_t n, M* const* bufs) { widen(bufs[at_master_], hp + begin, n); });
    } else {
      widen(store_.get<M>(StateId::master), hp, part_.shard_total());
    }
    return;
  }
#endif
  ZT_ASSERT(false);  // only the CUDA backend keeps host copies
}

template <class Ops>
void ShardedOptimizer<Ops>::host_step(double lr, double grad_scale) {
#if ZT_HAVE_CUDA
  if constexpr (Ops::tier == Tier::device) {
    const int U = layout_.num_units();
    if (!copies_) copies_ = std::make_shared<HostCopies>(U);
    HostCopies& c = *copies_;
    T* hp = store_.get<T>(StateId::host_params);
    T* hg = store_.get<T>(StateId::host_grads);
    cudaStream_t compute = Ops::stream();
    // Out: after backward and the gradient reduction (compute stream), unit by unit.
    ZT_CHECK_CUDA(cudaEventRecord(c.mark, compute));
    ZT_CHECK_CUDA(cudaStreamWaitEvent(c.stream, c.mark, 0));
    for (int u = 0; u < U; ++u) {
      const size_t f = part_.unit_shard_flat(u), bytes = part_.unit_shard_numel(u) * sizeof(T);
      ZT_CHECK_CUDA(cudaMemcpyAsync(hp + f, params(u), bytes, cudaMemcpyDeviceToHost, c.stream));
      ZT_CHECK_CUDA(cudaMemcpyAsync(hg + f, grads(u), bytes, cudaMemcpyDeviceToHost, c.stream));
      ZT_CHECK_CUDA(cudaEventRecord(c.arrived[size_t(u)], c.stream));
    }
    auto back = [&](int u) {
      const size_t f = part_.unit_shard_flat(u), bytes = part_.unit_shard_numel(u) * sizeof(T);
      ZT_CHECK_CUDA(cudaMemcpyAsync(params(u), hp + f, bytes, cudaMemcpyHostToDevice, c.stream));
    };
    if (swap_) {
      for (int u = 0; u < U; ++u) ZT_CHECK_CUDA(cudaEventSynchronize(c.arrived[size_t(u)]));
      swap_->for_each_subgroup([&](size_t lo, size_t n, M* const* bufs) {
        const size_t hi = lo + n;
        for (int u = 0; u < U; ++u) {
          const size_t f = part_.unit_shard_flat(u), a = std::max(lo, f), b = std::min(hi, f + part_.unit_shard_numel(u));
          if (a >= b) continue;
          const size_t k = a - f, at = a - lo;
          adamw_unit_range<HostAdamW<T>>(layout_, u, part_.unit_shard_begin(u) + k, b - a, hp + a,
                                         at_master_ >= 0 ? bufs[at_master_] + at : nullptr, hg + a, bufs[at_m_] + at, bufs[at_v_] + at,
                                         optim_, lr, grad_scale, steps_taken_);
        }
      });
      for (int u = 0; u < U; ++u) back(u);
    } else {
      for (int u = 0; u < U; ++u) {
        ZT_CHECK_CUDA(cudaEventSynchronize(c.arrived[size_t(u)]));
        const size_t f = part_.unit_shard_flat(u);
        adamw_unit_range<HostAdamW<T>>(layout_, u, part_.unit_shard_begin(u), part_.unit_shard_numel(u), hp + f,
                                       state(StateId::master, u), hg + f, state(StateId::adam_m, u),
                                       state(StateId::adam_v, u), optim_, lr, grad_scale, steps_taken_);
        back(u);
      }
    }
    // In: the compute stream (the parameter all-gather, the next forward) waits for the copies back.
    ZT_CHECK_CUDA(cudaEventRecord(c.mark, c.stream));
    ZT_CHECK_CUDA(cudaStreamWaitEvent(compute, c.mark, 0));
    return;
  }
#endif
  (void)lr, (void)grad_scale;
  ZT_ASSERT(false);  // only the CUDA backend keeps host copies
}

template void ShardedOptimizer<CpuOps<float>>::host_init_master();
template void ShardedOptimizer<CpuOps<float>>::host_step(double, double);
#if ZT_HAVE_CUDA
template void ShardedOptimizer<CudaOps<float>>::host_init_master();
template void ShardedOptimizer<CudaOps<float>>::host_step(double, double);
template void ShardedOptimizer<CudaOps<bf16>>::host_init_master();
template void ShardedOptimizer<CudaOps<bf16>>::host_step(double, double);
#endif

}  // namespace zt
