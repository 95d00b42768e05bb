// Sequence parallelism (Korthikanti et al. 2022; docs/design.md §3.13, docs/tensor.md): the block of
// gpt_block.cpp with the LayerNorm and residual work cut along the positions. Tensor parallelism
// alone leaves those regions replicated: every tensor rank holds the whole (B, T, C) residual stream,
// its two LayerNorms and their outputs, and runs them all. Here rank r holds positions
// [r N/tp, (r+1) N/tp) of the flattened (B, T) = N (R = N/tp rows), and the all-reduce after each
// row-parallel matmul becomes a reduce-scatter (each rank keeps the sum at its positions) and the
// input of each column-parallel matmul an all-gather:
//
//   forward                                   rows    backward (gradients flow up)
//   ln1 = LN(x)                               R       dx += LN'(RS(dln1 partial))   LN grads summed over tp
//   g = AG(ln1)                   -> qkv      N       dW_qkv from AG(ln1) again; dln1 partial = dqkv W
//   attention, atty @ W_proj      partial N           dout = AG(dresidual): d atty, dW_proj
//   attproj = RS(partial)                     R
//   residual2 = x + attproj, ln2 = LN(res2)   R       dres2 += LN'(RS(dln2 partial))
//   g = AG(ln2)                   -> fc, GELU N       dW_fc from AG(ln2) again; dln2 partial = dfch W
//   fcproj = RS(gelu @ W_fcproj)              R       dout = AG(dresidual): dfch, dW_fcproj
//   residual3 = residual2 + fcproj            R
//
// Per block that is 2 all-gathers + 2 reduce-scatters forward (the volume of the 2 all-reduces they
// replace) and 4 all-gathers + 2 reduce-scatters backward: the gathered LayerNorm outputs are not
// kept (that is the memory saved) but gathered again. The weight gradients of the LayerNorms come
// from R positions on each rank and are summed over the group (layernorm_backward_here); the
// projection biases' gradients come from the gathered output gradient, the same on every rank.
#include "model/gpt.h"

#include "backend/ops_cpu.h"
#if ZT_HAVE_CUDA
#include "backend/ops_cuda.h"
#endif

namespace zt {

template <class Ops>
void GPT<Ops>::block_forward_sp(int l, const T* x, int B, int Tn) {
  const int C = cfg_.C, H = cfg_.mlp_C(), N = B * Tn, R = int(cfg_.sp_rows(size_t(N)));
  const BlockActs a = block_acts(l);
  T* residual3 = acts_.residual3 + size_t(l) * cfg_.sp_rows(size_t(B_) * size_t(T_)) * size_t(C);
  block_forward_inner_sp(l, a, x, B, Tn);
  T* partial = gs_.dC;  // (N, C), free in forward (and in a recompute, before the block's backward)
  Ops::matmul_forward(partial, a.fch_gelu, param(ParamId::fcprojw, l), proj_bias(ParamId::fcprojb, l), N, H, C);
  tensor_scatter(partial, a.fcproj, size_t(R) * size_t(C));
  Ops::residual_forward(residual3, a.residual2, a.fcproj, size_t(R) * size_t(C));
}

template <class Ops>
void GPT<Ops>::block_forward_inner_sp(int l, const BlockActs& a, const T* x, int B, int Tn) {
  const int C = cfg_.C, A = cfg_.attn_C(), H = cfg_.mlp_C(), NH = cfg_.heads(), N = B * Tn;
  const int R = int(cfg_.sp_rows(size_t(N)));
  const size_t RC = size_t(R) * size_t(C);
  T* whole = acts_.gathered;  // (N, C)
  T* partial = gs_.dC;        // (N, C)
  Ops::layernorm_forward(a.ln1, a.ln1_mean, a.ln1_rstd, x, param(ParamId::ln1w, l), param(ParamId::ln1b, l), R, C);
  tensor_gather(a.ln1, whole, RC);
  Ops::matmul_forward(a.qkv, whole, param(ParamId::qkvw, l), param(ParamId::qkvb, l), N, C, 3 * A);
  Ops::attention_forward(a.atty, a.att_lse, a.qkv, B, Tn, A, NH);
  Ops::matmul_forward(partial, a.atty, param(ParamId::attprojw, l), proj_bias(ParamId::attprojb, l), N, A, C);
  tensor_scatter(partial, a.attproj, RC);
  Ops::residual_layernorm_forward(a.residual2, a.ln2, a.ln2_mean, a.ln2_rstd, x, a.attproj, param(ParamId::ln2w, l),
                                  param(ParamId::ln2b, l), R, C);
  tensor_gather(a.ln2, whole, RC);
  if (rc_.policy == Recompute::Policy::selective) {  // unfused: as block_forward_inner says
    Ops::matmul_forward(a.fch, whole, param(ParamId::fcw, l), param(ParamId::fcb, l), N, C, H);
    Ops::gelu_forward(a.fch_gelu, a.fch, size_t(N) * size_t(H));
  } else {
    Ops::matmul_gelu_forward(a.fch_gelu, a.fch, whole, param(ParamId::fcw, l), param(ParamId::fcb, l), N, C, H);
  }
}

template <class Ops>
void GPT<Ops>::block_backward_sp(int l, const BlockActs& a, const T* x, int B, int Tn) {
  // gs_.dresidual: this rank's R positions of dL/d residual3 on entry, of dL/dx on exit.
  const int C = cfg_.C, A = cfg_.attn_C(), H = cfg_.mlp_C(), NH = cfg_.heads(), N = B * Tn;
  const int R = int(cfg_.sp_rows(size_t(N)));
  const size_t RC = size_t(R) * size_t(C);
  void* scratch = scratch_.data();
  T* whole = acts_.gathered;  // (N, C): the output gradient, then a LayerNorm output, gathered
  T* partial = gs_.dC;        // (N, C): an input gradient before its reduce-scatter

  // MLP
  tensor_gather(gs_.dresidual, whole, RC);
  Ops::matmul_backward_through_gelu(gs_.d4C, grad(ParamId::fcprojw, l), grad(ParamId::fcprojb, l), whole,
                                    a.fch_gelu, a.fch, param(ParamId::fcprojw, l), N, H, C, scratch);
  tensor_gather(a.ln2, whole, RC);
  Ops::matmul_backward(partial, grad(ParamId::fcw, l), grad(ParamId::fcb, l), gs_.d4C, whole, param(ParamId::fcw, l),
                       N, C, H, scratch, -1, Dinp::overwrite);
  tensor_scatter(partial, gs_.dchunk, RC);
  layernorm_backward_here(gs_.dresidual, ParamId::ln2w, ParamId::ln2b, l, gs_.dchunk, a.residual2, a.ln2_mean,
                          a.ln2_rstd, R);

  // Attention
  tensor_gather(gs_.dresidual, whole, RC);
  Ops::matmul_backward(partial, grad(ParamId::attprojw, l), grad(ParamId::attprojb, l), whole, a.atty,
                       param(ParamId::attprojw, l), N, A, C, scratch, -1, Dinp::overwrite);
  Ops::attention_backward(gs_.dqkv, partial, a.qkv, a.atty, a.att_lse, B, Tn, A, NH, scratch);
  tensor_gather(a.ln1, whole, RC);
  Ops::matmul_backward(partial, grad(ParamId::qkvw, l), grad(ParamId::qkvb, l), gs_.dqkv, whole, param(ParamId::qkvw, l),
                       N, C, 3 * A, scratch, -1, Dinp::overwrite);
  tensor_scatter(partial, gs_.dchunk, RC);
  layernorm_backward_here(gs_.dresidual, ParamId::ln1w, ParamId::ln1b, l, gs_.dchunk, x, a.ln1_mean, a.ln1_rstd, R);
}

// The members defined here, for the backends gpt.cpp instantiates the class with.
#define ZT_GPT_BLOCK_SP_MEMBERS(O)                                                                                 \
  template void GPT<O>::block_forward_sp(int, const GPT<O>::T*, int, int);                                       \
  template void GPT<O>::block_forward_inner_sp(int, const GPT<O>::BlockActs&, const GPT<O>::T*, int, int);       \
  template void GPT<O>::block_backward_sp(int, const GPT<O>::BlockActs&, const GPT<O>::T*, int, int);
ZT_GPT_BLOCK_SP_MEMBERS(CpuOps<float>)
ZT_GPT_BLOCK_SP_MEMBERS(CpuOps<double>)
#if ZT_HAVE_CUDA
ZT_GPT_BLOCK_SP_MEMBERS(CudaOps<float>)
ZT_GPT_BLOCK_SP_MEMBERS(CudaOps<bf16>)
#endif
#undef ZT_GPT_BLOCK_SP_MEMBERS

}  // namespace zt
