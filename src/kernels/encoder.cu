// Token + position embedding, CUDA version (see encoder.cpp for the reference).
//
// Backward has to be deterministic, and dwte is the hard part: one token can sit at many
// positions, so the natural "one thread per position" scheme would need float atomics on the same
// dwte row, whose summation order changes run to run. Instead:
//   1. sort the (token, position) pairs by token on the device (CUB radix sort, which is stable, so
//      equal tokens keep their position order);
//   2. one block per run of equal tokens adds that run's dout rows, in position order, in fp32,
//      starting from the current dwte row, and writes the row once.
// Each dwte element is therefore summed in exactly the order the CPU reference uses (for fp32 the
// results are bitwise identical), whatever the launch shape. dwpe needs no sort: one thread per
// (t, channel packet) walks b in order.
#include <cub/device/device_radix_sort.cuh>

#include <algorithm>
#include <cstdint>

#include "kernels/cuda_common.cuh"
#include "kernels/encoder.h"

namespace zt::cuda {
namespace {

constexpr int kBlock = 256;

// out (B*T, C): one thread per (bt, channel packet). Only vocabulary rows [row0, row0 + rows):
// out = wpe[t] (+ wte row), or without wpe out += wte row (encoder.h).
template <class T>
__global__ void encoder_forward_kernel(T* __restrict__ out, const int* __restrict__ tokens, const T* __restrict__ wte,
                                       const T* __restrict__ wpe, int BT, int Tn, int C, int row0, int rows) {
  constexpr int P = Packed128<T>::size;
  const int packets_per_row = C / P;
  const size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= size_t(BT) * packets_per_row) return;
  const int bt = int(i / packets_per_row);
  const int c = int(i % packets_per_row) * P;
  const int t = bt % Tn;
  const int row = tokens[bt] - row0;
  const bool mine = row >= 0 && row < rows;
  if (!mine && !wpe) return;
  T* dst = out + size_t(bt) * C + c;
  const Packed128<T> p = wpe ? load128(wpe + size_t(t) * C + c) : load128(dst);
  if (!mine) {
    store128(dst, p);
    return;
  }
  const Packed128<T> w = load128(wte + size_t(row) * C + c);
  Packed128<T> o;
#pragma unroll
  for (int k = 0; k < P; k++) o[k] = from_float<T>(to_float(w[k]) + to_float(p[k]));
  store128(dst, o);
}

// dwpe (T, C) += sum_b dout (B, T, C): one thread per (t, channel packet), b in order.
template <class T>
__global__ void encoder_backward_wpe_kernel(T* __restrict__ dwpe, const T* __restrict__ dout, int B, int Tn, int C) {
  constexpr int P = Packed128<T>::size;
  const int packets_per_row = C / P;
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= Tn * packets_per_row) return;
  const int t = i / packets_per_row;
  const int c = (i % packets_per_row) * P;
  T* dst = dwpe + size_t(t) * C + c;
  const Packed128<T> d = load128(dst);
  float acc[P];
#pragma unroll
  for (int k = 0; k < P; k++) acc[k] = to_float(d[k]);
  for (int b = 0; b < B; b++) {
    const Packed128<T> g = load128(dout + (size_t(b) * Tn + t) * C + c);
#pragma unroll
    for (int k = 0; k < P; k++) acc[k] += to_float(g[k]);
  }
  Packed128<T> o;
#pragma unroll
  for (int k = 0; k < P; k++) o[k] = from_float<T>(acc[k]);
  store128(dst, o);
}

// positions (n) = 0, 1, ..., n-1: the values carried along by the sort.
__global__ void iota_kernel(int* positions, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) positions[i] = i;
}

// dwte (V, C) += dout rows grouped by token. Grid: one block per sorted index i (BT blocks); only
// the block at the first index of a run of equal tokens works, adding the run's rows in order.
// Threads split the row into channel packets.
template <class T>
__global__ void encoder_backward_wte_kernel(T* __restrict__ dwte, const T* __restrict__ dout,
                                            const int* __restrict__ sorted_tokens,
                                            const int* __restrict__ sorted_positions, int BT, int C, int row0,
                                            int rows) {
  const int i = blockIdx.x;
  const int token = sorted_tokens[i];
  if (i > 0 && sorted_tokens[i - 1] == token) return;  // not the start of a run
  if (token < row0 || token - row0 >= rows) return;    // another chunk's row
  int end = i + 1;
  while (end < BT && sorted_tokens[end] == token) end++;

  constexpr int P = Packed128<T>::size;
  T* row = dwte + size_t(token - row0) * C;
  for (int c = threadIdx.x * P; c < C; c += blockDim.x * P) {
    const Packed128<T> d = load128(row + c);
    float acc[P];
#pragma unroll
    for (int k = 0; k < P; k++) acc[k] = to_float(d[k]);
    // No stores inside the loop, so the unrolled loads can all be in flight at once; the adds
    // still happen in run (= position) order.
#pragma unroll 8
    for (int j = i; j < end; j++) {
      const Packed128<T> g = load128(dout + size_t(sorted_positions[j]) * C + c);
#pragma unroll
      for (int k = 0; k < P; k++) acc[k] += to_float(g[k]);
    }
    Packed128<T> o;
#pragma unroll
    for (int k = 0; k < P; k++) o[k] = from_float<T>(acc[k]);
    store128(row + c, o);
  }
}

// Scratch layout: three int arrays of BT entries, then CUB's temporary storage. Every piece starts
// on a 256-byte boundary (CUB also aligns its own piece, and asks for the padding in its size).
size_t align256(size_t x) { return (x + 255) / 256 * 256; }

// CUB's temporary storage for sorting BT (int key, int value) pairs, without a device. CUB's own size
// query (SortPairs with a null pointer) first asks the device which compiled architecture it runs
// (cub::PtxVersion), so it fails where no GPU is, and `train estimate` must size a CUDA run there
// (docs/design.md §3.5). The size depends only on that architecture's tuning policy, so ask CUB's
// dispatch for every architecture this file is compiled for (__CUDA_ARCH_LIST__; the device runs one
// of them) and take the largest: the run allocates the same, so estimate = tracked on any GPU, and
// SortPairs checks on the device that it got at least what that device's policy needs.
size_t sort_temp_bytes(int BT) {
#if ZT_EMU
  // The emulated CUB (test/emu) has no policies, and its size query needs no device.
  size_t bytes = 0;
  ZT_CHECK_CUDA(cub::DeviceRadixSort::SortPairs(nullptr, bytes, static_cast<const int*>(nullptr),
                                                static_cast<int*>(nullptr), static_cast<const int*>(nullptr),
                                                static_cast<int*>(nullptr), BT));
  return bytes;
#else
  // As cub::DeviceRadixSort::SortPairs (ascending, not in place, all 32 key bits) dispatches.
  using Offset = cub::detail::choose_offset_t<int>;
  using Dispatch = cub::DispatchRadixSort<cub::SortOrder::Ascending, int, int, Offset>;
  size_t most = 0;
  for (const int ptx : {__CUDA_ARCH_LIST__}) {
    cub::DoubleBuffer<int> keys(nullptr, nullptr), values(nullptr, nullptr);
    size_t bytes = 0;
    Dispatch d(nullptr, bytes, keys, values, Offset(BT), 0, int(sizeof(int) * 8), /*is_overwrite_okay=*/false,
               /*stream=*/nullptr, ptx);
    ZT_CHECK_CUDA(Dispatch::max_policy_t::Invoke(ptx, d));
    most = std::max(most, bytes);
  }
  return most;
#endif
}

}  // namespace

size_t encoder_backward_scratch_bytes(int B, int Tn) {
  const int BT = B * Tn;
  if (BT <= 0) return 0;
  return 3 * align256(size_t(BT) * sizeof(int)) + sort_temp_bytes(BT);
}

template <class T>
void encoder_forward(T* out, const int* tokens, const T* wte, const T* wpe, int B, int Tn, int C, cudaStream_t stream,
                     int row0, int rows) {
  constexpr int P = Packed128<T>::size;
  ZT_REQUIRE(C % P == 0, "encoder_forward: C (" << C << ") must be a multiple of " << P);
  const int BT = B * Tn;
  if (BT == 0 || C == 0) return;
  const size_t threads = size_t(BT) * (C / P);
  encoder_forward_kernel<T><<<ceil_div(threads, kBlock), kBlock, 0, stream>>>(out, tokens, wte, wpe, BT, Tn, C, row0,
                                                                                  rows);
  ZT_CHECK_LAUNCH();
}

template <class T>
void encoder_backward(T* dwte, T* dwpe, const T* dout, const int* tokens, int B, int Tn, int C, void* scratch,
                      cudaStream_t stream, int row0, int rows) {
  constexpr int P = Packed128<T>::size;
  ZT_REQUIRE(C % P == 0, "encoder_backward: C (" << C << ") must be a multiple of " << P);
  const int BT = B * Tn;
  if (BT == 0 || C == 0) return;
  ZT_REQUIRE(scratch != nullptr, "encoder_backward: scratch is null");

  if (dwpe) {
    const int wpe_threads = Tn * (C / P);
    encoder_backward_wpe_kernel<T><<<ceil_div(wpe_threads, kBlock), kBlock, 0, stream>>>(dwpe, dout, B, Tn, C);
    ZT_CHECK_LAUNCH();
  }

  // dwte: sort (token, position) by token, then one block per run.
  const size_t arr = align256(size_t(BT) * sizeof(int));
  char* base = static_cast<char*>(scratch);
  int* positions = reinterpret_cast<int*>(base);
  int* sorted_positions = reinterpret_cast<int*>(base + arr);
  int* sorted_tokens = reinterpret_cast<int*>(base + 2 * arr);
  void* sort_temp = base + 3 * arr;
  size_t sort_bytes = sort_temp_bytes(BT);

  iota_kernel<<<ceil_div(BT, kBlock), kBlock, 0, stream>>>(positions, BT);
  ZT_CHECK_LAUNCH();
  ZT_CHECK_CUDA(cub::DeviceRadixSort::SortPairs(sort_temp, sort_bytes, tokens, sorted_tokens, positions,
                                                sorted_positions, BT, 0, int(sizeof(int) * 8), stream));
  // Enough threads for one channel packet each (rounded to whole warps), at most kBlock; wider
  // rows loop.
  const int wte_block = std::min(kBlock, (C / P + kWarp - 1) / kWarp * kWarp);
  encoder_backward_wte_kernel<T><<<BT, wte_block, 0, stream>>>(dwte, dout, sorted_tokens, sorted_positions, BT, C,
                                                                          row0, rows);
  ZT_CHECK_LAUNCH();
}

template void encoder_forward<float>(float*, const int*, const float*, const float*, int, int, int, cudaStream_t, int,
                                     int);
template void encoder_forward<__nv_bfloat16>(__nv_bfloat16*, const int*, const __nv_bfloat16*, const __nv_bfloat16*,
                                             int, int, int, cudaStream_t, int, int);
template void encoder_backward<float>(float*, float*, const float*, const int*, int, int, int, void*, cudaStream_t, int,
                                      int);
template void encoder_backward<__nv_bfloat16>(__nv_bfloat16*, __nv_bfloat16*, const __nv_bfloat16*, const int*, int,
                                              int, int, void*, cudaStream_t, int, int);

}  // namespace zt::cuda
