#include "model/gpt.h"

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

namespace {
// Kind of element of an activation field: token id, storage type T, or statistic type S.
enum class Elem { token, t, s };
struct FieldSize {
  size_t n;
  Elem kind;
};
// Element counts of the activation fields, in the declaration order of GPT::Activations, then of
// GPT::GradScratch. One list serves the constructor and activation_bytes(). Every product is
// checked: layers x batch x sequence x channels can pass 2^64 for a plan that validates.
const char* const kActivationSize = "model: activation memory (n_layer x micro_batch x seq_len x 4 n_embd elements)";
size_t product(std::initializer_list<size_t> xs) {
  size_t r = 1;
  for (size_t x : xs) r = checked_mul(r, x, kActivationSize);
  return r;
}
std::vector<FieldSize> activation_sizes(const GPTConfig& cfg, int B, int Tn) {
  const size_t L = size_t(cfg.L), C = size_t(cfg.C), NH = size_t(cfg.NH), Vp = size_t(cfg.Vp);
  const size_t BT = product({size_t(B), size_t(Tn)});
  const size_t BTC = product({BT, C}), LBT = product({L, BT}), LBTC = product({L, BT, C});
  const size_t LBT3C = product({LBTC, 3}), LBT4C = product({LBTC, 4}), LBTNH = product({LBT, NH});
  const Elem i = Elem::token, t = Elem::t, s = Elem::s;
  return {
      {BT, i},           {BT, i},
      {BTC, t},          {LBTC, t},        {LBT, s},         {LBT, s},            {LBT3C, t},
      {LBTC, t},         {LBTNH, s},       {LBTC, t},        {LBTC, t},           {LBTC, t},
      {LBT, s},          {LBT, s},         {LBT4C, t},       {LBT4C, t},          {LBTC, t},
      {LBTC, t},         {BTC, t},         {BT, s},          {BT, s},             {product({BT, Vp}), t},
      {BT, s},
  };
}
std::vector<FieldSize> grad_scratch_sizes(const GPTConfig& cfg, int B, int Tn) {
  const size_t BTC = product({size_t(B), size_t(Tn), size_t(cfg.C)});
  return {{BTC, Elem::t}, {BTC, Elem::t}, {product({BTC, 4}), Elem::t}, {product({BTC, 4}), Elem::t},
          {product({BTC, 3}), Elem::t}};
}
// Each field starts on a 64-byte boundary so kernels get aligned rows (and 128-bit loads).
size_t aligned_bytes(size_t bytes) { return checked_round_up(bytes, MemoryTracker::kAlign, kActivationSize); }
template <class T, class S>
size_t field_bytes(const FieldSize& f) {
  const size_t e = f.kind == Elem::token ? sizeof(int) : f.kind == Elem::t ? sizeof(T) : sizeof(S);
  return aligned_bytes(checked_mul(f.n, e, kActivationSize));
}
template <class T, class S>
size_t total_bytes(const std::vector<FieldSize>& fields) {
  size_t n = 0;
  for (const FieldSize& f : fields) n = checked_add(n, field_bytes<T, S>(f), kActivationSize);
  return n;
}
}  // namespace

template <class Ops>
size_t GPT<Ops>::activation_bytes(const GPTConfig& cfg, int B, int Tn) {
  size_t n = checked_add(total_bytes<T, S>(activation_sizes(cfg, B, Tn)), total_bytes<T, S>(grad_scratch_sizes(cfg, B, Tn)),
                         kActivationSize);
  return checked_add(n, aligned_bytes(Ops::scratch_bytes(B, Tn, cfg.C, cfg.NH, cfg.Vp)), kActivationSize);
}

template <class Ops>
GPT<Ops>::GPT(const GPTConfig& cfg, int B, int Tn, MemoryTracker& mem, size_t pad_multiple, bool full_params,
              bool full_grads, int embedding_rows)
    : cfg_(cfg), layout_(cfg, pad_multiple, embedding_rows), B_(B), T_(Tn) {
  ZT_REQUIRE(cfg.C % cfg.NH == 0, "model: n_embd " << cfg.C << " is not divisible by n_head " << cfg.NH);
  ZT_REQUIRE(Tn <= cfg.maxT, "model: sequence length " << Tn << " exceeds the position table (" << cfg.maxT << ")");

  const size_t flat_bytes = checked_mul(layout_.total(), sizeof(T), "model: parameter bytes (parameter count x element size)");
  if (full_params) params_ = mem.alloc(flat_bytes, Ops::tier, Category::params, "parameters");
  if (full_grads) grads_ = mem.alloc(flat_bytes, Ops::tier, Category::grads, "gradients");
  for (const Unit& u : layout_.units()) {
    unit_param_.push_back(full_params ? params() + u.offset : nullptr);
    unit_grad_.push_back(full_grads ? grads() + u.offset : nullptr);
  }

  // Activations: one tracked block per struct, carved into its fields in declaration order
  // (field pointers stored as void** since the struct mixes int, T and S fields).
  void** act_fields[] = {
      (void**)&acts_.inputs,   (void**)&acts_.targets,  (void**)&acts_.encoded,  (void**)&acts_.ln1,
      (void**)&acts_.ln1_mean, (void**)&acts_.ln1_rstd, (void**)&acts_.qkv,      (void**)&acts_.atty,
      (void**)&acts_.att_lse,  (void**)&acts_.attproj,  (void**)&acts_.residual2, (void**)&acts_.ln2,
      (void**)&acts_.ln2_mean, (void**)&acts_.ln2_rstd, (void**)&acts_.fch,      (void**)&acts_.fch_gelu,
      (void**)&acts_.fcproj,   (void**)&acts_.residual3, (void**)&acts_.lnf,     (void**)&acts_.lnf_mean,
      (void**)&acts_.lnf_rstd, (void**)&acts_.logits,   (void**)&acts_.losses};
  void** grad_fields[] = {(void**)&gs_.dresidual, (void**)&gs_.dC, (void**)&gs_.d4C_a, (void**)&gs_.d4C_b,
                          (void**)&gs_.dqkv};
  auto carve = [&](void** const* fields, const std::vector<FieldSize>& sizes, Allocation& block, const char* name) {
    block = mem.alloc(total_bytes<T, S>(sizes), Ops::tier, Category::activations, name);
    char* p = block.as<char>();
    for (size_t i = 0; i < sizes.size(); ++i) {
      *fields[i] = p;
      p += field_bytes<T, S>(sizes[i]);
    }
  };
  const auto act_sizes = activation_sizes(cfg, B, Tn);
  const auto grad_sizes = grad_scratch_sizes(cfg, B, Tn);
  ZT_ASSERT(act_sizes.size() == std::size(act_fields) && grad_sizes.size() == std::size(grad_fields));
  carve(act_fields, act_sizes, act_mem_, "activations");
  carve(grad_fields, grad_sizes, grad_act_mem_, "activation gradients");
  // Kernel working memory (deterministic reductions, attention backward): sized once, here.
  const size_t scratch = Ops::scratch_bytes(B, Tn, cfg.C, cfg.NH, cfg.Vp);
  if (scratch > 0) scratch_ = mem.alloc(scratch, Ops::tier, Category::activations, "kernel scratch");
}

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
  ZT_ASSERT(row >= 0 && row < B_ * T_);
  std::vector<M> m(size_t(cfg_.V));
  download(m.data(), acts_.logits + size_t(row) * size_t(cfg_.Vp), m.size());
  return std::vector<float>(m.begin(), m.end());
}

template <class Ops>
void GPT<Ops>::init_gpt2_values(uint64_t seed, int k, size_t offset, size_t count, M* out) const {
  const double residual_scale = 1.0 / std::sqrt(2.0 * cfg_.L);
  const TensorSlot& s = layout_.tensors()[size_t(k)];
  ZT_ASSERT(offset + count <= s.numel);
  const bool is_weight = s.shape.size() == 2;
  const bool is_gain = s.id == ParamId::ln1w || s.id == ParamId::ln2w || s.id == ParamId::lnfw;
  double std_dev = 0.02;
  if (s.id == ParamId::attprojw || s.id == ParamId::fcprojw) std_dev *= residual_scale;
  size_t n = s.numel;
  if (s.id == ParamId::wte) n = size_t(cfg_.V) * size_t(cfg_.C);  // padding rows stay zero
#pragma omp parallel for schedule(static)
  for (size_t j = 0; j < count; ++j) {
    const size_t i = offset + j;
    double v = 0.0;
    if (is_weight) v = i < n ? std_dev * normal_at(seed, uint64_t(k), i) : 0.0;
    else if (is_gain) v = 1.0;
    out[j] = M(v);
  }
}

template <class Ops>
void GPT<Ops>::init_gpt2(uint64_t seed) {
  std::vector<M> host;
  for (int u = 0; u < layout_.num_units(); ++u)
    for (int k : layout_.units()[size_t(u)].tensors) {
      const UnitPiece p = layout_.piece(u, k);
      host.resize(p.count);
      init_gpt2_values(seed, k, p.begin, p.count, host.data());
      upload(unit_param_[size_t(u)] + p.at, host.data(), p.count);
    }
}

// ---- forward ---------------------------------------------------------------------------------

template <class Ops>
double GPT<Ops>::forward(const int* host_inputs, const int* host_targets, int B, int Tn, bool write_dlogits, S dloss) {
  ZT_REQUIRE(B >= 1 && B <= B_ && Tn >= 1 && Tn <= T_,
             "model: batch (" << B << ", " << Tn << ") exceeds the allocated (" << B_ << ", " << T_ << ")");
  ZT_ASSERT(!write_dlogits || host_targets != nullptr);
  const int C = cfg_.C, L = cfg_.L, N = B * Tn;
  last_B_ = B;
  last_T_ = Tn;
  const int* inputs = acts_.inputs;
  const int* targets = host_targets ? acts_.targets : nullptr;
  Ops::h2d(acts_.inputs, host_inputs, size_t(N) * sizeof(int));
  if (host_targets) Ops::h2d(acts_.targets, host_targets, size_t(N) * sizeof(int));
  const size_t layer_stride = size_t(B_) * size_t(T_) * size_t(C);  // (B, T, C) of one layer

  // Lookup, the unit holding wpe first: encoded = wpe[t], then += each chunk's wte rows (with one
  // unit, wte + wpe in one pass: the same sum, so splitting changes no bit of it).
  const int E = layout_.embedding_units();
  for (int e = E - 1; e >= 0; --e) {
    const VocabRows r = layout_.vocab_rows(e);
    hooks_->before_forward(e);
    Ops::encoder_forward(acts_.encoded, inputs, wte_rows(e), e == layout_.wpe_unit() ? param(ParamId::wpe) : nullptr, B,
                         Tn, C, r.row0, r.rows);
    hooks_->after_forward(e);
  }

  const T* x = acts_.encoded;
  for (int l = 0; l < L; ++l) {
    hooks_->before_forward(layout_.block_unit(l));
    block_forward(l, x, B, Tn);
    hooks_->after_forward(layout_.block_unit(l));
    x = acts_.residual3 + size_t(l) * layer_stride;
  }

  hooks_->before_forward(layout_.final_unit());
  Ops::layernorm_forward(acts_.lnf, acts_.lnf_mean, acts_.lnf_rstd, x, param(ParamId::lnfw), param(ParamId::lnfb), N, C);
  hooks_->after_forward(layout_.final_unit());

  // Tied LM head: logits = lnf @ wte^T over the padded vocabulary, one chunk's columns at a time.
  for (int e = 0; e < E; ++e) {
    const VocabRows r = layout_.vocab_rows(e);
    hooks_->before_forward(e);
    Ops::matmul_forward(acts_.logits + r.row0, acts_.lnf, wte_rows(e), nullptr, N, C, r.rows, cfg_.Vp);
    hooks_->after_forward(e);
  }

  if (!targets) return 0.0;
  Ops::softmax_xent(acts_.logits, acts_.losses, targets, dloss, N, cfg_.V, cfg_.Vp, write_dlogits);
  std::vector<S> losses(static_cast<size_t>(N));
  Ops::d2h(losses.data(), acts_.losses, losses.size() * sizeof(S));  // waits for the forward to finish
  double sum = 0.0;
  for (int i = 0; i < N; ++i) sum += double(losses[size_t(i)]);
  return sum / double(N);
}

template <class Ops>
void GPT<Ops>::block_forward(int l, const T* x, int B, int Tn) {
  const int C = cfg_.C, NH = cfg_.NH, N = B * Tn;
  const size_t BT = size_t(B_) * size_t(T_);
  const size_t s1 = size_t(l) * BT, sC = s1 * size_t(C);  // layer offsets of (B,T) and (B,T,C) buffers
  T* ln1 = acts_.ln1 + sC;
  T* qkv = acts_.qkv + 3 * sC;
  T* atty = acts_.atty + sC;
  S* lse = acts_.att_lse + s1 * size_t(NH);
  T* attproj = acts_.attproj + sC;
  T* residual2 = acts_.residual2 + sC;
  T* ln2 = acts_.ln2 + sC;
  T* fch = acts_.fch + 4 * sC;
  T* fch_gelu = acts_.fch_gelu + 4 * sC;
  T* fcproj = acts_.fcproj + sC;
  T* residual3 = acts_.residual3 + sC;

  Ops::layernorm_forward(ln1, acts_.ln1_mean + s1, acts_.ln1_rstd + s1, x, param(ParamId::ln1w, l), param(ParamId::ln1b, l), N, C);
  Ops::matmul_forward(qkv, ln1, param(ParamId::qkvw, l), param(ParamId::qkvb, l), N, C, 3 * C);
  Ops::attention_forward(atty, lse, qkv, B, Tn, C, NH);
  Ops::matmul_forward(attproj, atty, param(ParamId::attprojw, l), param(ParamId::attprojb, l), N, C, C);
  // residual2 = x + attproj, ln2 = layernorm(residual2): fused on CUDA (one pass over the rows).
  Ops::residual_layernorm_forward(residual2, ln2, acts_.ln2_mean + s1, acts_.ln2_rstd + s1, x, attproj,
                                  param(ParamId::ln2w, l), param(ParamId::ln2b, l), N, C);
  // fch = ln2 @ fcw^T + fcb, fch_gelu = gelu(fch): fused into the matmul's epilogue on CUDA.
  Ops::matmul_gelu_forward(fch_gelu, fch, ln2, param(ParamId::fcw, l), param(ParamId::fcb, l), N, C, 4 * C);
  Ops::matmul_forward(fcproj, fch_gelu, param(ParamId::fcprojw, l), param(ParamId::fcprojb, l), N, 4 * C, C);
  Ops::residual_forward(residual3, residual2, fcproj, size_t(N) * size_t(C));
}

// ---- backward --------------------------------------------------------------------------------

template <class Ops>
void GPT<Ops>::block_backward(int l, const T* x, int B, int Tn) {
  // On entry gs_.dresidual = dL/d residual3; on exit dL/dx. The residual adds pass the gradient
  // through unchanged, so the stream is accumulated in place by the two layernorm backwards.
  const int C = cfg_.C, NH = cfg_.NH, N = B * Tn;
  const size_t BT = size_t(B_) * size_t(T_);
  const size_t s1 = size_t(l) * BT, sC = s1 * size_t(C);
  const size_t nC = size_t(N) * size_t(C);

  void* scratch = scratch_.data();
  // MLP: residual3 = residual2 + fc_proj(gelu(fc(ln_2(residual2))))
  Ops::zero(gs_.d4C_a, 4 * nC);
  Ops::matmul_backward(gs_.d4C_a, grad(ParamId::fcprojw, l), grad(ParamId::fcprojb, l), gs_.dresidual,
                       acts_.fch_gelu + 4 * sC, param(ParamId::fcprojw, l), N, 4 * C, C, scratch);
  Ops::zero(gs_.d4C_b, 4 * nC);
  Ops::gelu_backward(gs_.d4C_b, acts_.fch + 4 * sC, gs_.d4C_a, 4 * nC);
  Ops::zero(gs_.dC, nC);
  Ops::matmul_backward(gs_.dC, grad(ParamId::fcw, l), grad(ParamId::fcb, l), gs_.d4C_b, acts_.ln2 + sC,
                       param(ParamId::fcw, l), N, C, 4 * C, scratch);
  Ops::layernorm_backward(gs_.dresidual, grad(ParamId::ln2w, l), grad(ParamId::ln2b, l), gs_.dC, acts_.residual2 + sC,
                          param(ParamId::ln2w, l), acts_.ln2_mean + s1, acts_.ln2_rstd + s1, N, C, scratch);

  // Attention: residual2 = x + c_proj(attn(c_attn(ln_1(x))))
  Ops::zero(gs_.dC, nC);
  Ops::matmul_backward(gs_.dC, grad(ParamId::attprojw, l), grad(ParamId::attprojb, l), gs_.dresidual, acts_.atty + sC,
                       param(ParamId::attprojw, l), N, C, C, scratch);
  Ops::zero(gs_.dqkv, 3 * nC);
  Ops::attention_backward(gs_.dqkv, gs_.dC, acts_.qkv + 3 * sC, acts_.atty + sC, acts_.att_lse + s1 * size_t(NH), B, Tn, C, NH, scratch);
  Ops::zero(gs_.dC, nC);
  Ops::matmul_backward(gs_.dC, grad(ParamId::qkvw, l), grad(ParamId::qkvb, l), gs_.dqkv, acts_.ln1 + sC,
                       param(ParamId::qkvw, l), N, C, 3 * C, scratch);
  Ops::layernorm_backward(gs_.dresidual, grad(ParamId::ln1w, l), grad(ParamId::ln1b, l), gs_.dC, x,
                          param(ParamId::ln1w, l), acts_.ln1_mean + s1, acts_.ln1_rstd + s1, N, C, scratch);
}

template <class Ops>
void GPT<Ops>::backward() {
  const int B = last_B_, Tn = last_T_;
  ZT_REQUIRE(B > 0, "model: backward() without a forward()");
  const int C = cfg_.C, L = cfg_.L, N = B * Tn;
  void* scratch = scratch_.data();
  const size_t nC = size_t(N) * size_t(C);
  const size_t layer_stride = size_t(B_) * size_t(T_) * size_t(C);

  // LM head (tied to wte): the logits buffer holds dlogits (B*T, Vp) from forward(write_dlogits).
  // Its input gradient dlnf = sum over chunks of dlogits[:, rows] @ W_rows; its weight gradient
  // waits for the end, where it needs no parameters (UnitHooks).
  const int E = layout_.embedding_units();
  Ops::zero(gs_.dC, nC);
  for (int e = E - 1; e >= 0; --e) {
    const VocabRows r = layout_.vocab_rows(e);
    hooks_->before_backward(e);
    Ops::matmul_backward(gs_.dC, nullptr, nullptr, acts_.logits + r.row0, acts_.lnf, wte_rows(e), N, C, r.rows, scratch,
                         cfg_.Vp);
    hooks_->after_backward(e);
  }

  const int F = layout_.final_unit();
  hooks_->before_backward(F);
  hooks_->before_grads(F);
  Ops::zero(gs_.dresidual, nC);
  const T* x_last = L > 0 ? acts_.residual3 + size_t(L - 1) * layer_stride : acts_.encoded;
  Ops::layernorm_backward(gs_.dresidual, grad(ParamId::lnfw), grad(ParamId::lnfb), gs_.dC, x_last, param(ParamId::lnfw),
                          acts_.lnf_mean, acts_.lnf_rstd, N, C, scratch);
  hooks_->after_backward(F);
  hooks_->grads_ready(F);

  for (int l = L - 1; l >= 0; --l) {
    const int u = layout_.block_unit(l);
    hooks_->before_backward(u);
    hooks_->before_grads(u);
    const T* x = l == 0 ? acts_.encoded : acts_.residual3 + size_t(l - 1) * layer_stride;
    block_backward(l, x, B, Tn);
    hooks_->after_backward(u);
    hooks_->grads_ready(u);
  }

  // The embedding's gradients, unit by unit: LM-head part dW_rows += dlogits[:, rows]^T @ lnf, then
  // the lookup's rows (and wpe's gradient in its unit). The same order of sums as one unit.
  for (int e = E - 1; e >= 0; --e) {
    const VocabRows r = layout_.vocab_rows(e);
    hooks_->before_grads(e);
    Ops::matmul_backward(nullptr, wte_grad_rows(e), nullptr, acts_.logits + r.row0, acts_.lnf, nullptr, N, C, r.rows,
                         scratch, cfg_.Vp);
    Ops::encoder_backward(wte_grad_rows(e), e == layout_.wpe_unit() ? grad(ParamId::wpe) : nullptr, gs_.dresidual,
                          acts_.inputs, B, Tn, C, r.row0, r.rows, scratch);
    hooks_->grads_ready(e);
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
