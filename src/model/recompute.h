// Activation recomputation (docs/design.md §3.11): what forward keeps for backward under each
// policy, and what backward spends running forward work again. Results never change: backward
// recomputes with the same ops on the same inputs, so it sees bit for bit what forward computed.
//
//   none       every layer keeps every field of its block's activations
//   selective  matmul and attention outputs and the LayerNorm statistics stay; the LayerNorm
//              outputs, the residual sum that feeds ln2 (recomputed with it by the same fused op)
//              and the GELU output are cheap to recompute: backward rewrites them per layer
//   block      blocks l = 0, every, 2*every, ... keep only their input (the previous block's
//              output, kept anyway); backward reruns the block's forward into one layer of
//              scratch (GPT::block_recompute, recompute.cpp). The other blocks keep everything.
//
// The classifier is the other half of the trade: in chunks, the (B*T, Vp) logits never exist and
// backward recomputes them chunk by chunk (model/classifier.cpp).
#pragma once
#include <cstddef>
#include <string>

#include "model/config.h"

namespace zt {

struct Recompute {
  enum class Policy { none, selective, block };
  Policy policy = Policy::none;
  int every = 1;
  // Positions per chunk of the LM head + cross-entropy; 0 = all positions at once; -1 = auto: as
  // many as keep one chunk's logits within one block's activations, at least 256
  // (GPT::classifier_rows).
  int classifier_chunk = 0;

  // From the plan's names (validated there): "none", "selective", "block".
  static Recompute from(const std::string& name, int every, int classifier_chunk = 0) {
    Recompute r;
    r.policy = name == "block" ? Policy::block : name == "selective" ? Policy::selective : Policy::none;
    r.every = every;
    r.classifier_chunk = classifier_chunk;
    return r;
  }
  bool recomputes_block(int l) const { return policy == Policy::block && l % every == 0; }
  // Recomputed blocks among 0..l-1: ceil(l / every), written so that no sum can overflow (every may
  // be anything up to INT_MAX; every >= L recomputes block 0 only, as every = L does).
  int blocks_recomputed_before(int l) const {
    return policy == Policy::block && l > 0 ? (l - 1) / every + 1 : 0;
  }
};

// One block's activations, field by field in the declaration order of GPT::BlockActs (model/gpt.h).
constexpr int kBlockFields = 14;
// Elements per token of field f, and whether it is a statistic (the model's type S: LayerNorm mean
// and rstd, attention log-sum-exp) rather than a value of the storage type T.
size_t block_field_width(const GPTConfig& cfg, int f);
// Positions of BT that field f holds: under sequence parallelism the LayerNorm / residual region's
// fields (ln1 and its statistics, attproj, residual2, ln2 and its statistics, fcproj) hold BT / tp.
size_t block_field_rows(const GPTConfig& cfg, int f, size_t BT);
bool block_field_is_stat(int f);

// Whether layer l keeps field f for backward (fcproj is read by nothing in backward: no policy
// keeps it, one layer of scratch rewritten by every block).
bool keeps(const Recompute& rc, int f, int l);
// Layer l's index among the layers that keep their fields (under every policy, a field kept per
// layer is kept by the same layers), and how many of the L layers keep field f.
int kept_index(const Recompute& rc, int l);
int kept_layers(const Recompute& rc, int L, int f);

}  // namespace zt
