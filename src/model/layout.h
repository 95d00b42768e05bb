// Parameter layout (docs/design.md §3.2): the parameters live in UNITS, each one contiguous flat buffer:
//
//   unit 0        embedding   wte (Vp,C), wpe (maxT,C)
//   unit 1..L     block l-1   ln_1 w,b (C) | c_attn w (3C,C), b (3C) | attn c_proj w (C,C), b (C)
//                             ln_2 w,b (C) | c_fc w (4C,C), b (4C)   | mlp c_proj w (C,4C), b (C)
//   unit L+1      final norm  ln_f w,b (C)   (the LM head is tied to wte in unit 0)
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
  int unit;
  size_t offset;            // element offset in the global flat buffer
  size_t numel;
  std::vector<int> shape;   // as stored, row-major; (out, in) for linear weights
  bool decay;               // AdamW weight decay applies (2-D weights only)
  std::string name;         // PyTorch/HF-style name, e.g. "h.3.attn.c_attn.weight"
};

struct Unit {
  std::string name;         // "embedding", "block.3", "final_norm"
  size_t offset;            // element offset of the unit in the global flat buffer
  size_t numel;             // real elements
  size_t padded;            // numel rounded up to pad_multiple
  std::vector<int> tensors; // indices into ParamLayout::tensors
};

class ParamLayout {
 public:
  ParamLayout(const GPTConfig& cfg, size_t pad_multiple);

  const GPTConfig& config() const { return cfg_; }
  const std::vector<Unit>& units() const { return units_; }
  const std::vector<TensorSlot>& tensors() const { return tensors_; }
  int num_units() const { return int(units_.size()); }
  size_t total() const { return total_; }            // padded elements over all units
  size_t num_params() const { return num_params_; }  // real elements (with wte's padded rows)
  size_t pad_multiple() const { return pad_; }

  const TensorSlot& slot(ParamId id, int layer = -1) const;
  int tensor_index(ParamId id, int layer = -1) const;  // index into tensors()
  static int block_unit(int layer) { return 1 + layer; }
  int final_unit() const { return cfg_.L + 1; }

 private:
  GPTConfig cfg_;
  size_t pad_;
  std::vector<Unit> units_;
  std::vector<TensorSlot> tensors_;
  std::vector<int> index_;  // (id, layer) -> tensor index
  size_t total_ = 0, num_params_ = 0;
};

}  // namespace zt
