// Causal multi-head self-attention, flash style: the (T,T) probability matrix is never stored.
// Forward keeps only the per-row log-sum-exp; backward recomputes probabilities from q, k, lse.
// qkv (B,T,3C) holds q | k | v, each (NH, hs=C/NH) per position, as GPT-2's c_attn output.
#pragma once
namespace zt::cpu {
// out (B,T,C), lse (B,NH,T) from qkv (B,T,3C). Scale 1/sqrt(hs).
template <class T> void attention_forward(T* out, T* lse, const T* qkv, int B, int Tn, int C, int NH);
// Accumulates (+=) into dqkv (B,T,3C). Needs the forward's out and lse.
template <class T> void attention_backward(T* dqkv, const T* dout, const T* qkv, const T* out, const T* lse, int B, int Tn,
                                           int C, int NH);
}  // namespace zt::cpu
