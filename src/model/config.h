// GPT-2 dimensions. Names follow llm.c: L layers, NH heads, C channels, maxT positions,
// V real vocabulary, Vp vocabulary padded to a multiple of 128 (so the LM-head matmul and its
// kernels see aligned rows; the loss only ever looks at the first V columns).
#pragma once
#include <cstddef>
#include <string>

namespace zt {

struct GPTConfig {
  int L = 0;     // layers
  int NH = 0;    // attention heads
  int C = 0;     // channels
  int maxT = 0;  // positions in wpe
  int V = 0;     // real vocabulary
  int Vp = 0;    // padded vocabulary

  static int pad_vocab(int V) { return (V + 127) / 128 * 128; }
  static GPTConfig make(int L, int NH, int C, int maxT, int V) { return {L, NH, C, maxT, V, pad_vocab(V)}; }
};

// What forward keeps for backward (docs/design.md §3.11). none: everything. selective: matmul and
// attention outputs; backward recomputes the LayerNorm outputs and GELU. block: only each
// recomputed block's input (the previous block's output, kept anyway); backward reruns the block's
// forward into one block's worth of scratch. With block, blocks l = 0, every, 2*every, ... are
// recomputed and the others keep everything.
//
// classifier_chunk: positions per chunk of the LM head + cross-entropy; 0 = all positions at once;
// -1 = auto: as many as keep one chunk's logits within one block's activations, at least 256
// (GPT::classifier_rows).
// With chunks, the (B*T, Vp) logits never exist: forward keeps the losses only, backward recomputes
// each chunk's logits to form its dlogits (docs/design.md §3.11). Only for a one-unit embedding.
struct Recompute {
  enum class Policy { none, selective, block };
  Policy policy = Policy::none;
  int every = 1;
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

}  // namespace zt
