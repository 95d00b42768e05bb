// GPT-2 dimensions. Names follow llm.c: L layers, NH heads, C channels, maxT positions,
// V real vocabulary, Vp vocabulary padded to a multiple of 128 (so the LM-head matmul and its
// kernels see aligned rows; the loss only ever looks at the first V columns).
//
// With tensor parallelism (tp ranks, docs/design.md §3.13, model/tensor_parallel.h) the dimensions
// stay the model's; the helpers below give this rank's part of each split matrix, and Vp is padded
// to a multiple of lcm(128, tp) so that every rank holds the same number of vocabulary rows.
#pragma once
#include <algorithm>
#include <cstddef>
#include <numeric>
#include <utility>
#include <vector>

#include "runtime/checked.h"

namespace zt {

struct GPTConfig {
  int L = 0;     // layers
  int NH = 0;    // attention heads
  int C = 0;     // channels
  int maxT = 0;  // positions in wpe
  int V = 0;     // real vocabulary
  int Vp = 0;    // padded vocabulary
  int tp = 1;       // tensor-parallel ranks the matrices are split over
  int tp_rank = 0;  // this rank's place among them
  bool sp = false;  // sequence parallelism: the LayerNorm / residual regions hold 1/tp of the positions
  // Pipeline parallelism (docs/design.md §3.14): this stage's L blocks are layers [layer0, layer0 + L)
  // of a model of whole_L (0: no pipeline, L itself). The first stage looks the tokens up, the last
  // runs the final norm and the head; both hold the embedding (the head is tied to it).
  int layer0 = 0;
  int whole_L = 0;
  bool first_stage = true, last_stage = true;
  // Interleaved schedules (pipeline/schedule.h): the stage's L blocks are runs of the whole model's
  // layers, one per model chunk: chunk c holds layers [chunk_first[c], + chunk_blocks[c]), which are
  // this stage's blocks [chunk_begin(c), chunk_begin(c + 1)). Empty: one chunk, [layer0, layer0 + L).
  // The first stage looks the tokens up in its chunk 0 only, the last runs the head after its last.
  std::vector<int> chunk_first, chunk_blocks;

  int layers() const { return whole_L > 0 ? whole_L : L; }  // of the whole model
  int chunks() const { return chunk_blocks.empty() ? 1 : int(chunk_blocks.size()); }
  int chunk_begin(int c) const {  // c = chunks(): L
    int b = 0;
    for (int i = 0; i < c && i < int(chunk_blocks.size()); ++i) b += chunk_blocks[size_t(i)];
    return chunk_blocks.empty() && c > 0 ? L : b;
  }
  // Block l of this stage is layer whole_layer(l) of the whole model.
  int whole_layer(int l) const {
    for (size_t c = 0; c < chunk_blocks.size(); ++c) {
      if (l < chunk_blocks[c]) return chunk_first[c] + l;
      l -= chunk_blocks[c];
    }
    return layer0 + l;
  }
  bool has_embedding() const { return first_stage || last_stage; }
  int heads() const { return NH / tp; }          // attention heads here
  int attn_C() const { return C / tp; }          // their channels: qkv is (B, T, 3 attn_C)
  int mlp_C() const { return 4 * C / tp; }       // the MLP's hidden units here
  int vocab() const { return Vp / tp; }          // rows of wte here (padded)
  int vocab_row0() const { return tp_rank * vocab(); }  // the first of them in the whole vocabulary
  // Positions of N (= B x T) that the LayerNorm / residual regions hold here: N / tp under sequence
  // parallelism (rows [tp_rank N/tp, + N/tp) of the flattened (B, T)), else all of them.
  size_t sp_rows(size_t N) const { return sp ? N / size_t(tp) : N; }

  static int pad_vocab(int V, int tp = 1) {
    // lcm(128, tp) by counting: GCC 12's -O3 -march=native miscompiled std::lcm here once inlined
    // into engine_settings (Vp 50048 for V 50257, tp 1; -O2 and -O0 gave 50304).
    int m = 128;
    while (m % tp != 0) m += 128;
    return (V + m - 1) / m * m;
  }
  static GPTConfig make(int L, int NH, int C, int maxT, int V) {
    GPTConfig c;
    c.L = L, c.NH = NH, c.C = C, c.maxT = maxT, c.V = V, c.Vp = pad_vocab(V);
    return c;
  }
  // The same model as rank `rank` of `tp` tensor-parallel ranks holds it.
  GPTConfig split(int tp_size, int rank, bool sequence_parallel = false) const {
    GPTConfig c = *this;
    c.tp = tp_size;
    c.tp_rank = rank;
    c.sp = sequence_parallel && tp_size > 1;
    c.Vp = pad_vocab(V, tp_size);
    return c;
  }
  // Pipeline stage `stage` of `P`, holding blocks [layer0, layer0 + layers) (pipeline/schedule.h's
  // balance_blocks decides the split).
  GPTConfig stage(int P, int stage_index, int first_layer, int layers) const {
    GPTConfig c = *this;
    c.whole_L = L;
    c.layer0 = first_layer;
    c.L = layers;
    c.first_stage = stage_index == 0;
    c.last_stage = stage_index == P - 1;
    c.chunk_first.clear();
    c.chunk_blocks.clear();
    return c;
  }
  // The same stage holding several model chunks (interleaved): runs (first layer, blocks) in order.
  GPTConfig stage_chunks(int P, int stage_index, const std::vector<std::pair<int, int>>& runs) const {
    int layers = 0;
    for (const auto& r : runs) layers += r.second;
    GPTConfig c = stage(P, stage_index, runs.front().first, layers);
    if (runs.size() > 1)
      for (const auto& r : runs) {
        c.chunk_first.push_back(r.first);
        c.chunk_blocks.push_back(r.second);
      }
    return c;
  }
  // The whole model this rank holds a part of: tp 1, the vocabulary padded as for tp (the shapes
  // checkpoints and llm.c files address elements by).
  GPTConfig whole() const {
    GPTConfig c = unstaged();
    c.tp = 1;
    c.tp_rank = 0;
    c.sp = false;
    return c;
  }
  // This tensor rank's part of the model before it was cut into pipeline stages.
  GPTConfig unstaged() const {
    GPTConfig c = *this;
    if (c.whole_L > 0) c.L = c.whole_L;
    c.whole_L = 0;
    c.layer0 = 0;
    c.first_stage = c.last_stage = true;
    c.chunk_first.clear();
    c.chunk_blocks.clear();
    return c;
  }
};

// The bf16 workspace of backend "cpu-bf16" (kernels/matmul_bf16.h) for micro-batches of B x Tn: the
// widest product of this rank's part of the model (the MLP's 4 C / tp; the head's output, its
// vocabulary rows, on the stage that has the head). The Trainer allocates it, the estimate counts
// it: both from here. Checked: the sizes come from a plan.
inline size_t cpu_bf16_workspace_bytes(const GPTConfig& c, int B, int Tn) {
  const char* what = "model: the bf16 workspace (micro_batch x seq_len x the widest product)";
  const size_t rows = checked_mul(size_t(B), size_t(Tn), what), C = size_t(c.C), A = size_t(c.attn_C()),
               H = size_t(c.mlp_C()), head = c.last_stage ? size_t(c.vocab()) : 0;
  const size_t widest_out = std::max({3 * A, H, C, head}), widest_in = std::max({C, A, H});
  const size_t largest_weight = std::max({checked_mul(3 * A, C, what), checked_mul(H, C, what), checked_mul(head, C, what)});
  size_t elems = checked_add(checked_mul(rows, std::max(widest_out, widest_in), what), largest_weight, what);
  elems = checked_add(elems, checked_mul(rows, widest_in, what), what);
  return checked_mul(elems, size_t(2), what);  // bf16: 2 bytes
}

}  // namespace zt
