// GPT-2 dimensions. Names follow llm.c: L layers, NH heads, C channels, maxT positions,
// V real vocabulary, Vp vocabulary padded to a multiple of 128 (so the LM-head matmul and its
// kernels see aligned rows; the loss only ever looks at the first V columns).
//
// With tensor parallelism (tp ranks, docs/design.md §3.13, model/tensor_parallel.h) the dimensions
// stay the model's; the helpers below give this rank's part of each split matrix, and Vp is padded
// to a multiple of lcm(128, tp) so that every rank holds the same number of vocabulary rows.
#pragma once
#include <cstddef>
#include <numeric>

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

  int layers() const { return whole_L > 0 ? whole_L : L; }  // of the whole model
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
  static GPTConfig make(int L, int NH, int C, int maxT, int V) { return {L, NH, C, maxT, V, pad_vocab(V)}; }
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
    return c;
  }
  // The whole model this rank holds a part of: tp 1, the vocabulary padded as for tp (the shapes
  // checkpoints and llm.c files address elements by).
  GPTConfig whole() const {
    GPTConfig c = *this;
    c.tp = 1;
    c.tp_rank = 0;
    c.sp = false;
    if (c.whole_L > 0) c.L = c.whole_L;
    c.whole_L = 0;
    c.layer0 = 0;
    c.first_stage = c.last_stage = true;
    return c;
  }
};

}  // namespace zt
