// Sums of squares of gradient slices for the global norm, kept apart by what the norm does with
// them under tensor parallelism (docs/design.md §3.13): a tensor split over the tensor group has a
// different part on every tensor rank (all of them count), a replicated one the same gradient on
// every rank (counted once, on tensor rank 0). Without tensor parallelism everything is `split`,
// summed by one call per slice as before (the same bits).
#pragma once
#include <algorithm>
#include <cstddef>

#include "model/layout.h"
#include "model/tensor_parallel.h"

namespace zt {

struct GradSquares {
  double split = 0.0, replicated = 0.0;
  GradSquares& operator+=(const GradSquares& o) {
    split += o.split;
    replicated += o.replicated;
    return *this;
  }
  // This rank's share of the squared norm: the replicated part on one tensor rank only.
  double mine(bool counts_replicated) const { return split + (counts_replicated ? replicated : 0.0); }
};

// Elements [lo, lo + n) of unit u's flat slice (x points at element lo), tensor by tensor when
// by_tensor, else in one call.
template <class Ops>
GradSquares unit_grad_squares(const ParamLayout& layout, int u, size_t lo, size_t n, const typename Ops::T* x,
                              bool by_tensor) {
  GradSquares s;
  if (!by_tensor) {
    s.split = Ops::sum_squares(x, n);
    return s;
  }
  for (int k : layout.units()[size_t(u)].tensors) {
    const UnitPiece p = layout.piece(u, k);
    const size_t a = std::max(lo, p.at), b = std::min(lo + n, p.at + p.count);
    if (a >= b) continue;
    const double ss = Ops::sum_squares(x + (a - lo), b - a);
    (split_over_tensor(layout.tensors()[size_t(k)].id) ? s.split : s.replicated) += ss;
  }
  return s;
}

}  // namespace zt
