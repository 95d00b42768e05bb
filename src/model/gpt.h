// GPT-2, forward and backward written once over an op table: CpuOps<float|double> (src/backend/ops_cpu.h) or
// CudaOps<float|bf16> (src/backend/ops_cuda.h). The model never touches its buffers from the host directly:
// everything crosses through Ops::h2d / Ops::d2h, so the same code drives host and device memory.
//
// The model knows no communication, sharding or files beyond its own weights format: a ZeRO
// engine drives it through UnitHooks (where gathers and gradient-bucket launches happen) and may
// point any unit's parameters / gradients at buffers it owns (set_unit_params / set_unit_grads).
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "model/config.h"
#include "model/layout.h"
#include "model/recompute.h"
#include "model/tensor_parallel.h"
#include "runtime/error.h"
#include "runtime/memory.h"

namespace zt {

// Called by the model around each unit's work (E embedding units, layout.h; E = 1 unless the
// embedding is split into row chunks). Parameters are read between before_forward(u) /
// after_forward(u) and between before_backward(u) / after_backward(u), in this order:
//   forward   E-1..0 (lookup: wpe, then each chunk's wte rows), E..E+L-1 (blocks), E+L (final
//             norm), 0..E-1 (tied LM head: each chunk's columns of the logits)
//   backward  E-1..0 (LM head: its input gradient only), E+L, E+L-1..E (blocks in reverse)
// Gradients of u are written between before_grads(u) and grads_ready(u), once per backward, after
// the parameter hooks when both apply: final norm and blocks as they run; the embedding's last,
// E-1..0, each unit's LM-head part (dlogits^T lnf) and lookup part together, reading no parameters
// (so a stage-3 engine gathers nothing for them, and no embedding gradient is held through the
// whole backward). Exception, a chunked classifier (Recompute::classifier_chunk): the dlogits are
// not kept. With one embedding unit, both of the head's gradients (unit 0's LM-head part and the
// input gradient) are taken in forward(write_dlogits), chunk by chunk while its logits exist, so
// before_grads(0) comes right after forward's before_forward(0) for the head; backward's
// before_backward(0) / after_backward(0) for the head still come (with nothing between them), and
// grads_ready(0) stays at the end, after the lookup part. With E units, each is used once more at the end: before_backward(e),
// before_grads(e), its LM-head part (logits recomputed from its parameters) and lookup part,
// after_backward(e), grads_ready(e) (classifier_regathers).
// With set_defer_lookup_grads(true) (one embedding unit only) the embedding's gradients are
// written right after the LM head's input gradient instead (whole logits: before_grads(0), the
// LM-head part, grads_ready(0); chunked: the LM-head part already written chunk by chunk with the
// input gradient, then grads_ready(0)), the LM-head part only, and at the end of backward
// embedding_lookup_deferred() hands the lookup part to the engine (lookup_grad_out(),
// lookup_inputs()): it can reduce the large LM-head part while backward runs. Whole logits with
// that deferred lookup take the LM-head part before the head's input gradient (before_grads(0), the
// part, grads_ready(0), then backward's before_backward(0) / after_backward(0)): it reads no
// parameters, and its reduction starts a third of the head earlier.
// The head over whole logits asks head_rows(e) before before_forward(e): ranges of unit e's wte rows
// (row0 relative to the unit's first row) in the order their parameters become present, each
// waited by before_head_rows(e, k) before its columns of the logits are computed; empty (the
// default): the unit's rows at once, present from before_forward(e) (docs/design.md §3.4).
struct UnitHooks {
  virtual ~UnitHooks() = default;
  virtual void before_forward(int unit) {}
  virtual void after_forward(int unit) {}
  virtual void before_backward(int unit) {}
  virtual void after_backward(int unit) {}
  // The unit's gradients are about to be accumulated (the grads pointer must be valid from here).
  virtual void before_grads(int unit) {}
  // The unit's gradients are complete for this backward pass.
  virtual void grads_ready(int unit) {}
  // Deferred lookup (set_defer_lookup_grads): the lookup part of the embedding's gradient is for
  // the engine to add, from lookup_grad_out() and lookup_inputs(), valid until the next forward.
  virtual void embedding_lookup_deferred() {}
  virtual std::vector<VocabRows> head_rows(int unit) { return {}; }
  virtual void before_head_rows(int unit, int k) {}
};

template <class Ops>
class GPT {
 public:
  using T = typename Ops::T;  // parameters, gradients, activations
  using S = typename Ops::S;  // statistics kept for backward: layernorm mean/rstd, attention lse, losses
  using M = typename Ops::M;  // host-side values for init / load / save (and optimizer state)

  // Allocates activations for batches up to (B, Tn) (tracked: activations), laid out for the
  // recompute policy, and, unless told not to, full flat parameters and gradients (tracked:
  // params, grads). A ZeRO engine that shards them passes false and points the units at its own
  // buffers. embedding_rows: wte rows per embedding unit (ParamLayout; 0 = the embedding is one unit).
  // activation_slots: copies of the activations, one per micro-batch in flight on a pipeline stage
  // (use_activation_slot).
  GPT(const GPTConfig& cfg, int B, int Tn, MemoryTracker& mem, size_t pad_multiple = 128, bool full_params = true,
      bool full_grads = true, const Recompute& rc = {}, int embedding_rows = 0, int activation_slots = 1);

  // Bytes of activations (and activation gradients) the constructor allocates for (B, Tn) under rc.
  static size_t activation_bytes(const GPTConfig& cfg, int B, int Tn, const Recompute& rc = {}, int slots = 1);
  // Positions per classifier chunk at (B, Tn) under rc (B*Tn: not chunked); resolves auto (-1).
  static int classifier_rows(const GPTConfig& cfg, int B, int Tn, const Recompute& rc);
  // Whether backward gathers the embedding's units once more for their gradients: a chunked
  // classifier over a split embedding of embedding_units units (UnitHooks; docs/design.md §3.11).
  static bool classifier_regathers(const GPTConfig& cfg, int B, int Tn, const Recompute& rc, int embedding_units) {
    return classifier_rows(cfg, B, Tn, rc) < B * Tn && embedding_units > 1;
  }
  // Matmul and attention FLOPs of one forward pass at (B, Tn), and those backward spends
  // recomputing forward work under rc with that many embedding units (model/recompute.cpp).
  // Pointwise work is not counted.
  static double forward_flops(const GPTConfig& cfg, int B, int Tn);
  static double recompute_flops(const GPTConfig& cfg, int B, int Tn, const Recompute& rc, int embedding_units);

  const GPTConfig& config() const { return cfg_; }
  const Recompute& recompute() const { return rc_; }
  const ParamLayout& layout() const { return layout_; }

  T* params() { return params_.as<T>(); }  // (layout.total()) all units, padded
  T* grads() { return grads_.as<T>(); }    // same layout
  // A tensor within one unit (not wte when it is split: wte_rows()).
  T* param(ParamId id, int layer = -1) { return unit_param_[size_t(layout_.slot(id, layer).unit)] + local(id, layer); }
  T* grad(ParamId id, int layer = -1) { return unit_grad_[size_t(layout_.slot(id, layer).unit)] + local(id, layer); }
  // Embedding unit e's rows of wte (layout.vocab_rows(e)), which start its unit.
  T* wte_rows(int e) { return unit_param_[size_t(e)]; }
  T* wte_grad_rows(int e) { return unit_grad_[size_t(e)]; }
  void set_unit_params(int u, T* p) { unit_param_[size_t(u)] = p; }
  void set_unit_grads(int u, T* g) { unit_grad_[size_t(u)] = g; }
  void set_hooks(UnitHooks* h) { hooks_ = h ? h : &no_hooks_; }
  // The tensor group this rank's split matrices are completed over (config().tp > 1 needs one;
  // model/tensor_parallel.h). Not owned.
  void set_tensor_group(TensorGroupOps* g) {
    ZT_REQUIRE(!g || g->elem_bytes() == int(sizeof(T)), "model: the tensor group moves " << g->elem_bytes()
                                                            << "-byte elements, the model's activations are "
                                                            << sizeof(T) << "-byte");
    tensor_group_ = g;
  }
  // See UnitHooks: the next backward() writes the embedding's LM-head gradient first and leaves
  // the lookup part to embedding_lookup_deferred(). One embedding unit only.
  void set_defer_lookup_grads(bool d) {
    ZT_ASSERT(!d || layout_.embedding_units() == 1);
    defer_lookup_ = d;
  }
  // The lookup gradient's inputs after a deferred backward, in the backend's memory: the gradient
  // of the embedding's output (B, Tn, C) and the token ids (B, Tn) of the last forward.
  const T* lookup_grad_out() const { return gs_.dresidual; }
  const int* lookup_inputs() const { return acts_.inputs; }
  // The lookup's output (B, Tn, C): an engine that assembles the embedding's output from sharded
  // parameters writes it in its before_forward hook of the lookup and calls lookup_given(), and
  // this forward's lookup reads no parameters. One embedding unit only.
  T* lookup_output() { return acts_.encoded; }
  void lookup_given() {
    ZT_ASSERT(layout_.embedding_units() == 1);
    lookup_given_ = true;
  }
  // Pipeline stages (docs/design.md §3.14). Forward and backward work on the activations of slot k
  // (0..activation_slots-1) from here: a stage keeps one per micro-batch in flight, so a micro-batch's
  // backward finds what its forward kept. The boundary buffers, (B, Tn, C) or under sequence
  // parallelism this rank's positions of them, in the backend's memory: before forward() on a stage
  // after the first, its input (the previous stage's output); after it on a stage before the last,
  // its output; before backward() on a stage before the last, the gradient of that output (the
  // residual gradient backward accumulates into: one buffer for all slots); after it on a stage
  // after the first, the gradient of its input.
  // With model chunks (interleaved, GPTConfig::chunks), forward and backward run chunk c's blocks
  // from use_chunk(c) on (the lookup in chunk 0 of the first stage, the head after the last chunk
  // of the last), and the boundaries are that chunk's: its input is where the block before it
  // would have written its output (residual3, which no backward reads: the slot's place for it).
  void use_activation_slot(int k);
  // A stage boundary's bytes at (B, Tn): (B, Tn, C) of T, this rank's rows under sequence parallelism.
  static size_t boundary_bytes(const GPTConfig& cfg, int B, int Tn) {
    return cfg.sp_rows(size_t(B) * size_t(Tn)) * size_t(cfg.C) * sizeof(T);
  }
  void use_chunk(int c) {
    ZT_ASSERT(c >= 0 && c < cfg_.chunks());
    chunk_ = c;
  }
  T* stage_input() { return block_input(cfg_.chunk_begin(chunk_)); }
  const T* stage_output() const { return residual_out(cfg_.chunk_begin(chunk_ + 1) - 1); }
  T* stage_output_grad() { return gs_.dresidual; }
  const T* stage_input_grad() const { return gs_.dresidual; }
  int last_batch() const { return last_B_; }
  int last_seq_len() const { return last_T_; }

  // GPT-2 initialisation: N(0, 0.02) for weights and embeddings, residual projections scaled by
  // 1/sqrt(2L), zero biases, unit LayerNorm gains. Counter-based RNG: element i of tensor k gets
  // the same value for a given seed whatever shard computes it.
  void init_gpt2(uint64_t seed);
  // The same values for elements [offset, offset + n) of layout tensor k only, in host memory:
  // what a rank that keeps a shard computes (no rank builds the whole model to cut its part).
  void init_gpt2_values(uint64_t seed, int k, size_t offset, size_t n, M* out) const;
  // llm.c model checkpoint (.bin, fp32 version 3). Dimensions must match; positions beyond
  // maxT in the file are dropped, vocabulary padding rows are zeroed.
  void load_llmc(const std::string& path);
  // The same checks and values, one tensor at a time: sink(k, values) gets layout tensor k's
  // numel values (vocabulary padding rows zero) in host memory; load_llmc uploads them whole, a
  // sharded engine keeps its part. At most one tensor is in host memory at a time.
  void read_llmc(const std::string& path, const std::function<void(int k, const M* values)>& sink) const;
  // Writes and fsyncs `path`; throws one line naming it and the system's reason.
  void save_llmc(const std::string& path);
  // Where the weights a writer produces go: elements [begin, begin + count) of tensor `whole_k` of
  // the whole model's layout (ParamLayout(cfg.whole(), 1), llm.c's tensors), as fp32 host values.
  using LlmcSink = std::function<void(int whole_k, const float* values, size_t begin, size_t count)>;
  // The weights one unit at a time into `sink` (empty on ranks that do not write: they still make
  // the call, so a sharded engine can gather and a tensor group broadcast inside it): unit_params(u)
  // returns unit u's parameters (layout order, padded) in the backend's memory. A pipeline stage
  // after the first gives its blocks (and ln_f), not the embedding (the first stage's copy is the
  // model's). At most one unit is in host memory at a time.
  void save_llmc_units(const LlmcSink& sink, const std::function<const T*(int u)>& unit_params) const;
  // Bytes save_llmc writes for this configuration (for the free-space check before training).
  static size_t llmc_file_bytes(const GPTConfig& cfg);

  // inputs, targets: (B, Tn) token ids in host memory (copied to the model's own buffers).
  // targets may be nullptr (logits only; returns 0). Returns the mean loss over B*Tn tokens.
  // With write_dlogits, the logits buffer is overwritten with d(dloss * sum of token losses)/dlogits,
  // ready for backward() (a chunked head over one embedding unit takes its gradients here instead:
  // forward(write_dlogits) must then be followed by backward()).
  double forward(const int* inputs, const int* targets, int B, int Tn, bool write_dlogits = false, S dloss = S(0));
  // Accumulates parameter gradients of the loss given to the last forward(write_dlogits=true).
  void backward();
  void zero_grad();

  // In the backend's memory (host pointers only for CpuOps):
  // (B, Tn, Vp), stride Vp; with classifier chunks and no targets, rows from logits_row0_ only.
  const T* logits() const { return acts_.logits; }
  const S* losses() const { return acts_.losses; }  // (B, Tn)
  // One row of logits (the first V entries) copied to the host, for sampling.
  std::vector<float> logits_row(int row) const;

  // Host <-> backend memory, converting between the host type M and the storage type T.
  static void upload(T* dst, const M* src, size_t n);
  static void download(M* dst, const T* src, size_t n);

 private:
  size_t local(ParamId id, int layer) const {
    const TensorSlot& s = layout_.slot(id, layer);
    ZT_ASSERT(s.unit == s.last_unit);
    return s.offset - layout_.units()[size_t(s.unit)].offset;
  }

  // One block's activations at one layer: what block_forward writes, block_backward reads and,
  // under a recompute policy, backward writes again first (docs/design.md §3.11).
  struct BlockActs {
    T* ln1;         // (B, T, C)
    S* ln1_mean;    // (B, T)
    S* ln1_rstd;    // (B, T)
    T* qkv;         // (B, T, 3C)
    T* atty;        // (B, T, C)
    S* att_lse;     // (B, NH, T)   log-sum-exp per attention row; no (T, T) matrix is kept
    T* attproj;     // (B, T, C)
    T* residual2;   // (B, T, C)
    T* ln2;         // (B, T, C)
    S* ln2_mean;    // (B, T)
    S* ln2_rstd;    // (B, T)
    T* fch;         // (B, T, 4C)
    T* fch_gelu;    // (B, T, 4C)
    T* fcproj;      // (B, T, C)    forward only: backward never reads it
  };

  // Activations kept for backward. Layer-indexed buffers have a layer stride from the allocated
  // (B_, T_), so smaller batches (sampling) reuse the same memory.
  struct Activations {
    int* inputs;    // (B, T)   token ids of the last forward
    int* targets;   // (B, T)
    T* encoded;     // (B, T, C)
    // Each field of `kept` holds, one after the other, the layers whose field the policy keeps
    // ((kept layers, B, T, ...): all L under none). `scratch` holds one layer of a field for
    // the layers that do not keep it, rewritten per layer (nothing when every layer keeps it).
    BlockActs kept;
    BlockActs scratch;
    T* residual3;   // (L, B, T, C)   block outputs = next block inputs: kept under every policy
    T* lnf;         // (B, T, C)
    S* lnf_mean;    // (B, T)
    S* lnf_rstd;    // (B, T)
    T* logits;      // (P, Vp)   P = classifier chunk rows (B*T without chunks); whole: overwritten
                    //           by dlogits when forward(write_dlogits); in chunks: one chunk's
    S* losses;      // (B, T)
    S* lse;         // (B, T)   chunked only: log-sum-exp per position (running max in forward)
    S* lse_sum;     // (B, T)   chunked only: running sum of exp across vocabulary chunks
    T* gathered;    // (B, T, C) sequence parallelism only: a sequence-region field gathered whole
    // Tensor parallelism only (else nullptr):
    S* loss_stats;  // (1 + tp, 3, B, T) the loss's (max, sum of exp, target logit) per position: this
                    //           rank's, then every rank's in rank order (vocab_parallel_xent)
    T* vocab_row;   // (Vp)      one position's logits over the whole padded vocabulary (logits_row)
    T* dlnf;        // (B, T, C) a pipeline's last stage with a chunked head only (else empty): the
                    //           head's input gradient from forward, kept per slot until backward
  };
  // Gradient scratch for one layer at a time (backward walks layers in reverse and reuses it).
  struct GradScratch {
    T* dresidual;   // (B, T, C)   gradient of the residual stream, accumulated through all layers
    T* dC;          // (B, T, C)   dln2 / datty / dln1 / dlnf, one after the other
    T* d4C;         // (B, T, 4C)  dfch (the GELU's backward rides in the product: no dfch_gelu buffer)
    T* dqkv;        // (B, T, 3C)
    // Sequence parallelism only (else nullptr):
    T* dchunk;      // (B T / tp, C) a reduce-scatter's result: this rank's positions of a gradient
    T* ln_grads;    // (2, C) one LayerNorm's weight and bias gradient from this rank's positions
  };

  // Tensor parallelism (model/tensor_parallel.h): the sum over the tensor group of n values that
  // each rank holds a part of, in place (nothing with tp = 1); a row-parallel projection's bias,
  // added by tensor rank 0 only (nullptr on the others).
  void tensor_sum(T* buf, size_t n);
  // Sequence parallelism's pair: every rank's send_n values, in rank order, into recv; and the sum
  // over the group of tp x recv_n values, rank r keeping part r.
  void tensor_gather(const T* send, T* recv, size_t send_n);
  void tensor_scatter(const T* send, T* recv, size_t recv_n);
  // A LayerNorm's backward over this rank's rows; under sequence parallelism its weight gradients,
  // from this rank's positions only, are summed over the group before they are added.
  void layernorm_backward_here(T* dinp, ParamId w, ParamId b, int layer, const T* dout, const T* inp, const S* mean,
                               const S* rstd, int rows);
  // The sequence-parallel block (src/model/gpt_block_sp.cpp): the same math as block_forward_inner /
  // block_forward / block_backward with the LayerNorm and residual work on this rank's positions.
  void block_forward_inner_sp(int l, const BlockActs& a, const T* x, int B, int Tn);
  void block_forward_sp(int l, const T* x, int B, int Tn);
  void block_backward_sp(int l, const BlockActs& a, const T* x, int B, int Tn);
  T* proj_bias(ParamId id, int l) { return cfg_.tp_rank == 0 ? param(id, l) : nullptr; }
  // The vocabulary-parallel loss of positions [c0, c0 + n), whose logits (n, vocab()) start the
  // logits buffer: each row's max, sum of exp and target logit combined over the tensor group
  // (fold_loss_stats); dlogits written over the logits with write_dlogits.
  void vocab_parallel_xent(const int* targets, int c0, int n, bool write_dlogits, S dloss);
  void fold_loss_stats(S* max, S* sum, S* target, size_t n);
  void zero_stats(S* p, size_t n);  // n statistics in the backend's memory set to 0

  // Where layer l's activations are under the recompute policy: its kept slices or the scratch.
  BlockActs block_acts(int l) const;
  // The residual stream around block l in the current slot: its output (residual3[l]) and its input
  // (the lookup's output for block 0, else block l - 1's output).
  T* residual_out(int l) const {
    return acts_.residual3 + size_t(l) * cfg_.sp_rows(size_t(B_) * size_t(T_)) * size_t(cfg_.C);
  }
  T* block_input(int l) const { return l == 0 ? acts_.encoded : residual_out(l - 1); }
  // Whether this chunk runs the lookup / the head (the first / last stage's first / last chunk).
  bool runs_lookup() const { return cfg_.first_stage && chunk_ == 0; }
  bool runs_head() const { return cfg_.last_stage && chunk_ == cfg_.chunks() - 1; }
  // The lookup, unit by unit: encoded = wpe[t] + wte[token] (after lookup_given(): nothing).
  void lookup_forward(int B, int Tn);
  // Block l (src/model/gpt_block.cpp): forward; the part of it whose outputs backward reads (what
  // a recomputed block reruns); backward.
  void block_forward(int l, const T* x, int B, int Tn);
  void block_forward_inner(int l, const BlockActs& a, const T* x, int B, int Tn);
  void block_backward(int l, const BlockActs& a, const T* x, int B, int Tn);
  // What the policy dropped of block l, rewritten with the parameters the before_backward hook
  // made available (src/model/recompute.cpp).
  void block_recompute(int l, const BlockActs& a, const T* x, int B, int Tn);

  // The tied LM head and its loss (src/model/classifier.cpp), in one of three variants per pass:
  // whole logits, chunks (one embedding unit), regather (chunks over a split embedding).
  enum class Head { whole, chunks, regather };
  Head head(int N, bool with_targets) const;
  // Forward from lnf: the logits (no targets: the last chunk's rows, returns 0) or the mean loss
  // over the N positions, with dlogits written or kept for backward when write_dlogits.
  double classifier_forward(const int* targets, int N, bool write_dlogits, S dloss);
  // Backward's first part: dlnf into gs_.dC (in chunks over one unit, forward wrote it, and the
  // head's weight gradient too); returns where it is (sequence parallelism: this rank's positions
  // of it, in gs_.dchunk).
  const T* classifier_backward();
  // The embedding's gradients, unit by unit, between before_grads(e) and grads_ready(e): the
  // LM-head part dW_rows += dlogits[:, rows]^T @ lnf (whole logits; regather: recomputed per
  // chunk; chunks: already written by classifier_backward), then (with_lookup) the lookup's rows and wpe.
  // The first of several pipeline stages, which runs no head, has the lookup's part only (!with_head).
  void embedding_grads(bool with_head, bool with_lookup);
  // Regather: positions [c0, c0 + n) of embedding unit e's logits, recomputed and turned into
  // dlogits from the kept log-sum-exp; then dlnf += dlogits @ W_e and/or dwte += dlogits^T @ lnf
  // (whichever is not null).
  void classifier_chunk_grad(int e, int c0, int n, T* dlnf, T* dwte, void* scratch);

  GPTConfig cfg_;
  Recompute rc_;
  ParamLayout layout_;
  int B_, T_;
  Allocation params_, grads_, act_mem_, grad_act_mem_, scratch_;
  // Pipeline slots: act_mem_ holds slots_ copies of act_slot_bytes_, each field at its offset.
  std::vector<void**> activation_fields();  // the Activations fields, in carving order
  std::vector<size_t> act_offsets_;
  size_t act_slot_bytes_ = 0;
  int slots_ = 1;
  int chunk_ = 0;  // use_chunk
  int last_B_ = 0, last_T_ = 0;  // shape of the last forward, for backward()
  bool defer_lookup_ = false;    // set_defer_lookup_grads
  bool lookup_given_ = false;    // lookup_given(): skip the next lookup
  S last_dloss_ = S(0);          // dloss of the last forward(write_dlogits), for regathered dlogits
  int cls_rows_ = 0;             // positions per classifier chunk (allocated B*T: whole)
  int logits_row0_ = 0;          // position of the logits buffer's first row (sampling in chunks)
  std::vector<T*> unit_param_, unit_grad_;
  Activations acts_{};
  GradScratch gs_{};
  UnitHooks no_hooks_;
  UnitHooks* hooks_ = &no_hooks_;
  TensorGroupOps* tensor_group_ = nullptr;
};

}  // namespace zt
