// Sum of squares of a buffer, in double, so that shard partial sums add up exactly enough across ranks.
#pragma once
#include <cstddef>
namespace zt::cpu {
template <class T> double sum_squares(const T* x, size_t n);
}  // namespace zt::cpu
