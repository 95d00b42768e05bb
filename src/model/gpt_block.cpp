// A transformer block's forward and backward. What backward recomputes of its forward under a
// recompute policy is model/recompute.cpp (docs/design.md §3.11); where each activation lives
// (kept per layer or in one layer's scratch) is GPT::block_acts; the code here only reads and
// writes through BlockActs.
//
// With tensor parallelism (model/tensor_parallel.h) the same code runs on this rank's A = C/tp
// attention channels (heads()/NH heads) and H = 4C/tp hidden units: the two projections' outputs are
// partial sums, completed by tensor_sum (forward), and so are the input gradients of c_attn and c_fc
// (backward). Their biases are added by tensor rank 0 only (proj_bias), before the sum.
#include "model/gpt.h"

#include "backend/ops_cpu.h"
#if ZT_HAVE_CUDA
#include "backend/ops_cuda.h"
#endif

namespace zt {

template <class Ops>
void GPT<Ops>::block_forward(int l, const T* x, int B, int Tn) {
  const int C = cfg_.C, H = cfg_.mlp_C(), N = B * Tn;
  const BlockActs a = block_acts(l);
  T* residual3 = acts_.residual3 + size_t(l) * size_t(B_) * size_t(T_) * size_t(C);
  block_forward_inner(l, a, x, B, Tn);
  Ops::matmul_forward(a.fcproj, a.fch_gelu, param(ParamId::fcprojw, l), proj_bias(ParamId::fcprojb, l), N, H, C);
  tensor_sum(a.fcproj, size_t(N) * size_t(C));
  Ops::residual_forward(residual3, a.residual2, a.fcproj, size_t(N) * size_t(C));
}

// Everything of block l's forward that backward reads; the projection and residual add after it
// are forward's only, so a recomputed block does not rerun them.
template <class Ops>
void GPT<Ops>::block_forward_inner(int l, const BlockActs& a, const T* x, int B, int Tn) {
  const int C = cfg_.C, A = cfg_.attn_C(), H = cfg_.mlp_C(), NH = cfg_.heads(), N = B * Tn;
  Ops::layernorm_forward(a.ln1, a.ln1_mean, a.ln1_rstd, x, param(ParamId::ln1w, l), param(ParamId::ln1b, l), N, C);
  Ops::matmul_forward(a.qkv, a.ln1, param(ParamId::qkvw, l), param(ParamId::qkvb, l), N, C, 3 * A);
  Ops::attention_forward(a.atty, a.att_lse, a.qkv, B, Tn, A, NH);
  Ops::matmul_forward(a.attproj, a.atty, param(ParamId::attprojw, l), proj_bias(ParamId::attprojb, l), N, A, C);
  tensor_sum(a.attproj, size_t(N) * size_t(C));
  // residual2 = x + attproj, ln2 = layernorm(residual2): fused on CUDA (one pass over the rows).
  Ops::residual_layernorm_forward(a.residual2, a.ln2, a.ln2_mean, a.ln2_rstd, x, a.attproj, param(ParamId::ln2w, l),
                                  param(ParamId::ln2b, l), N, C);
  if (rc_.policy == Recompute::Policy::selective) {
    // Unfused, so the GELU backward recomputes from fch is the one forward used, bit for bit, on
    // every backend (CUDA's fused epilogue may round differently from the standalone kernel).
    Ops::matmul_forward(a.fch, a.ln2, param(ParamId::fcw, l), param(ParamId::fcb, l), N, C, H);
    Ops::gelu_forward(a.fch_gelu, a.fch, size_t(N) * size_t(H));
  } else {
    // fch = ln2 @ fcw^T + fcb, fch_gelu = gelu(fch): fused into the matmul's epilogue on CUDA.
    Ops::matmul_gelu_forward(a.fch_gelu, a.fch, a.ln2, param(ParamId::fcw, l), param(ParamId::fcb, l), N, C, H);
  }
}

template <class Ops>
void GPT<Ops>::block_backward(int l, const BlockActs& a, const T* x, int B, int Tn) {
  // On entry gs_.dresidual = dL/d residual3; on exit dL/dx. The residual adds pass the gradient
  // through unchanged, so the stream is accumulated in place by the two layernorm backwards.
  const int C = cfg_.C, A = cfg_.attn_C(), H = cfg_.mlp_C(), NH = cfg_.heads(), N = B * Tn;

  void* scratch = scratch_.data();
  // Each input gradient below is written over its buffer (Dinp::overwrite, and the GELU and attention
  // backwards overwrite too): no zeroing pass before, no read of the stale values in the product.
  //
  // MLP: residual3 = residual2 + fc_proj(gelu(fc(ln_2(residual2))))
  // dfch = gelu'(fch) * (dresidual @ fcprojw): the GELU's backward rides in the projection's epilogue
  // on CUDA, so dfch_gelu (N, 4C) never goes through memory.
  Ops::matmul_backward_through_gelu(gs_.d4C, grad(ParamId::fcprojw, l), grad(ParamId::fcprojb, l), gs_.dresidual,
                                    a.fch_gelu, a.fch, param(ParamId::fcprojw, l), N, H, C, scratch);
  Ops::matmul_backward(gs_.dC, grad(ParamId::fcw, l), grad(ParamId::fcb, l), gs_.d4C, a.ln2, param(ParamId::fcw, l), N,
                       C, H, scratch, -1, Dinp::overwrite);
  tensor_sum(gs_.dC, size_t(N) * size_t(C));
  Ops::layernorm_backward(gs_.dresidual, grad(ParamId::ln2w, l), grad(ParamId::ln2b, l), gs_.dC, a.residual2,
                          param(ParamId::ln2w, l), a.ln2_mean, a.ln2_rstd, N, C, scratch);

  // Attention: residual2 = x + c_proj(attn(c_attn(ln_1(x))))
  Ops::matmul_backward(gs_.dC, grad(ParamId::attprojw, l), grad(ParamId::attprojb, l), gs_.dresidual, a.atty,
                       param(ParamId::attprojw, l), N, A, C, scratch, -1, Dinp::overwrite);
  Ops::attention_backward(gs_.dqkv, gs_.dC, a.qkv, a.atty, a.att_lse, B, Tn, A, NH, scratch);
  Ops::matmul_backward(gs_.dC, grad(ParamId::qkvw, l), grad(ParamId::qkvb, l), gs_.dqkv, a.ln1, param(ParamId::qkvw, l),
                       N, C, 3 * A, scratch, -1, Dinp::overwrite);
  tensor_sum(gs_.dC, size_t(N) * size_t(C));
  Ops::layernorm_backward(gs_.dresidual, grad(ParamId::ln1w, l), grad(ParamId::ln1b, l), gs_.dC, x,
                          param(ParamId::ln1w, l), a.ln1_mean, a.ln1_rstd, N, C, scratch);
}

// The members defined here, for the backends gpt.cpp instantiates the class with.
#define ZT_GPT_BLOCK_MEMBERS(O)                                                                                    \
  template void GPT<O>::block_forward(int, const GPT<O>::T*, int, int);                                          \
  template void GPT<O>::block_forward_inner(int, const GPT<O>::BlockActs&, const GPT<O>::T*, int, int);          \
  template void GPT<O>::block_backward(int, const GPT<O>::BlockActs&, const GPT<O>::T*, int, int);
ZT_GPT_BLOCK_MEMBERS(CpuOps<float>)
ZT_GPT_BLOCK_MEMBERS(CpuOps<double>)
#if ZT_HAVE_CUDA
ZT_GPT_BLOCK_MEMBERS(CudaOps<float>)
ZT_GPT_BLOCK_MEMBERS(CudaOps<bf16>)
#endif
#undef ZT_GPT_BLOCK_MEMBERS

}  // namespace zt
