// Fused classifier: softmax + cross-entropy (+ its gradient) in one pass over each row of logits.
// Probabilities are never stored: with write_dlogits the logits are overwritten by
// dloss * (softmax - onehot(target)). Rows are (N, Vp); only the first V columns are the real
// vocabulary, the padding columns get zero gradient and never enter the softmax.
#pragma once
namespace zt::cpu {
// losses (N) = -log softmax(logits[n, :V])[targets[n]]. Returns nothing else.
template <class T> void softmax_xent_forward_backward(T* logits, T* losses, const int* targets, T dloss, int N, int V, int Vp,
                                                       bool write_dlogits);
}  // namespace zt::cpu

#if ZT_HAVE_CUDA
#include "runtime/cuda_check.h"
namespace zt::cuda {
// Fused classifier, one block per row: pass 1 finds max and sum of exp (online), pass 2 writes
// dlogits over the logits. losses are fp32; dloss is the gradient of each token's loss.
template <class T> void softmax_xent_forward_backward(T* logits, float* losses, const int* targets, float dloss, int N,
                                                       int V, int Vp, bool write_dlogits, cudaStream_t stream);
}  // namespace zt::cuda
#endif
