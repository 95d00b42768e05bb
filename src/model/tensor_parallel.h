// Tensor parallelism (Megatron-LM, Shoeybi et al. 2019; docs/design.md §3.13): how one GPT-2
// block's matrices split over the tp ranks of a tensor group, and what the model needs of that group.
//
// A split rule per tensor, with the shapes it produces on a rank (global shape -> local shape;
// weights are stored (out, in), so "column-parallel" cuts the output rows and "row-parallel" the
// input columns):
//
//   tensor           rule         global (out, in)   on a rank             communication
//   wte              vocab rows   (Vp, C)            (Vp/tp, C)            lookup: all-reduce (B,T,C);
//                                                                          head: max, sum exp, target
//                                                                          logit reduced over tp
//   wpe, ln_1, ln_2, replicated   as is              as is                 none: same inputs, same
//   ln_f, the two                                                          gradients on every rank
//   projection biases
//   c_attn w, b      head rows    (3C, C), (3C)      (3 C/tp, C), (3 C/tp) none forward; backward's
//                                                   rows [r C/tp, (r+1) C/tp)  dln_1 all-reduced
//                                                   of each of Q, K and V (its NH/tp heads)
//   attn c_proj w    input cols   (C, C)             (C, C/tp)             forward's output all-reduced
//   c_fc w, b        rows         (4C, C), (4C)      (4C/tp, C), (4C/tp)   backward's dln_2 all-reduced
//   mlp c_proj w     input cols   (C, 4C)            (C, 4C/tp)            forward's output all-reduced
//
// So a block costs two all-reduces of (B, T, C) forward and two backward; the bias of a row-parallel
// projection is added once (by tensor rank 0, before the all-reduce) and its gradient, the sum of
// the same output gradient, comes out the same on every rank. The vocabulary is padded to a multiple
// of lcm(128, tp) (GPTConfig::split): padded rows hold zeros, sit past V and never enter a softmax.
#pragma once
#include <cstddef>
#include <cstdint>

#include "model/config.h"
#include "model/layout.h"
#include "model/recompute.h"

namespace zt {

enum class TensorSplit { replicated, vocab_rows, head_rows, rows, input_cols };

// The rule of the tables above for a parameter tensor.
TensorSplit tensor_split(ParamId id);
// Whether a tensor's gradient is this rank's alone (split) or the same on every tensor rank (its
// square counts once in the gradient norm).
inline bool split_over_tensor(ParamId id) { return tensor_split(id) != TensorSplit::replicated; }

// Element i of tensor `s` as laid out on rank cfg.tp_rank (its local shape) -> its index in the whole
// tensor (the shape it has with tp = 1, vocabulary rows as padded for cfg.tp).
size_t global_index(const TensorSlot& s, const GPTConfig& cfg, size_t i);
// How many local elements from i on are consecutive in the whole tensor too (global_index(i + j) =
// global_index(i) + j): the rest of the tensor where the rule keeps whole rows, of one of Q, K, V
// (head rows), of the local row (input columns). At least 1.
size_t global_run(const TensorSlot& s, const GPTConfig& cfg, size_t i);

// Bytes this rank sends on the tensor group in one micro-step's forward and backward at (B, Tn),
// under comm/comm.h's ring byte model with elem-byte activations (4: fp32, 2: bf16; each all-reduce
// of n elements 2(tp-1) elem n/tp rounded down, each all-gather (tp-1) elem n), n = B Tn C unless said:
//   forward   the lookup's sum, two per block; the loss: an all-gather of 3 B Tn fp32 values (each
//             position's max, sum of exp and target logit), 12 (tp-1) B Tn bytes whatever elem is
//   backward  dlnf from the head's vocabulary columns, two per block
//   recompute one per recomputed block (its attention projection; recompute.policy "block")
// Sequence parallelism: each all-reduce becomes a reduce-scatter or all-gather of (N/tp, C) parts
// (half its bytes each), with more of them (model/gpt_block_sp.cpp). 0 with tp = 1. docs/tensor.md
// has the table.
uint64_t tensor_bytes_per_micro_step(const GPTConfig& cfg, int B, int Tn, const Recompute& rc, int elem);
// How many collectives those bytes travel in (the latencies a micro-step pays), the same list.
uint64_t tensor_collectives_per_micro_step(const GPTConfig& cfg, const Recompute& rc);

// What the model needs of its tensor group (docs/design.md §3.13): blocking collectives in the
// backend's memory (host for the CPU backend, device on CUDA). The three sums move the model's
// activations, elements of its storage type T (fp32, or bf16 summed in bf16 as NCCL does):
// elem_bytes() must equal sizeof(T) (GPT::set_tensor_group checks it). The loss statistics are fp32
// whatever T is, so they travel by all_gather_bytes: a copy, no arithmetic, any element type.
// Implemented over a Comm in src/tensor/.
struct TensorGroupOps {
  virtual ~TensorGroupOps() = default;
  virtual int elem_bytes() const = 0;                                         // of the three below
  virtual void all_reduce(void* buf, size_t n) = 0;                           // sum, in place
  virtual void all_gather(const void* send, void* recv, size_t send_n) = 0;     // recv: tp * send_n, rank order
  virtual void reduce_scatter(const void* send, void* recv, size_t recv_n) = 0;  // send: tp * recv_n summed
  // send_bytes (a multiple of elem_bytes()) from every rank into recv, in rank order.
  virtual void all_gather_bytes(const void* send, void* recv, size_t send_bytes) = 0;
  // Host bytes from tensor rank root to every rank (the llm.c file's slices, at the end of a run).
  virtual void broadcast_host(void* buf, size_t bytes, int root) = 0;
};

}  // namespace zt
