// Parameter layout (docs/design.md §3.2): the parameters live in UNITS, each one contiguous flat buffer:
//
//   unit 0..E-1   embedding   wte (Vp,C) in E row chunks; the last chunk also holds wpe (maxT,C)
//   unit E..E+L-1 block l     ln_1 w,b (C) | c_attn w (3C,C), b (3C) | attn c_proj w (C,C), b (C)
//                             ln_2 w,b (C) | c_fc w (4C,C), b (4C)   | mlp c_proj w (C,4C), b (C)
//   unit E+L      final norm  ln_f w,b (C)   (the LM head is tied to wte in units 0..E-1)
//
// A pipeline stage (GPTConfig::stage, docs/design.md §3.14) lists only what it holds: its blocks
// (named by their layer in the whole model), the embedding on the first and the last stage (E = 0
// on the others), the final norm on the last.
//
// E = 1 (one "embedding" unit) unless the caller asks for block-sized chunks (ZeRO stage 3,
// docs/design.md §3.9): then chunk e ("embedding.e") holds wte rows [row0, row0 + rows), at most
// a padded block (block_sized_rows; the last one plus wpe), and every chunk but the last is a
// whole number of pad_multiple elements, so wte and wpe keep exactly the
// flat offsets they have with E = 1 (only the unit boundaries move) and a tensor may span units.
//
// Every unit is padded to a multiple of `pad_multiple` elements so it splits into equal shards
// (pad, never refuse). The units are concatenated into one flat buffer for params and the same
// layout for grads. Per-tensor offsets are recorded here once and used by the model, the
// optimizer (which tensors get weight decay), the ZeRO engine and checkpoints alike.
#pragma once
#include <cstddef>
#include <string>
#include <vector>

#include "model/config.h"

namespace zt {

// The 16 parameter tensors, in llm.c's checkpoint order.
enum class ParamId : int {
  wte = 0, wpe, ln1w, ln1b, qkvw, qkvb, attprojw, attprojb, ln2w, ln2b, fcw, fcb, fcprojw, fcprojb, lnfw, lnfb, count
};
constexpr int kNumParamIds = int(ParamId::count);

struct TensorSlot {
  ParamId id;
  int layer;                // -1 for tensors outside the blocks
  int unit, last_unit;      // the units holding it: only wte spans several (embedding chunks)
  size_t offset;            // element offset in the global flat buffer
  size_t numel;
  std::vector<int> shape;   // as stored, row-major; (out, in) for linear weights
  bool decay;               // AdamW weight decay applies (2-D weights only)
  std::string name;         // PyTorch/HF-style name, e.g. "h.3.attn.c_attn.weight"
};

struct Unit {
  std::string name;         // "embedding" (or "embedding.0", ...), "block.3", "final_norm"
  size_t offset;            // element offset of the unit in the global flat buffer
  size_t numel;             // real elements
  size_t padded;            // numel rounded up to pad_multiple
  std::vector<int> tensors; // indices into ParamLayout::tensors (wholly or partly in this unit)
};

// The part of tensor `tensor` inside a unit: elements [begin, begin + count) of the tensor sit at
// element `at` of the unit.
struct UnitPiece {
  int tensor;
  size_t begin, count, at;
};

// Embedding unit e's rows of wte: [row0, row0 + rows).
struct VocabRows {
  int row0, rows;
};

class ParamLayout {
 public:
  // embedding_rows: wte rows per embedding unit, a multiple of pad_multiple / gcd(pad_multiple, C)
  // (the last unit holds the rest, and wpe); 0 = the embedding is one unit (E = 1).
  ParamLayout(const GPTConfig& cfg, size_t pad_multiple, int embedding_rows = 0);
  // Rows for block-sized chunks: a padded block's worth, rounded down to that multiple (at least
  // one multiple); 0 when wte is no larger than that.
  static int block_sized_rows(const GPTConfig& cfg, size_t pad_multiple);

  const GPTConfig& config() const { return cfg_; }
  const std::vector<Unit>& units() const { return units_; }
  const std::vector<TensorSlot>& tensors() const { return tensors_; }
  int num_units() const { return int(units_.size()); }
  size_t total() const { return total_; }            // padded elements over all units
  size_t num_params() const { return num_params_; }  // real elements (with wte's padded rows)
  size_t pad_multiple() const { return pad_; }

  const TensorSlot& slot(ParamId id, int layer = -1) const;
  int tensor_index(ParamId id, int layer = -1) const;  // index into tensors()
  int embedding_units() const { return int(vocab_rows_.size()); }  // E
  VocabRows vocab_rows(int e) const { return vocab_rows_[size_t(e)]; }
  int wpe_unit() const { return embedding_units() - 1; }
  int block_unit(int layer) const { return embedding_units() + layer; }
  int final_unit() const { return embedding_units() + cfg_.L; }  // the last pipeline stage only
  // Tensor k's index in the whole model's layout (the same as k without pipeline stages): what names
  // it across stages, e.g. its initialisation's random stream.
  int whole_tensor_index(int k) const;
  // Tensor k's part in unit u (count 0 when none).
  UnitPiece piece(int u, int k) const;

 private:
  GPTConfig cfg_;
  size_t pad_;
  std::vector<Unit> units_;
  std::vector<TensorSlot> tensors_;
  std::vector<int> index_;  // (id, layer) -> tensor index
  std::vector<VocabRows> vocab_rows_;
  size_t total_ = 0, num_params_ = 0;
};

}  // namespace zt
