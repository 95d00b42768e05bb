// Causal multi-head self-attention, flash style: the (T,T) probability matrix is never stored.
// Forward keeps only the per-row log-sum-exp; backward recomputes probabilities from q, k, lse.
// qkv (B,T,3C) holds q | k | v, each (NH, hs=C/NH) per position, as GPT-2's c_attn output.
#pragma once
namespace zt::cpu {
// The register tile of the CPU kernels' small products (attention.cpp): 6 x 16 accumulators fit
// AVX2's 16 vector registers, 8 x 32 use AVX-512's 32. Both give bit-identical results, only the
// speed differs (bench/bench_cpu_attention.cpp times them side by side; docs/benchmarks.md).
// automatic: 8 x 32 where the build targets AVX-512 (-march=native on such a CPU) and T >= 512,
// where it measured faster (backward 1.1x at T 512, 1.3x at T 1024; at T 64 0.95x); else 6 x 16.
enum class AttentionTile { automatic, avx2_6x16, avx512_8x32 };
AttentionTile resolve_attention_tile(AttentionTile tile, int Tn);
// out (B,T,C), lse (B,NH,T) from qkv (B,T,3C). Scale 1/sqrt(hs).
template <class T> void attention_forward(T* out, T* lse, const T* qkv, int B, int Tn, int C, int NH,
                                          AttentionTile tile = AttentionTile::automatic);
// Overwrites dqkv (B,T,3C). Needs the forward's out and lse.
template <class T> void attention_backward(T* dqkv, const T* dout, const T* qkv, const T* out, const T* lse, int B, int Tn,
                                           int C, int NH, AttentionTile tile = AttentionTile::automatic);
}  // namespace zt::cpu

#if ZT_HAVE_CUDA
#include "runtime/cuda_check.h"
namespace zt::cuda {
// Flash-style causal attention (online softmax, no (T,T) matrix). hs = C/NH in {16, 32, 64, 128}.
// bf16: tensor cores (mma.sync); float: SIMT fp32, the parity mode. lse is fp32 (B,NH,T).
// How the bf16 (tensor-core) kernels divide the work; every variant gives bit-identical results, only
// the speed differs (attention_common.cuh; bench/bench_kernels.cpp times them). fp32 ignores it.
// The defaults are the fastest measured on an H100 (scripts/device/RESULTS.md): 16 rows per warp
// forward, 32 backward, heads fastest.
struct AttentionTcVariant {
  int warp_rows = 0;          // rows per warp: 16 or 32 (head size 128 always runs 16); 0: the pass's default
  bool heads_fastest = true;  // launch order: heads fastest, or one head's row blocks together
};
constexpr int kAttentionForwardWarpRows = 16, kAttentionBackwardWarpRows = 32;
template <class T> void attention_forward(T* out, float* lse, const T* qkv, int B, int Tn, int C, int NH,
                                          cudaStream_t stream, AttentionTcVariant variant = {});
// Overwrites dqkv (B,T,3C), deterministically (no atomics: dK/dV and dQ in separate passes, each
// element written once by its owner). scratch: attention_backward_scratch_bytes, the row dot products D = rowsum(dout * out).
size_t attention_backward_scratch_bytes(int B, int Tn, int C, int NH);
template <class T> void attention_backward(T* dqkv, const T* dout, const T* qkv, const T* out, const float* lse, int B,
                                           int Tn, int C, int NH, void* scratch, cudaStream_t stream,
                                           AttentionTcVariant variant = {});
}  // namespace zt::cuda
#endif
