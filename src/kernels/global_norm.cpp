// Sum of squares (for the global gradient norm), CPU reference.
#include "kernels/global_norm.h"

#include <algorithm>
#include <vector>

namespace zt::cpu {

// The buffer is cut into fixed-size chunks (not one chunk per thread), each summed in double, and
// the chunk sums are added in order: the result is the same bit for bit for any thread count.
template <class T>
double sum_squares(const T* x, size_t n) {
  constexpr size_t kChunk = size_t(1) << 16;
  const size_t nchunks = (n + kChunk - 1) / kChunk;
  if (nchunks == 0) return 0.0;
  std::vector<double> partial(nchunks);
#pragma omp parallel for schedule(static) if (nchunks > 1)
  for (size_t k = 0; k < nchunks; k++) {
    const size_t i0 = k * kChunk, i1 = std::min(n, i0 + kChunk);
    double s = 0.0;
#pragma omp simd reduction(+ : s)
    for (size_t i = i0; i < i1; i++) s += double(x[i]) * double(x[i]);
    partial[k] = s;
  }
  double total = 0.0;
  for (double s : partial) total += s;
  return total;
}

template double sum_squares<float>(const float*, size_t);
template double sum_squares<double>(const double*, size_t);

}  // namespace zt::cpu
