// Emulation build: stands in for CUB's DeviceRadixSort (only SortPairs, the call encoder.cu makes).
// A stable sort on the CPU (CUB's radix sort is stable too), as one piece of work on `stream`.
#pragma once
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <type_traits>
#include <vector>

#include "emu_internal.h"

namespace cub {
struct DeviceRadixSort {
  // What the emulator asks for as temporary storage: CUB's real size differs by version; callers
  // must only rely on the value returned by the size query, which this keeps honest.
  static size_t temp_bytes(size_t n) { return 256 + n * 8; }

  template <class KeyT, class ValueT, class NumItemsT>
  static cudaError_t SortPairs(void* d_temp_storage, size_t& temp_storage_bytes, const KeyT* d_keys_in,
                               KeyT* d_keys_out, const ValueT* d_values_in, ValueT* d_values_out, NumItemsT num_items,
                               int begin_bit = 0, int end_bit = int(sizeof(KeyT) * 8), cudaStream_t stream = 0) {
    static_assert(std::is_integral_v<KeyT>, "emulated SortPairs: integral keys only");
    const size_t n = size_t(num_items);
    if (d_temp_storage == nullptr) {
      temp_storage_bytes = temp_bytes(n);
      return cudaSuccess;
    }
    if (temp_storage_bytes < temp_bytes(n))
      zt_emu::fatal("cub::DeviceRadixSort::SortPairs: temp_storage_bytes %zu < %zu (the size query's answer)",
                    temp_storage_bytes, temp_bytes(n));
    if (n == 0) return cudaSuccess;
    zt_emu::OpScope op(stream, "cub::DeviceRadixSort::SortPairs",
                       {{d_keys_in, n * sizeof(KeyT), false, zt_emu::Where::device, "d_keys_in"},
                        {d_values_in, n * sizeof(ValueT), false, zt_emu::Where::device, "d_values_in"},
                        {d_keys_out, n * sizeof(KeyT), true, zt_emu::Where::device, "d_keys_out"},
                        {d_values_out, n * sizeof(ValueT), true, zt_emu::Where::device, "d_values_out"},
                        {d_temp_storage, temp_storage_bytes, true, zt_emu::Where::device, "d_temp_storage"}});
    using U = std::make_unsigned_t<KeyT>;
    auto radix = [&](KeyT k) {
      U u = U(k);
      if (std::is_signed_v<KeyT>) u ^= U(U(1) << (sizeof(KeyT) * 8 - 1));  // CUB orders signed keys by value
      const int bits = end_bit - begin_bit;
      u >>= begin_bit;
      if (bits < int(sizeof(U) * 8)) u &= U((U(1) << bits) - 1);
      return u;
    };
    std::vector<size_t> idx(n);
    std::iota(idx.begin(), idx.end(), size_t(0));
    std::stable_sort(idx.begin(), idx.end(), [&](size_t a, size_t b) { return radix(d_keys_in[a]) < radix(d_keys_in[b]); });
    std::vector<KeyT> k(n);
    std::vector<ValueT> v(n);
    for (size_t i = 0; i < n; ++i) k[i] = d_keys_in[idx[i]], v[i] = d_values_in[idx[i]];
    std::memcpy(d_keys_out, k.data(), n * sizeof(KeyT));
    std::memcpy(d_values_out, v.data(), n * sizeof(ValueT));
    std::memset(d_temp_storage, 0xA5, temp_storage_bytes);  // scratch contents are undefined after the call
    return cudaSuccess;
  }
};
}  // namespace cub
