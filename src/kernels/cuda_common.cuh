// Device-side helpers shared by the CUDA kernels (included by .cu files only).
//
//   Packed128<T>     16 bytes of T moved with one 128-bit load/store (8 bf16 or 4 float):
//                    memory-bound kernels read and write whole cache sectors per instruction.
//   warp_sum/max     butterfly reductions over the 32 lanes of a warp (no shared memory).
//   block_sum/max    sum / max over a whole block (warp results through shared memory).
//   to_float/from_float   conversions that are the identity for float, so one template serves
//                    the bf16 kernels and the fp32 parity mode.
//   stochastic_round bf16 rounding with probability proportional to distance (AdamW's update).
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstddef>
#include <cstdint>

#include "runtime/cuda_check.h"

namespace zt::cuda {

constexpr int kWarp = 32;

inline int ceil_div(size_t a, size_t b) { return int((a + b - 1) / b); }

// ---- conversions ---------------------------------------------------------------------------------
__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
template <class T> __device__ __forceinline__ T from_float(float x);
template <> __device__ __forceinline__ float from_float<float>(float x) { return x; }
template <> __device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }

// ---- 128-bit packets -------------------------------------------------------------------------------
template <class T>
struct alignas(16) Packed128 {
  static constexpr int size = int(16 / sizeof(T));
  T v[size];
  __device__ __forceinline__ T& operator[](int i) { return v[i]; }
  __device__ __forceinline__ const T& operator[](int i) const { return v[i]; }
  __device__ __forceinline__ static Packed128 zeros() {
    Packed128 p;
#pragma unroll
    for (int i = 0; i < size; ++i) p.v[i] = from_float<T>(0.0f);
    return p;
  }
};
// ptr must be 16-byte aligned (every activation field and every unit is 64-byte aligned).
template <class T> __device__ __forceinline__ Packed128<T> load128(const T* ptr) {
  return *reinterpret_cast<const Packed128<T>*>(ptr);
}
// Streaming load (read once, do not keep in L1/L2): for data that will not be reused soon.
template <class T> __device__ __forceinline__ Packed128<T> load128cs(const T* ptr) {
  Packed128<T> p;
  *reinterpret_cast<int4*>(&p) = __ldcs(reinterpret_cast<const int4*>(ptr));
  return p;
}
template <class T> __device__ __forceinline__ void store128(T* ptr, const Packed128<T>& p) {
  *reinterpret_cast<Packed128<T>*>(ptr) = p;
}

// ---- reductions ------------------------------------------------------------------------------------
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
// Every thread of the block gets the block's sum (max). blockDim.x must be a multiple of 32
// (<= 1024); every thread must call it (it synchronises). Deterministic: fixed order of warp partials.
template <bool kMax>
__device__ __forceinline__ float block_reduce(float v) {
  __shared__ float partial[32];
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp, warps = blockDim.x / kWarp;
  v = kMax ? warp_max(v) : warp_sum(v);
  __syncthreads();  // partial[] may still be read by a previous call
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  v = lane < warps ? partial[lane] : (kMax ? -INFINITY : 0.0f);
  return kMax ? warp_max(v) : warp_sum(v);
}
__device__ __forceinline__ float block_sum(float v) { return block_reduce<false>(v); }
__device__ __forceinline__ float block_max(float v) { return block_reduce<true>(v); }

// ---- stochastic rounding ---------------------------------------------------------------------------
// Counter-based hash (SquirrelNoise5-style): the random bits depend only on (index, seed), so a run
// is reproducible and every shard rounds its elements the same way whatever launch shape it uses.
__device__ __forceinline__ uint32_t hash_u32(uint32_t idx, uint32_t seed) {
  constexpr uint32_t n1 = 0xd2a80a3fu, n2 = 0xa884f197u, n3 = 0x6C736F4Bu, n4 = 0xB79F3ABBu, n5 = 0x1b56c4f5u;
  uint32_t m = idx;
  m *= n1; m += seed; m ^= (m >> 9);
  m += n2; m ^= (m >> 11);
  m *= n3; m ^= (m >> 13);
  m += n4; m ^= (m >> 15);
  m *= n5; m ^= (m >> 17);
  return m;
}
// The random bits of element `index` of the whole flat parameter buffer: by its global index, so
// that a range updated in one call or cut into slices (shards, offload sub-groups) rounds alike.
// Beyond 2^32 elements the high bits vary the seed.
__device__ __forceinline__ uint32_t element_bits(uint64_t index, uint32_t seed) {
  return hash_u32(uint32_t(index), seed ^ uint32_t(index >> 32) * 0x85EBCA77u);
}
// Rounds x to bf16 up or down with probability given by the distance to each neighbour, so that
// E[round(x)] = x: small AdamW updates are not lost to round-to-nearest on bf16 parameters.
__device__ __forceinline__ __nv_bfloat16 stochastic_round_bf16(float x, uint32_t random) {
  const uint32_t bits = __float_as_uint(x);
  const uint32_t rounded = (bits + (random & 0xFFFFu)) & 0xFFFF0000u;
  return __ushort_as_bfloat16(uint16_t(rounded >> 16));
}
template <class T> __device__ __forceinline__ T round_param(float x, uint32_t random);
template <> __device__ __forceinline__ float round_param<float>(float x, uint32_t) { return x; }
template <> __device__ __forceinline__ __nv_bfloat16 round_param<__nv_bfloat16>(float x, uint32_t random) {
  return stochastic_round_bf16(x, random);
}

// ---- GELU (tanh approximation, as GPT-2 and the CPU reference) --------------------------------------
__device__ __forceinline__ float gelu_f(float x) {
  const float s = 0.7978845608028654f;  // sqrt(2/pi)
  const float cube = 0.044715f * x * x * x;
  return 0.5f * x * (1.0f + tanhf(s * (x + cube)));
}
__device__ __forceinline__ float gelu_grad_f(float x) {
  const float s = 0.7978845608028654f;
  const float cube = 0.044715f * x * x * x;
  const float t = tanhf(s * (x + cube));
  const float sech2 = 1.0f - t * t;
  return 0.5f * (1.0f + t) + 0.5f * x * sech2 * s * (1.0f + 3.0f * 0.044715f * x * x);
}

}  // namespace zt::cuda
