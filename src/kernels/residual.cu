// Residual add, CUDA version (see residual.cpp for the reference).
//
// One 128-bit packet per thread: the add is pure memory traffic, so the only thing that matters is
// moving whole 16-byte chunks. n need not be a multiple of the packet size: the few leftover
// elements at the end are done one by one by the first threads of the grid.
#include <cstdint>

#include "kernels/cuda_common.cuh"
#include "kernels/residual.h"

namespace zt::cuda {
namespace {

constexpr int kBlock = 256;

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// out (n) = a (n) + b (n); `packets` whole packets, then `tail` (< packet size) scalars.
template <class T>
__global__ void residual_forward_kernel(T* out, const T* a, const T* b, size_t packets, int tail) {
  constexpr int P = Packed128<T>::size;
  const size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < packets) {
    const Packed128<T> pa = load128(a + i * P), pb = load128(b + i * P);
    Packed128<T> po;
#pragma unroll
    for (int k = 0; k < P; k++) po[k] = from_float<T>(to_float(pa[k]) + to_float(pb[k]));
    store128(out + i * P, po);
  }
  if (i < size_t(tail)) {
    const size_t j = packets * P + i;
    out[j] = from_float<T>(to_float(a[j]) + to_float(b[j]));
  }
}

}  // namespace

template <class T>
void residual_forward(T* out, const T* a, const T* b, size_t n, cudaStream_t stream) {
  if (n == 0) return;
  ZT_REQUIRE(aligned16(out) && aligned16(a) && aligned16(b), "residual_forward: pointers must be 16-byte aligned");
  constexpr int P = Packed128<T>::size;
  const size_t packets = n / P;
  const int tail = int(n % P);
  const int grid = packets > 0 ? ceil_div(packets, kBlock) : 1;  // at least one block for the tail
  residual_forward_kernel<T><<<grid, kBlock, 0, stream>>>(out, a, b, packets, tail);
  ZT_CHECK_LAUNCH();
}

template void residual_forward<float>(float*, const float*, const float*, size_t, cudaStream_t);
template void residual_forward<__nv_bfloat16>(__nv_bfloat16*, const __nv_bfloat16*, const __nv_bfloat16*, size_t,
                                               cudaStream_t);

}  // namespace zt::cuda
