// GELU (tanh approximation), CUDA version (see gelu.cpp for the reference; gelu_f / gelu_grad_f in
// cuda_common.cuh are the same formulas in fp32).
//
// One 128-bit packet per thread, like residual.cu; the leftover n % packet elements are done one by
// one by the first threads of the grid.
#include <cstdint>

#include "kernels/cuda_common.cuh"
#include "kernels/gelu.h"

namespace zt::cuda {
namespace {

constexpr int kBlock = 256;

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// out (n) = gelu(inp (n)). out may be inp: each element is read before it is written, by one thread.
template <class T>
__global__ void gelu_forward_kernel(T* out, const T* inp, size_t packets, int tail) {
  constexpr int P = Packed128<T>::size;
  const size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < packets) {
    const Packed128<T> x = load128(inp + i * P);
    Packed128<T> y;
#pragma unroll
    for (int k = 0; k < P; k++) y[k] = from_float<T>(gelu_f(to_float(x[k])));
    store128(out + i * P, y);
  }
  if (i < size_t(tail)) {
    const size_t j = packets * P + i;
    out[j] = from_float<T>(gelu_f(to_float(inp[j])));
  }
}

// dinp (n) = gelu'(inp (n)) * dout (n). dinp may be dout: each thread reads its packet before it
// writes it. dout is read once and never again: streaming load.
template <class T>
__global__ void gelu_backward_kernel(T* dinp, const T* inp, const T* dout, size_t packets, int tail) {
  constexpr int P = Packed128<T>::size;
  const size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < packets) {
    const Packed128<T> x = load128(inp + i * P);
    const Packed128<T> g = load128cs(dout + i * P);
    Packed128<T> d;
#pragma unroll
    for (int k = 0; k < P; k++) d[k] = from_float<T>(gelu_grad_f(to_float(x[k])) * to_float(g[k]));
    store128(dinp + i * P, d);
  }
  if (i < size_t(tail)) {
    const size_t j = packets * P + i;
    dinp[j] = from_float<T>(gelu_grad_f(to_float(inp[j])) * to_float(dout[j]));
  }
}

}  // namespace

template <class T>
void gelu_forward(T* out, const T* inp, size_t n, cudaStream_t stream) {
  if (n == 0) return;
  ZT_REQUIRE(aligned16(out) && aligned16(inp), "gelu_forward: pointers must be 16-byte aligned");
  constexpr int P = Packed128<T>::size;
  const size_t packets = n / P;
  const int grid = packets > 0 ? ceil_div(packets, kBlock) : 1;  // at least one block for the tail
  gelu_forward_kernel<T><<<grid, kBlock, 0, stream>>>(out, inp, packets, int(n % P));
  ZT_CHECK_LAUNCH();
}

template <class T>
void gelu_backward(T* dinp, const T* inp, const T* dout, size_t n, cudaStream_t stream) {
  if (n == 0) return;
  ZT_REQUIRE(aligned16(dinp) && aligned16(inp) && aligned16(dout), "gelu_backward: pointers must be 16-byte aligned");
  constexpr int P = Packed128<T>::size;
  const size_t packets = n / P;
  const int grid = packets > 0 ? ceil_div(packets, kBlock) : 1;
  gelu_backward_kernel<T><<<grid, kBlock, 0, stream>>>(dinp, inp, dout, packets, int(n % P));
  ZT_CHECK_LAUNCH();
}

template void gelu_forward<float>(float*, const float*, size_t, cudaStream_t);
template void gelu_forward<__nv_bfloat16>(__nv_bfloat16*, const __nv_bfloat16*, size_t, cudaStream_t);
template void gelu_backward<float>(float*, const float*, const float*, size_t, cudaStream_t);
template void gelu_backward<__nv_bfloat16>(__nv_bfloat16*, const __nv_bfloat16*, const __nv_bfloat16*, size_t,
                                           cudaStream_t);

}  // namespace zt::cuda
