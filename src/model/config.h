// GPT-2 dimensions. Names follow llm.c: L layers, NH heads, C channels, maxT positions,
// V real vocabulary, Vp vocabulary padded to a multiple of 128 (so the LM-head matmul and its
// kernels see aligned rows; the loss only ever looks at the first V columns).
#pragma once
#include <cstddef>

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

}  // namespace zt
