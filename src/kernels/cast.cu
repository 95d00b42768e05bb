#include "kernels/cast.h"
#include <algorithm>

#include "kernels/cuda_common.cuh"

namespace zt::cuda {

// dst (n) = src (n) converted; grid-stride so any n works with a bounded grid.
template <class Dst, class Src>
__global__ void cast_kernel(Dst* dst, const Src* src, size_t n) {
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    dst[i] = from_float<Dst>(to_float(src[i]));
}

template <class Dst, class Src>
void cast(Dst* dst, const Src* src, size_t n, cudaStream_t stream) {
  if (n == 0) return;
  const int block = 256;
  const int grid = int(std::min<size_t>((n + block - 1) / block, 65535));
  cast_kernel<Dst, Src><<<grid, block, 0, stream>>>(dst, src, n);
  ZT_CHECK_LAUNCH();
}

template void cast<float, __nv_bfloat16>(float*, const __nv_bfloat16*, size_t, cudaStream_t);
template void cast<__nv_bfloat16, float>(__nv_bfloat16*, const float*, size_t, cudaStream_t);
template void cast<float, float>(float*, const float*, size_t, cudaStream_t);

}  // namespace zt::cuda
