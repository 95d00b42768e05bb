// Force-included (g++ -include) into every src/*.cu file of the emulation build (zt_emu): makes
// the CUDA kernels plain C++ that runs on the CPU. See test/emu/README.md.
//
// Types, enums and the runtime/cuBLASLt prototypes come from the real CUDA headers (so the emulator
// is checked against the toolkit's own declarations); the functions themselves are implemented in
// test/emu/runtime.cpp and cublaslt.cpp instead of libcudart / libcublasLt.
//
// Device side: every CUDA thread is a fiber (its own stack); a block's fibers run one at a time on
// the calling thread, switching only at __syncthreads / __syncwarp / shuffles / warp-collective
// tensor-core instructions. Blocks run one after another, so `__shared__` variables are plain
// `static` variables (one copy, reused block by block) and dynamic shared memory is one buffer.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <tuple>
#include <type_traits>
#include <utility>

#define ZT_EMU 1

#undef __shared__
#define __shared__ static
#ifndef __launch_bounds__
#define __launch_bounds__(...)  // not checked by the emulator (see README)
#endif
// `extern __shared__ T name[];` is rewritten to this by test/emu/rewrite.cmake.
#define ZT_EMU_DYNAMIC_SMEM(type, name) type* name = reinterpret_cast<type*>(::zt_emu::dynamic_smem())

namespace zt_emu {

// ---- per-thread coordinates, set by the scheduler at every fiber switch ---------------------------
extern uint3 g_thread_idx, g_block_idx;
extern dim3 g_block_dim, g_grid_dim;

unsigned char* dynamic_smem();
size_t dynamic_smem_bytes();
void syncthreads();
void syncwarp(unsigned mask);
// Warp all-gather: every live lane of the warp contributes `bytes` (<= 32) from `mine`; returns the
// warp's 32 slots (stride 32 bytes), valid until this lane's next collective. `what` names the
// instruction in error messages. Requires the 32 lanes of a full warp (mask 0xffffffff).
const unsigned char* warp_allgather(const void* mine, size_t bytes, unsigned mask, const char* what);
inline int lane_id() {
  return int((g_thread_idx.x + g_block_dim.x * (g_thread_idx.y + g_block_dim.y * g_thread_idx.z)) % 32u);
}
[[noreturn]] void device_fault(const char* fmt, ...);

// Tensor-core and async-copy instructions (implemented in runtime.cpp from the PTX ISA layouts).
void mma_m16n8k16_bf16_f32(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1);
void ldmatrix_x4(uint32_t (&r)[4], const void* smem_row, bool trans);
void cp_async(void* smem_dst, const void* global_src, int bytes, bool valid);
void cp_async_commit();
void cp_async_wait_group(int n);

template <class T>
T shfl_generic(unsigned mask, T v, int src_lane_xor, bool is_xor, int width, const char* what) {
  static_assert(sizeof(T) <= 32, "shuffle of a type wider than 32 bytes");
  const unsigned char* slots = warp_allgather(&v, sizeof(T), mask, what);
  const int lane = lane_id();
  int src;
  if (is_xor) {
    src = lane ^ src_lane_xor;
    if (src >= ((lane / width) + 1) * width) src = lane;  // outside the segment: own value
  } else {
    src = (lane / width) * width + (src_lane_xor % width);
  }
  T out;
  std::memcpy(&out, slots + 32 * src, sizeof(T));
  return out;
}

// ---- kernel launch: `k<<<g, b, s, st>>>(args)` is rewritten to `k | Launch("k", g, b, s, st)(args)` --
struct Access {
  const void* ptr;
  size_t bytes;  // SIZE_MAX: from ptr to the end of its allocation (kernel pointer arguments)
  bool write;
};
struct LaunchCfg {
  const char* name;
  dim3 grid, block;
  size_t smem;
  cudaStream_t stream;
};
template <class... A>
struct LaunchArgs {
  LaunchCfg cfg;
  std::tuple<A...> args;
};
struct Launch {
  LaunchCfg cfg;
  Launch(const char* name, dim3 g, dim3 b, size_t smem = 0, cudaStream_t st = nullptr) : cfg{name, g, b, smem, st} {}
  template <class... A>
  LaunchArgs<std::decay_t<A>...> operator()(A&&... a) const {
    return {cfg, std::tuple<std::decay_t<A>...>(std::forward<A>(a)...)};
  }
};

// Runs body() once per CUDA thread of the grid. `accesses` are the pointer arguments (for the
// stream-order check and the device-memory protection). Errors in the configuration are returned
// through cudaGetLastError, like the real launch.
void launch(const void* kernel, const LaunchCfg& cfg, const Access* accesses, size_t naccesses,
            void (*body)(void*), void* ctx);

template <class P>
void add_access(Access* out, size_t& n, const P& p) {
  if constexpr (std::is_pointer_v<P>) {
    using E = std::remove_pointer_t<P>;
    if (p != nullptr) out[n++] = Access{static_cast<const void*>(p), SIZE_MAX, !std::is_const_v<E>};
  }
}

template <class... P, class... A>
void operator|(void (*kernel)(P...), LaunchArgs<A...>&& la) {
  static_assert(sizeof...(P) == sizeof...(A), "kernel launched with the wrong number of arguments");
  using Params = std::tuple<std::decay_t<P>...>;
  Params params = std::apply([](auto&&... a) { return Params(a...); }, la.args);
  Access acc[sizeof...(P) + 1];
  size_t n = 0;
  std::apply([&](const auto&... p) { (add_access(acc, n, p), ...); }, params);
  struct Ctx {
    void (*k)(P...);
    Params* params;
  } ctx{kernel, &params};
  launch(reinterpret_cast<const void*>(kernel), la.cfg, acc, n,
         [](void* c) {
           Ctx* x = static_cast<Ctx*>(c);
           std::apply(x->k, *x->params);  // each CUDA thread gets its own copies of the arguments
         },
         &ctx);
}

}  // namespace zt_emu

#define threadIdx (::zt_emu::g_thread_idx)
#define blockIdx (::zt_emu::g_block_idx)
#define blockDim (::zt_emu::g_block_dim)
#define gridDim (::zt_emu::g_grid_dim)

// ---- device intrinsics used by src/kernels ---------------------------------------------------------
inline void __syncthreads() { ::zt_emu::syncthreads(); }
inline void __syncwarp(unsigned mask = 0xffffffffu) { ::zt_emu::syncwarp(mask); }
template <class T> inline T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = 32) {
  return ::zt_emu::shfl_generic(mask, v, lane_mask, true, width, "__shfl_xor_sync");
}
template <class T> inline T __shfl_sync(unsigned mask, T v, int src_lane, int width = 32) {
  return ::zt_emu::shfl_generic(mask, v, src_lane, false, width, "__shfl_sync");
}
inline unsigned int __float_as_uint(float x) { unsigned int u; std::memcpy(&u, &x, 4); return u; }
inline float __uint_as_float(unsigned int u) { float x; std::memcpy(&x, &u, 4); return x; }
inline int4 __ldcs(const int4* p) { return *p; }
inline void __stcs(int4* p, int4 v) { *p = v; }
inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }
inline unsigned min(unsigned a, unsigned b) { return a < b ? a : b; }
inline unsigned max(unsigned a, unsigned b) { return a > b ? a : b; }
// cuda_runtime.h declares this C++ overload only for nvcc.
template <class T>
inline cudaError_t cudaFuncSetAttribute(T* entry, cudaFuncAttribute attr, int value) {
  return ::cudaFuncSetAttribute(reinterpret_cast<const void*>(entry), attr, value);
}
