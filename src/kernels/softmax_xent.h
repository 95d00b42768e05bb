// Fused classifier: softmax + cross-entropy (+ its gradient) in one pass over each row of logits.
// Probabilities are never stored: with write_dlogits the logits are overwritten by
// dloss * (softmax - onehot(target)). Rows are (N, Vp); only the first V columns are the real
// vocabulary, the padding columns get zero gradient and never enter the softmax.
#pragma once
namespace zt::cpu {
// losses (N) = -log softmax(logits[n, :V])[targets[n]]. Returns nothing else.
template <class T> void softmax_xent_forward_backward(T* logits, T* losses, const int* targets, T dloss, int N, int V, int Vp,
                                                       bool write_dlogits);

// The same loss over vocabulary column chunks (docs/design.md §3.11: a split embedding's LM head).
// A chunk is columns [col0, col0 + cols) of rows (N, ld), `logits` pointing at column col0; only
// columns < V enter. partial: fold the chunk into each row's running max, running sum of
// exp(x - max) and target logit (first: start them). finish: lse = max + log(sum) (over run_max),
// losses = lse - x_target. grad: logits = dloss * (exp(x - lse) - [col == target]), 0 past V.
template <class T> void xent_chunk_partial(const T* logits, int ld, int N, int col0, int cols, int V, const int* targets,
                                           T* run_max, T* run_sum, T* x_target, bool first);
template <class T> void xent_chunk_finish(T* losses, T* run_max, const T* run_sum, const T* x_target, int N);
template <class T> void xent_chunk_grad(T* logits, int ld, int N, int col0, int cols, int V, const int* targets,
                                        const T* lse, T dloss);
}  // namespace zt::cpu

#if ZT_HAVE_CUDA
#include "runtime/cuda_check.h"
namespace zt::cuda {
// Fused classifier, one block per row: pass 1 finds max and sum of exp (online), pass 2 writes
// dlogits over the logits. losses are fp32; dloss is the gradient of each token's loss.
template <class T> void softmax_xent_forward_backward(T* logits, float* losses, const int* targets, float dloss, int N,
                                                       int V, int Vp, bool write_dlogits, cudaStream_t stream);
// Column chunks, as the CPU functions of the same names (statistics and losses in fp32).
template <class T> void xent_chunk_partial(const T* logits, int ld, int N, int col0, int cols, int V, const int* targets,
                                           float* run_max, float* run_sum, float* x_target, bool first,
                                           cudaStream_t stream);
void xent_chunk_finish(float* losses, float* run_max, const float* run_sum, const float* x_target, int N,
                       cudaStream_t stream);
template <class T> void xent_chunk_grad(T* logits, int ld, int N, int col0, int cols, int V, const int* targets,
                                        const float* lse, float dloss, cudaStream_t stream);
}  // namespace zt::cuda
#endif
