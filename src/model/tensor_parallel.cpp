#include "model/tensor_parallel.h"

#include "runtime/error.h"

namespace zt {

TensorSplit tensor_split(ParamId id) {
  switch (id) {
    case ParamId::wte: return TensorSplit::vocab_rows;
    case ParamId::qkvw:
    case ParamId::qkvb: return TensorSplit::head_rows;
    case ParamId::fcw:
    case ParamId::fcb: return TensorSplit::rows;
    case ParamId::attprojw:
    case ParamId::fcprojw: return TensorSplit::input_cols;
    default: return TensorSplit::replicated;
  }
}

size_t global_index(const TensorSlot& s, const GPTConfig& cfg, size_t i) {
  ZT_ASSERT(i < s.numel);
  if (cfg.tp == 1) return i;
  const size_t cols = s.shape.size() == 2 ? size_t(s.shape[1]) : 1;  // local columns (in)
  const size_t row = i / cols, col = i % cols;
  switch (tensor_split(s.id)) {
    case TensorSplit::replicated: return i;
    case TensorSplit::vocab_rows:  // rows [vocab_row0, + Vp/tp)
    case TensorSplit::rows:        // rows [r 4C/tp, + 4C/tp)
      return size_t(cfg.tp_rank) * s.numel + i;
    case TensorSplit::head_rows: {  // rows [r C/tp, + C/tp) of each of Q, K, V
      const size_t per = size_t(cfg.attn_C());
      const size_t grow = (row / per) * size_t(cfg.C) + size_t(cfg.tp_rank) * per + row % per;
      return grow * cols + col;
    }
    case TensorSplit::input_cols:  // columns [r in/tp, + in/tp) of every row
      return row * cols * size_t(cfg.tp) + size_t(cfg.tp_rank) * cols + col;
  }
  return i;
}

size_t global_run(const TensorSlot& s, const GPTConfig& cfg, size_t i) {
  ZT_ASSERT(i < s.numel);
  if (cfg.tp == 1) return s.numel - i;
  const size_t cols = s.shape.size() == 2 ? size_t(s.shape[1]) : 1;
  switch (tensor_split(s.id)) {
    case TensorSplit::replicated:
    case TensorSplit::vocab_rows:
    case TensorSplit::rows: return s.numel - i;
    case TensorSplit::head_rows: {
      const size_t part = size_t(cfg.attn_C()) * cols;  // one of Q, K, V here
      return (i / part + 1) * part - i;
    }
    case TensorSplit::input_cols: return (i / cols + 1) * cols - i;
  }
  return 1;
}

uint64_t tensor_bytes_per_micro_step(const GPTConfig& cfg, int B, int Tn, const Recompute& rc, int elem) {
  const uint64_t T = uint64_t(cfg.tp), E = uint64_t(elem);
  if (T == 1) return 0;
  const uint64_t N = uint64_t(B) * uint64_t(Tn), NC = N * uint64_t(cfg.C);
  auto all_reduce = [&](uint64_t n) { return 2 * (T - 1) * E * n / T; };
  const uint64_t L = uint64_t(cfg.L), recomputed = uint64_t(rc.blocks_recomputed_before(cfg.L));
  const uint64_t loss = (T - 1) * 3 * 4 * N;  // the gather of each position's (max, sum of exp, target logit), fp32
  if (!cfg.sp) {
    const uint64_t sums = 1 + 2 * L + 1 + 2 * L + recomputed;  // lookup, blocks; dlnf, blocks; recompute
    return sums * all_reduce(NC) + loss;
  }
  // Sequence parallelism: reduce-scatters and all-gathers of (N / T, C) parts, (T - 1) E NC / T each.
  const uint64_t half = (T - 1) * E * (NC / T);
  // forward: the lookup's RS, 4 per block, the final norm's AG; backward: dlnf's RS, 6 per block,
  // the embedding's AG of dresidual; recompute: AG, RS, AG per block; the LayerNorms' weight
  // gradients: an all-reduce of 2C per LayerNorm (2 per block and the final one).
  const uint64_t parts = 1 + 4 * L + 1 + 1 + 6 * L + 1 + 3 * recomputed;
  return parts * half + (2 * L + 1) * all_reduce(2 * uint64_t(cfg.C)) + loss;
}

uint64_t tensor_collectives_per_micro_step(const GPTConfig& cfg, const Recompute& rc) {
  if (cfg.tp == 1) return 0;
  const uint64_t L = uint64_t(cfg.L), recomputed = uint64_t(rc.blocks_recomputed_before(cfg.L));
  if (!cfg.sp) return 1 + 2 * L + 1 + 2 * L + recomputed + 1;  // tensor_bytes_per_micro_step's sums, the loss's gather
  return (1 + 4 * L + 1 + 1 + 6 * L + 1 + 3 * recomputed) + (2 * L + 1) + 1;  // parts, LayerNorm weights, loss
}

}  // namespace zt
