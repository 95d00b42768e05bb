// Element type conversion on the device (CUDA only; the CPU backend has one type per table).
#pragma once
#include <cstddef>
#if ZT_HAVE_CUDA
#include "runtime/cuda_check.h"
namespace zt::cuda {
// dst[i] = Dst(src[i]), round-to-nearest when narrowing. Instantiated for float <-> bf16 and same-type copies.
template <class Dst, class Src> void cast(Dst* dst, const Src* src, size_t n, cudaStream_t stream);
}  // namespace zt::cuda
#endif
