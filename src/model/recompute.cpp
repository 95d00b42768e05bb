// Activation recomputation (model/recompute.h): which fields each policy keeps, the block
// recompute backward runs before a block's backward, and the FLOPs it costs.
#include "model/recompute.h"

#include "backend/ops_cpu.h"
#if ZT_HAVE_CUDA
#include "backend/ops_cuda.h"
#endif
#include "model/gpt.h"

namespace zt {

namespace {
// GPT::BlockActs field by field: ln1, ln1_mean, ln1_rstd, qkv, atty, att_lse, attproj, residual2,
// ln2, ln2_mean, ln2_rstd, fch, fch_gelu, fcproj.
constexpr int kFcproj = 13;
constexpr bool kIsStat[kBlockFields] = {false, true,  true,  false, false, true,  false,
                                        false, false, true,  true,  false, false, false};
constexpr bool kSelectiveDrops[kBlockFields] = {true,  false, false, false, false, false, false,
                                                true,  true,  false, false, false, true,  true};
}  // namespace

size_t block_field_width(const GPTConfig& cfg, int f) {
  // A, H: this tensor rank's attention channels and hidden units (C and 4C without tensor parallelism).
  const size_t C = size_t(cfg.C), A = size_t(cfg.attn_C()), H = size_t(cfg.mlp_C());
  const size_t w[kBlockFields] = {C, 1, 1, 3 * A, A, size_t(cfg.heads()), C, C, C, 1, 1, H, H, C};
  return w[f];
}

size_t block_field_rows(const GPTConfig& cfg, int f, size_t BT) {
  constexpr bool kSequenceRegion[kBlockFields] = {true,  true, true, false, false, false, true,
                                                  true,  true, true, true,  false, false, true};
  return kSequenceRegion[f] ? cfg.sp_rows(BT) : BT;
}

bool block_field_is_stat(int f) { return kIsStat[f]; }

bool keeps(const Recompute& rc, int f, int l) {
  if (f == kFcproj) return false;
  switch (rc.policy) {
    case Recompute::Policy::none: return true;
    case Recompute::Policy::selective: return !kSelectiveDrops[f];
    case Recompute::Policy::block: return !rc.recomputes_block(l);
  }
  return true;
}

int kept_index(const Recompute& rc, int l) { return l - rc.blocks_recomputed_before(l); }

int kept_layers(const Recompute& rc, int L, int f) {
  if (f == kFcproj) return 0;
  return rc.policy == Recompute::Policy::selective && kSelectiveDrops[f] ? 0 : kept_index(rc, L);
}

// Rewrites what the policy did not keep for layer l, with the same ops on the same inputs as
// forward, so backward sees bit for bit what forward computed. Called between the unit's
// before_backward hook and its backward: at stage 3 the parameters are the ones the hook
// gathered for backward, so recomputing costs no communication.
template <class Ops>
void GPT<Ops>::block_recompute(int l, const BlockActs& a, const T* x, int B, int Tn) {
  if (rc_.recomputes_block(l)) {
    if (cfg_.sp)
      block_forward_inner_sp(l, a, x, B, Tn);
    else
      block_forward_inner(l, a, x, B, Tn);
    return;
  }
  if (rc_.policy != Recompute::Policy::selective) return;
  const int C = cfg_.C, N = B * Tn, R = int(cfg_.sp_rows(size_t(N)));  // R: the LayerNorms' positions here
  // The LayerNorm ops also write mean and rstd: into the kept statistics, the values they hold.
  Ops::layernorm_forward(a.ln1, a.ln1_mean, a.ln1_rstd, x, param(ParamId::ln1w, l), param(ParamId::ln1b, l), R, C);
  Ops::residual_layernorm_forward(a.residual2, a.ln2, a.ln2_mean, a.ln2_rstd, x, a.attproj, param(ParamId::ln2w, l),
                                  param(ParamId::ln2b, l), R, C);
  Ops::gelu_forward(a.fch_gelu, a.fch, size_t(N) * size_t(cfg_.mlp_C()));
}

namespace {
// 2 FLOPs per multiply-add. Causal attention: row t of each head scores t + 1 keys (q k^T) and
// sums as many values, so B * C * Tn * (Tn + 1) multiply-adds over the heads. Per rank: with
// tensor parallelism its A = C/tp attention channels and H = 4C/tp hidden units.
double block_inner_flops(const GPTConfig& cfg, int B, int Tn) {
  const double N = double(B) * Tn, C = cfg.C, A = cfg.attn_C(), H = cfg.mlp_C();
  return 2 * N * (3 * A * C + A * C + H * C) + 2 * double(B) * A * Tn * (double(Tn) + 1);
}
}  // namespace

template <class Ops>
double GPT<Ops>::forward_flops(const GPTConfig& cfg, int B, int Tn) {
  const double N = double(B) * Tn, C = cfg.C;
  const double block = block_inner_flops(cfg, B, Tn) + 2 * N * cfg.mlp_C() * C;  // + fcproj
  return cfg.L * block + 2 * N * C * cfg.vocab();                                 // + LM head
}

template <class Ops>
double GPT<Ops>::recompute_flops(const GPTConfig& cfg, int B, int Tn, const Recompute& rc, int embedding_units) {
  // selective recomputes pointwise work only (two LayerNorms and a GELU per layer). A chunked
  // classifier over one embedding unit takes its gradients in forward and recomputes nothing; over
  // a split embedding it runs the LM head's forward matmul twice more in backward (input gradient
  // first, each unit's weight gradient at the end; model/classifier.cpp).
  const double head = 2.0 * B * Tn * cfg.C * cfg.Vp;
  const double regather = classifier_regathers(cfg, B, Tn, rc, embedding_units) ? 2 * head : 0.0;
  return rc.blocks_recomputed_before(cfg.L) * block_inner_flops(cfg, B, Tn) + regather;
}

// The members defined here, for the backends gpt.cpp instantiates the class with.
#define ZT_GPT_RECOMPUTE_MEMBERS(O)                                                                   \
  template void GPT<O>::block_recompute(int, const GPT<O>::BlockActs&, const GPT<O>::T*, int, int); \
  template double GPT<O>::forward_flops(const GPTConfig&, int, int);                                 \
  template double GPT<O>::recompute_flops(const GPTConfig&, int, int, const Recompute&, int);
ZT_GPT_RECOMPUTE_MEMBERS(CpuOps<float>)
ZT_GPT_RECOMPUTE_MEMBERS(CpuOps<double>)
#if ZT_HAVE_CUDA
ZT_GPT_RECOMPUTE_MEMBERS(CudaOps<float>)
ZT_GPT_RECOMPUTE_MEMBERS(CudaOps<bf16>)
#endif
#undef ZT_GPT_RECOMPUTE_MEMBERS

}  // namespace zt
