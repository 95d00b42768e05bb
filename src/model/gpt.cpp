#include "model/gpt.h"

#include <algorithm>
#include <array>
#include <cstdint>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <cstdio>
#include <initializer_list>
#include <memory>
#include <type_traits>

#include <unistd.h>

#include "backend/ops_cpu.h"
#if ZT_HAVE_CUDA
#include "backend/ops_cuda.h"
#endif
#include "runtime/checked.h"
#include "runtime/error.h"

namespace zt {

namespace {


// Counter-based normal deviates: the value of element i of stream k depends only on
// (seed, k, i), so any rank can initialise any shard of any tensor and get the same numbers.
inline uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}
inline double normal_at(uint64_t seed, uint64_t stream, uint64_t i) {
  const uint64_t base = splitmix64(splitmix64(seed) ^ (stream * 0xD1B54A32D192ED03ull));
  const double u1 = (double((splitmix64(base + 2 * i) >> 11)) + 1.0) * 0x1.0p-53;  // (0, 1]
  const double u2 = double(splitmix64(base + 2 * i + 1) >> 11) * 0x1.0p-53;         // [0, 1)
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2);
}


}  // namespace

// Host <-> backend memory, converting between the host type M and the storage type T.
template <class Ops>
void GPT<Ops>::upload(T* dst, const M* src, size_t n) {
  if constexpr (std::is_same_v<T, M>) {
    Ops::h2d(dst, src, n * sizeof(T));
  } else {
    std::vector<T> tmp(n);
    for (size_t i = 0; i < n; ++i) tmp[i] = T(src[i]);
    Ops::h2d(dst, tmp.data(), n * sizeof(T));
  }
}

template <class Ops>
void GPT<Ops>::download(M* dst, const T* src, size_t n) {
  if constexpr (std::is_same_v<T, M>) {
    Ops::d2h(dst, src, n * sizeof(T));
  } else {
    std::vector<T> tmp(n);
    Ops::d2h(tmp.data(), src, n * sizeof(T));
    for (size_t i = 0; i < n; ++i) dst[i] = M(float(tmp[i]));
  }
}

template <class Ops>
std::vector<float> GPT<Ops>::logits_row(int row) const {
  ZT_ASSERT(row >= logits_row0_ && row < B_ * T_);
  const int Vl = cfg_.vocab();
  const T* mine = acts_.logits + size_t(row - logits_row0_) * size_t(Vl);
  if (cfg_.tp > 1) {  // every tensor rank's columns, in rank order: the whole padded row
    ZT_ASSERT(tensor_group_ != nullptr);
    tensor_group_->all_gather(mine, acts_.vocab_row, size_t(Vl));
    mine = acts_.vocab_row;
  }
  std::vector<M> m(size_t(cfg_.V));
  download(m.data(), mine, m.size());
  return std::vector<float>(m.begin(), m.end());
}

template <class Ops>
void GPT<Ops>::init_gpt2_values(uint64_t seed, int k, size_t offset, size_t count, M* out) const {
  const double residual_scale = 1.0 / std::sqrt(2.0 * cfg_.layers());
  const TensorSlot& s = layout_.tensors()[size_t(k)];
  ZT_ASSERT(offset + count <= s.numel);
  const bool is_weight = s.shape.size() == 2;
  const bool is_gain = s.id == ParamId::ln1w || s.id == ParamId::ln2w || s.id == ParamId::lnfw;
  double std_dev = 0.02;
  if (s.id == ParamId::attprojw || s.id == ParamId::fcprojw) std_dev *= residual_scale;
  // Padding rows of wte stay zero (indices below are of the whole tensor).
  const size_t n = s.id == ParamId::wte ? size_t(cfg_.V) * size_t(cfg_.C) : SIZE_MAX;
  const int stream = layout_.whole_tensor_index(k);  // a pipeline stage's tensors: their whole-model streams
  // A tensor rank's element gets the value of the element it is of the whole tensor.
#pragma omp parallel for schedule(static)
  for (size_t j = 0; j < count; ++j) {
    const size_t i = global_index(s, cfg_, offset + j);
    double v = 0.0;
    if (is_weight) v = i < n ? std_dev * normal_at(seed, uint64_t(stream), i) : 0.0;
    else if (is_gain) v = 1.0;
    out[j] = M(v);
  }
}

template <class Ops>
void GPT<Ops>::init_gpt2(uint64_t seed) {
  // In pieces of at most 1 MiB of host values: a whole wte (Vp x C) in host memory would be a
  // transient the size of the embedding on top of the tracked buffers.
  constexpr size_t kPiece = size_t(1) << 18;
  std::vector<M> host;
  for (int u = 0; u < layout_.num_units(); ++u)
    for (int k : layout_.units()[size_t(u)].tensors) {
      const UnitPiece p = layout_.piece(u, k);
      for (size_t at = 0; at < p.count; at += kPiece) {
        const size_t n = std::min(kPiece, p.count - at);
        host.resize(n);
        init_gpt2_values(seed, k, p.begin + at, n, host.data());
        upload(unit_param_[size_t(u)] + p.at + at, host.data(), n);
      }
    }
}

// ---- forward ---------------------------------------------------------------------------------

template <class Ops>
double GPT<Ops>::forward(const int* host_inputs, const int* host_targets, int B, int Tn, bool write_dlogits, S dloss) {
  ZT_REQUIRE(B >= 1 && B <= B_ && Tn >= 1 && Tn <= T_,
             "model: batch (" << B << ", " << Tn << ") exceeds the allocated (" << B_ << ", " << T_ << ")");
  ZT_ASSERT(!write_dlogits || host_targets != nullptr);
  // Sequence parallelism cuts the positions into tp equal parts; a length that does not cut evenly
  // (sampling: one sequence, any length) is padded at its end, which causal attention keeps from
  // every earlier position (seq_len itself is a multiple of tp: the plan checks it).
  std::vector<int> padded;
  if (cfg_.sp && (B * Tn) % cfg_.tp != 0) {
    ZT_REQUIRE(B == 1 && !host_targets, "model: sequence parallelism needs micro_batch x seq_len divisible by "
                                            << cfg_.tp << ", got " << B << " x " << Tn);
    padded.assign(host_inputs, host_inputs + Tn);
    Tn = (Tn + cfg_.tp - 1) / cfg_.tp * cfg_.tp;
    ZT_ASSERT(Tn <= T_);
    padded.resize(size_t(Tn), padded.back());
    host_inputs = padded.data();
  }
  const int C = cfg_.C, L = cfg_.L, N = B * Tn;
  last_B_ = B;
  last_T_ = Tn;
  Ops::h2d(acts_.inputs, host_inputs, size_t(N) * sizeof(int));
  if (host_targets) Ops::h2d(acts_.targets, host_targets, size_t(N) * sizeof(int));
  const int rows = int(cfg_.sp_rows(size_t(N)));  // the residual stream's positions here

  // A later pipeline stage's input (or chunk's), the previous one's output, is in stage_input() already.
  if (runs_lookup()) lookup_forward(B, Tn);

  const int first = cfg_.chunk_begin(chunk_), end = cfg_.chunk_begin(chunk_ + 1);
  for (int l = first; l < end; ++l) {
    hooks_->before_forward(layout_.block_unit(l));
    if (cfg_.sp)
      block_forward_sp(l, block_input(l), B, Tn);
    else
      block_forward(l, block_input(l), B, Tn);
    hooks_->after_forward(layout_.block_unit(l));
  }
  if (!runs_head()) return 0.0;  // its output, stage_output(), goes on to the next stage
  const T* x = block_input(L);  // the last block's output (the lookup's, with no blocks)

  hooks_->before_forward(layout_.final_unit());
  // Sequence parallelism: the final norm over this rank's positions, gathered whole for the head.
  T* lnf = cfg_.sp ? gs_.dchunk : acts_.lnf;
  Ops::layernorm_forward(lnf, acts_.lnf_mean, acts_.lnf_rstd, x, param(ParamId::lnfw), param(ParamId::lnfb), rows, C);
  if (cfg_.sp) tensor_gather(lnf, acts_.lnf, size_t(rows) * size_t(C));
  hooks_->after_forward(layout_.final_unit());

  return classifier_forward(host_targets ? acts_.targets : nullptr, N, write_dlogits, dloss);
}

template <class Ops>
void GPT<Ops>::lookup_forward(int B, int Tn) {
  // The unit holding wpe first: encoded = wpe[t], then += each chunk's wte rows (with one unit,
  // wte + wpe in one pass: the same sum, so splitting changes no bit of it).
  // Tensor parallelism: each rank adds the rows of its vocabulary and rank 0 the positions; the
  // sum over the group is the embedding (model/tensor_parallel.h).
  // Under sequence parallelism the sums are reduce-scattered: each rank keeps its positions.
  const size_t nC = size_t(B) * size_t(Tn) * size_t(cfg_.C);
  T* out = cfg_.sp ? acts_.gathered : acts_.encoded;
  if (cfg_.tp_rank > 0) Ops::zero(out, nC);
  for (int e = layout_.embedding_units() - 1; e >= 0; --e) {
    const VocabRows r = layout_.vocab_rows(e);
    hooks_->before_forward(e);
    if (lookup_given_) {  // the engine wrote the embedding's output (lookup_given)
      lookup_given_ = false;
      hooks_->after_forward(e);
      continue;
    }
    const bool positions = e == layout_.wpe_unit() && cfg_.tp_rank == 0;
    Ops::encoder_forward(out, acts_.inputs, wte_rows(e), positions ? param(ParamId::wpe) : nullptr, B, Tn, cfg_.C,
                         cfg_.vocab_row0() + r.row0, r.rows);
    hooks_->after_forward(e);
  }
  if (cfg_.sp)
    tensor_scatter(out, acts_.encoded, nC / size_t(cfg_.tp));
  else
    tensor_sum(acts_.encoded, nC);
}

template <class Ops>
void GPT<Ops>::tensor_gather(const T* send, T* recv, size_t send_n) {
  ZT_ASSERT(tensor_group_ != nullptr);
  tensor_group_->all_gather(send, recv, send_n);
}

template <class Ops>
void GPT<Ops>::tensor_scatter(const T* send, T* recv, size_t recv_n) {
  ZT_ASSERT(tensor_group_ != nullptr);
  tensor_group_->reduce_scatter(send, recv, recv_n);
}

template <class Ops>
void GPT<Ops>::layernorm_backward_here(T* dinp, ParamId w, ParamId b, int layer, const T* dout, const T* inp,
                                       const S* mean, const S* rstd, int rows) {
  const int C = cfg_.C;
  if (!cfg_.sp) {
    Ops::layernorm_backward(dinp, grad(w, layer), grad(b, layer), dout, inp, param(w, layer), mean, rstd, rows, C,
                            scratch_.data());
    return;
  }
  T* g = gs_.ln_grads;  // (2, C): this rank's positions' part, summed over the group, then added
  Ops::zero(g, 2 * size_t(C));
  Ops::layernorm_backward(dinp, g, g + C, dout, inp, param(w, layer), mean, rstd, rows, C, scratch_.data());
  tensor_sum(g, 2 * size_t(C));
  Ops::residual_forward(grad(w, layer), grad(w, layer), g, size_t(C));
  Ops::residual_forward(grad(b, layer), grad(b, layer), g + C, size_t(C));
}

template <class Ops>
void GPT<Ops>::tensor_sum(T* buf, size_t n) {
  if (cfg_.tp == 1) return;
  ZT_ASSERT(tensor_group_ != nullptr);
  tensor_group_->all_reduce(buf, n);
}

// ---- backward --------------------------------------------------------------------------------

template <class Ops>
void GPT<Ops>::backward() {
  const int B = last_B_, Tn = last_T_;
  ZT_REQUIRE(B > 0, "model: backward() without a forward()");
  const int C = cfg_.C, L = cfg_.L, N = B * Tn;
  const int rows = int(cfg_.sp_rows(size_t(N)));  // the residual stream's positions here
  const size_t nC = size_t(rows) * size_t(C);

  // A pipeline stage before the last (or chunk) starts from the gradient of its output, which the
  // caller wrote into stage_output_grad() (the residual gradient the blocks accumulate into).
  if (runs_head()) {
    // Deferred lookup: the LM-head part of the embedding's gradient now, so that the engine reduces
    // it while the blocks' backward runs (dlogits and lnf are final from here). Whole logits: written
    // from dlogits before the head's input gradient, which does not read it: the reduction starts
    // under that gradient's matmul too. In chunks (one unit): already written by forward into the
    // same wte_grad_rows(0), so only grads_ready(0) remains, after the input gradient. The last of
    // several pipeline stages, which does no lookup, is done with the embedding after its input
    // gradient (the stage before waits for that one).
    const bool head_grads_first = defer_lookup_ && head(N, true) == Head::whole;
    if (head_grads_first) embedding_grads(true, false);
    const T* dlnf = classifier_backward();
    if (!head_grads_first && (defer_lookup_ || !cfg_.first_stage)) embedding_grads(true, false);

    const int F = layout_.final_unit();
    hooks_->before_backward(F);
    hooks_->before_grads(F);
    Ops::zero(gs_.dresidual, nC);
    layernorm_backward_here(gs_.dresidual, ParamId::lnfw, ParamId::lnfb, -1, dlnf, block_input(L), acts_.lnf_mean,
                            acts_.lnf_rstd, rows);
    hooks_->after_backward(F);
    hooks_->grads_ready(F);
  }

  for (int l = cfg_.chunk_begin(chunk_ + 1) - 1; l >= cfg_.chunk_begin(chunk_); --l) {
    const int u = layout_.block_unit(l);
    hooks_->before_backward(u);
    hooks_->before_grads(u);
    const T* x = block_input(l);
    const BlockActs a = block_acts(l);
    block_recompute(l, a, x, B, Tn);  // after the hook: a sharded unit's parameters are gathered
    if (cfg_.sp)
      block_backward_sp(l, a, x, B, Tn);
    else
      block_backward(l, a, x, B, Tn);
    hooks_->after_backward(u);
    hooks_->grads_ready(u);
  }

  // The embedding's gradients last (LM-head and lookup parts together), or with a deferred lookup
  // only its lookup part, which the engine adds (UnitHooks::embedding_lookup_deferred). A pipeline
  // stage after the first (or chunk) leaves the gradient of its input in stage_input_grad().
  if (!runs_lookup()) return;
  if (defer_lookup_) {
    hooks_->embedding_lookup_deferred();
  } else {
    // Sequence parallelism: every rank's vocabulary rows take gradients from every position.
    if (cfg_.sp) tensor_gather(gs_.dresidual, acts_.gathered, nC);
    embedding_grads(cfg_.last_stage, true);
  }
}

template <class Ops>
void GPT<Ops>::zero_grad() {
  for (size_t u = 0; u < layout_.units().size(); ++u)
    if (unit_grad_[u]) Ops::zero(unit_grad_[u], layout_.units()[u].padded);
}

template class GPT<CpuOps<float>>;
template class GPT<CpuOps<double>>;
#if ZT_HAVE_CUDA
template class GPT<CudaOps<float>>;
template class GPT<CudaOps<bf16>>;
#endif

}  // namespace zt
