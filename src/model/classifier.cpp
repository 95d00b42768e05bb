// The tied LM head (logits = lnf @ wte^T over the padded vocabulary) and its cross-entropy, in three
// variants (docs/design.md §3.11). P = positions per chunk (GPT::classifier_rows), N = B * Tn:
//
//   whole     P = N, or no targets (sampling: only the last chunk's rows). The (N, Vp) logits
//             exist; forward overwrites them with dlogits; backward reads them for the input
//             gradient first and for the embedding's weight gradient at the end.
//   chunks    one embedding unit: P rows of logits at a time; forward keeps the losses and, with
//             the gradient on, takes both gradients from each chunk while its logits exist (the
//             logits are never recomputed), so the embedding's gradient is open from forward's
//             head to the end of backward.
//   regather  chunks over a split embedding (stage 3): vocabulary chunks outer (each unit gathered
//             once), positions inner, an online log-sum-exp per position across the units;
//             backward recomputes each chunk's logits twice: for the input gradient at the top,
//             and for each unit's weight gradient at the end, the unit gathered once more
//             (GPT::classifier_regathers).
//
// Hooks are called as model/gpt.h's UnitHooks describes; each unit's columns of the logits are
// computed between before_forward(e) / after_forward(e) or before_backward(e) / after_backward(e).
#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#include "backend/ops_cpu.h"
#if ZT_HAVE_CUDA
#include "backend/ops_cuda.h"
#endif
#include "model/gpt.h"

namespace zt {

template <class Ops>
typename GPT<Ops>::Head GPT<Ops>::head(int N, bool with_targets) const {
  if (!with_targets || std::min(cls_rows_, N) == N) return Head::whole;
  return layout_.embedding_units() == 1 ? Head::chunks : Head::regather;
}

template <class Ops>
double GPT<Ops>::classifier_forward(const int* targets, int N, bool write_dlogits, S dloss) {
  const int C = cfg_.C, E = layout_.embedding_units();
  const int P = std::min(cls_rows_, N);
  logits_row0_ = targets ? 0 : N - P;  // logits_row() reads the last position
  switch (head(N, targets != nullptr)) {
    case Head::whole:
      for (int e = 0; e < E; ++e) {
        const VocabRows r = layout_.vocab_rows(e);
        // The rows in the order their parameters arrive (UnitHooks::head_rows; empty: all at once).
        const std::vector<VocabRows> ranges = targets ? hooks_->head_rows(e) : std::vector<VocabRows>{};
        hooks_->before_forward(e);
        const T* lnf = acts_.lnf + size_t(logits_row0_) * size_t(C);
        if (ranges.empty())
          Ops::matmul_forward(acts_.logits + r.row0, lnf, wte_rows(e), nullptr, N - logits_row0_, C, r.rows, cfg_.vocab());
        for (size_t k = 0; k < ranges.size(); ++k) {
          const VocabRows q = ranges[k];
          hooks_->before_head_rows(e, int(k));
          Ops::matmul_forward(acts_.logits + r.row0 + q.row0, lnf, wte_rows(e) + size_t(q.row0) * size_t(C), nullptr,
                              N - logits_row0_, C, q.rows, cfg_.vocab());
        }
        hooks_->after_forward(e);
      }
      if (!targets) return 0.0;
      if (cfg_.tp > 1)
        vocab_parallel_xent(targets, 0, N, write_dlogits, dloss);
      else
        Ops::softmax_xent(acts_.logits, acts_.losses, targets, dloss, N, cfg_.V, cfg_.Vp, write_dlogits);
      break;
    case Head::chunks: {
      // With the gradient on, each chunk's gradients are taken here, while its logits exist:
      // backward has nothing of the head left to compute.
      hooks_->before_forward(0);
      // The input gradient's home until backward: the shared scratch, or the slot's own on a
      // pipeline's last stage (several micro-batches' forwards may come before their backwards).
      T* dlnf = cfg_.whole_L > 0 ? acts_.dlnf : gs_.dC;
      if (write_dlogits) {
        hooks_->before_grads(0);
        Ops::zero(dlnf, size_t(N) * size_t(C));
      }
      const int Vp = cfg_.vocab();
      for (int c0 = 0; c0 < N; c0 += P) {
        const int n = std::min(P, N - c0);
        const T* lnf = acts_.lnf + size_t(c0) * size_t(C);
        Ops::matmul_forward(acts_.logits, lnf, wte_rows(0), nullptr, n, C, Vp, Vp);
        if (cfg_.tp > 1)
          vocab_parallel_xent(targets + c0, c0, n, write_dlogits, dloss);
        else
          Ops::softmax_xent(acts_.logits, acts_.losses + c0, targets + c0, dloss, n, cfg_.V, Vp, write_dlogits);
        if (write_dlogits)
          Ops::matmul_backward(dlnf + size_t(c0) * size_t(C), wte_grad_rows(0), nullptr, acts_.logits, lnf,
                               wte_rows(0), n, C, Vp, scratch_.data(), Vp);
      }
      hooks_->after_forward(0);
      break;
    }
    case Head::regather:
      // The target's logit waits in losses until the last unit (tensor parallelism: 0 where another
      // tensor rank holds the target; the units' running statistics are then folded over the group).
      if (cfg_.tp > 1) zero_stats(acts_.losses, size_t(N));
      for (int e = 0; e < E; ++e) {
        const VocabRows r = layout_.vocab_rows(e);
        hooks_->before_forward(e);
        for (int c0 = 0; c0 < N; c0 += P) {
          const int n = std::min(P, N - c0);
          Ops::matmul_forward(acts_.logits, acts_.lnf + size_t(c0) * size_t(C), wte_rows(e), nullptr, n, C, r.rows,
                              cfg_.vocab());
          Ops::xent_chunk_partial(acts_.logits, cfg_.vocab(), n, cfg_.vocab_row0() + r.row0, r.rows, cfg_.V,
                                  targets + c0, acts_.lse + c0, acts_.lse_sum + c0, acts_.losses + c0, e == 0);
        }
        hooks_->after_forward(e);
      }
      if (cfg_.tp > 1) fold_loss_stats(acts_.lse, acts_.lse_sum, acts_.losses, size_t(N));
      Ops::xent_chunk_finish(acts_.losses, acts_.lse, acts_.lse_sum, acts_.losses, N);
      break;
  }
  last_dloss_ = write_dlogits ? dloss : S(0);
  std::vector<S> losses(static_cast<size_t>(N));
  Ops::d2h(losses.data(), acts_.losses, losses.size() * sizeof(S));  // waits for the forward to finish
  double sum = 0.0;
  for (int i = 0; i < N; ++i) sum += double(losses[size_t(i)]);
  return sum / double(N);
}

template <class Ops>
const typename GPT<Ops>::T* GPT<Ops>::classifier_backward() {
  // Whole: dlnf = sum over units of dlogits[:, rows] @ W_rows; the weight gradient waits for the
  // end, where it needs no parameters (UnitHooks). Chunks: each chunk's logits recomputed with the
  // parameters gathered here, turned into dlogits by the same op as forward, both gradients taken
  // from them at once. Regather: the input gradient here, the weight gradient at the end.
  const int C = cfg_.C, E = layout_.embedding_units(), N = last_B_ * last_T_;
  const int P = std::min(cls_rows_, N);
  void* scratch = scratch_.data();
  const Head h = head(N, true);
  if (h != Head::chunks) Ops::zero(gs_.dC, size_t(N) * size_t(C));
  switch (h) {
    case Head::whole:
      for (int e = E - 1; e >= 0; --e) {
        const VocabRows r = layout_.vocab_rows(e);
        hooks_->before_backward(e);
        Ops::matmul_backward(gs_.dC, nullptr, nullptr, acts_.logits + r.row0, acts_.lnf, wte_rows(e), N, C, r.rows,
                             scratch, cfg_.vocab());
        hooks_->after_backward(e);
      }
      break;
    case Head::chunks:
      // Both gradients were taken in forward. The hooks still mark the head's place in backward
      // (the unit is still gathered from forward's head: the gatherer's schedule is unchanged).
      hooks_->before_backward(0);
      hooks_->after_backward(0);
      if (cfg_.whole_L > 0) Ops::copy(gs_.dC, acts_.dlnf, size_t(N) * size_t(C));
      break;
    case Head::regather:
      for (int e = E - 1; e >= 0; --e) {
        hooks_->before_backward(e);
        for (int c0 = 0; c0 < N; c0 += P)
          classifier_chunk_grad(e, c0, std::min(P, N - c0), gs_.dC + size_t(c0) * size_t(C), nullptr, scratch);
        hooks_->after_backward(e);
      }
      break;
  }
  // Each tensor rank's vocabulary rows' part of dlnf, summed (sequence parallelism: each rank keeps
  // the sum at its positions).
  if (cfg_.sp) {
    tensor_scatter(gs_.dC, gs_.dchunk, cfg_.sp_rows(size_t(N)) * size_t(C));
    return gs_.dchunk;
  }
  tensor_sum(gs_.dC, size_t(N) * size_t(C));
  return gs_.dC;
}

template <class Ops>
void GPT<Ops>::embedding_grads(bool with_head, bool with_lookup) {
  // Unit by unit: LM-head part dW_rows += dlogits[:, rows]^T @ lnf, then the lookup's rows (and
  // wpe's gradient in its unit). The same order of sums as one unit.
  const int B = last_B_, Tn = last_T_, C = cfg_.C, N = B * Tn;
  const int E = layout_.embedding_units(), P = std::min(cls_rows_, N);
  const Head h = head(N, true);
  void* scratch = scratch_.data();
  for (int e = E - 1; e >= 0; --e) {
    const VocabRows r = layout_.vocab_rows(e);
    if (!with_head) {  // the first of several pipeline stages: the lookup's part only
      hooks_->before_grads(e);
    } else if (h == Head::whole) {
      hooks_->before_grads(e);
      Ops::matmul_backward(nullptr, wte_grad_rows(e), nullptr, acts_.logits + r.row0, acts_.lnf, nullptr, N, C, r.rows,
                           scratch, cfg_.vocab());
    } else if (h == Head::regather) {
      hooks_->before_backward(e);  // the unit's parameters again: its logits are recomputed
      hooks_->before_grads(e);
      for (int c0 = 0; c0 < N; c0 += P) classifier_chunk_grad(e, c0, std::min(P, N - c0), nullptr, wte_grad_rows(e), scratch);
    }
    // (Chunks: before_grads(0) and the LM-head part came with the input gradient.)
    if (with_lookup)
      Ops::encoder_backward(wte_grad_rows(e), e == layout_.wpe_unit() ? grad(ParamId::wpe) : nullptr,
                            cfg_.sp ? acts_.gathered : gs_.dresidual,
                            acts_.inputs, B, Tn, C, cfg_.vocab_row0() + r.row0, r.rows, scratch);
    if (with_head && h == Head::regather) hooks_->after_backward(e);
    hooks_->grads_ready(e);
  }
}

template <class Ops>
void GPT<Ops>::classifier_chunk_grad(int e, int c0, int n, T* dlnf, T* dwte, void* scratch) {
  const VocabRows r = layout_.vocab_rows(e);
  const int C = cfg_.C, Vp = cfg_.vocab();
  const T* lnf = acts_.lnf + size_t(c0) * size_t(C);
  Ops::matmul_forward(acts_.logits, lnf, wte_rows(e), nullptr, n, C, r.rows, Vp);
  Ops::xent_chunk_grad(acts_.logits, Vp, n, cfg_.vocab_row0() + r.row0, r.rows, cfg_.V, acts_.targets + c0,
                       acts_.lse + c0, last_dloss_);
  Ops::matmul_backward(dlnf, dwte, nullptr, acts_.logits, lnf, dlnf ? wte_rows(e) : nullptr, n, C, r.rows, scratch, Vp);
}

// Vocabulary-parallel cross-entropy (model/tensor_parallel.h) of positions [c0, c0 + n), whose
// logits start the logits buffer: this rank's logits are columns [vocab_row0, + vocab()) of every
// row. Each rank folds its columns into a max and a sum of exp per row (xent_chunk_partial, as a
// split embedding's chunks are folded), takes the target's logit where it holds the target (0
// elsewhere), fold_loss_stats combines the tp triples, and the loss and this rank's dlogits follow
// from the log-sum-exp. The logits never move.
template <class Ops>
void GPT<Ops>::vocab_parallel_xent(const int* targets, int c0, int n, bool write_dlogits, S dloss) {
  const int Vl = cfg_.vocab(), r0 = cfg_.vocab_row0();
  S *lse = acts_.lse + c0, *lse_sum = acts_.lse_sum + c0, *losses = acts_.losses + c0;
  zero_stats(losses, size_t(n));
  Ops::xent_chunk_partial(acts_.logits, Vl, n, r0, Vl, cfg_.V, targets, lse, lse_sum, losses, true);
  fold_loss_stats(lse, lse_sum, losses, size_t(n));
  Ops::xent_chunk_finish(losses, lse, lse_sum, losses, n);
  if (write_dlogits) Ops::xent_chunk_grad(acts_.logits, Vl, n, r0, Vl, cfg_.V, targets, lse, dloss);
}

// This rank's (max, sum of exp, target logit) of n positions, in the backend's memory, become the
// whole vocabulary's on every tensor rank, in place. fp32 whatever T is: they travel as bytes (no
// rounding to T) through loss_stats, and are folded on the host in rank order, in double (the same
// bits on every rank; the target logit is one rank's value plus zeros: exact).
template <class Ops>
void GPT<Ops>::fold_loss_stats(S* max, S* sum, S* target, size_t n) {
  ZT_ASSERT(tensor_group_ != nullptr);
  const int tp = cfg_.tp;
  S* mine = acts_.loss_stats;  // (3, n)
  S* all = mine + 3 * n;       // (tp, 3, n)
  std::vector<S> h(3 * n * size_t(tp)), folded(3 * n);
  Ops::d2h(h.data(), max, n * sizeof(S));
  Ops::d2h(h.data() + n, sum, n * sizeof(S));
  Ops::d2h(h.data() + 2 * n, target, n * sizeof(S));
  Ops::h2d(mine, h.data(), 3 * n * sizeof(S));
  tensor_group_->all_gather_bytes(mine, all, 3 * n * sizeof(S));
  Ops::d2h(h.data(), all, h.size() * sizeof(S));
  for (size_t i = 0; i < n; ++i) {
    double m = -std::numeric_limits<double>::infinity(), total = 0.0, x = 0.0;
    for (int q = 0; q < tp; ++q) {
      const S* part = h.data() + size_t(q) * 3 * n;
      const double mq = part[i], sq = part[n + i];
      x += double(part[2 * n + i]);
      if (sq == 0.0) continue;  // a rank with no real vocabulary column
      const double M = std::max(m, mq);
      total = total * std::exp(m - M) + sq * std::exp(mq - M);
      m = M;
    }
    folded[i] = S(m);
    folded[n + i] = S(total);
    folded[2 * n + i] = S(x);
  }
  Ops::h2d(max, folded.data(), n * sizeof(S));
  Ops::h2d(sum, folded.data() + n, n * sizeof(S));
  Ops::h2d(target, folded.data() + 2 * n, n * sizeof(S));
}

template <class Ops>
void GPT<Ops>::zero_stats(S* p, size_t n) {
  const std::vector<S> zeros(n);
  Ops::h2d(p, zeros.data(), n * sizeof(S));
}

// The members defined here, for the backends gpt.cpp instantiates the class with.
#define ZT_GPT_CLASSIFIER_MEMBERS(O)                                                   \
  template typename GPT<O>::Head GPT<O>::head(int, bool) const;                        \
  template double GPT<O>::classifier_forward(const int*, int, bool, GPT<O>::S);        \
  template const GPT<O>::T* GPT<O>::classifier_backward();                             \
  template void GPT<O>::embedding_grads(bool, bool);                                         \
  template void GPT<O>::vocab_parallel_xent(const int*, int, int, bool, GPT<O>::S);    \
  template void GPT<O>::fold_loss_stats(GPT<O>::S*, GPT<O>::S*, GPT<O>::S*, size_t);  \
  template void GPT<O>::zero_stats(GPT<O>::S*, size_t);                               \
  template void GPT<O>::classifier_chunk_grad(int, int, int, GPT<O>::T*, GPT<O>::T*, void*);
ZT_GPT_CLASSIFIER_MEMBERS(CpuOps<float>)
ZT_GPT_CLASSIFIER_MEMBERS(CpuOps<double>)
#if ZT_HAVE_CUDA
ZT_GPT_CLASSIFIER_MEMBERS(CudaOps<float>)
ZT_GPT_CLASSIFIER_MEMBERS(CudaOps<bf16>)
#endif
#undef ZT_GPT_CLASSIFIER_MEMBERS

}  // namespace zt
