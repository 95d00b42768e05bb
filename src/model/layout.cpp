#include "model/layout.h"

#include <algorithm>
#include <climits>
#include <numeric>

#include "runtime/checked.h"
#include "runtime/error.h"

namespace zt {

namespace {
const char* block_tensor_name(ParamId id) {
  switch (id) {
    case ParamId::ln1w: return "ln_1.weight";
    case ParamId::ln1b: return "ln_1.bias";
    case ParamId::qkvw: return "attn.c_attn.weight";
    case ParamId::qkvb: return "attn.c_attn.bias";
    case ParamId::attprojw: return "attn.c_proj.weight";
    case ParamId::attprojb: return "attn.c_proj.bias";
    case ParamId::ln2w: return "ln_2.weight";
    case ParamId::ln2b: return "ln_2.bias";
    case ParamId::fcw: return "mlp.c_fc.weight";
    case ParamId::fcb: return "mlp.c_fc.bias";
    case ParamId::fcprojw: return "mlp.c_proj.weight";
    case ParamId::fcprojb: return "mlp.c_proj.bias";
    default: return "?";
  }
}
// Chunk rows are a multiple of this, so every chunk but the last is whole pad_multiple elements.
size_t chunk_row_multiple(const GPTConfig& cfg, size_t pad) { return pad / std::gcd(pad, size_t(cfg.C)); }
}  // namespace

int ParamLayout::block_sized_rows(const GPTConfig& cfg, size_t pad) {
  const size_t C = size_t(cfg.C), q = chunk_row_multiple(cfg, pad);
  const size_t A = size_t(cfg.attn_C()), H = size_t(cfg.mlp_C());  // 12 C^2 + 13 C with tp = 1
  const size_t block = (C * (4 * A + 2 * H) + 3 * A + H + 6 * C + pad - 1) / pad * pad;
  const size_t rows = std::max(q, block / C / q * q);
  return rows >= size_t(cfg.vocab()) ? 0 : int(rows);
}

UnitPiece ParamLayout::piece(int u, int k) const {
  const Unit& unit = units_[size_t(u)];
  const TensorSlot& s = tensors_[size_t(k)];
  const size_t lo = std::max(unit.offset, s.offset), hi = std::min(unit.offset + unit.numel, s.offset + s.numel);
  if (lo >= hi) return UnitPiece{k, 0, 0, 0};
  return UnitPiece{k, lo - s.offset, hi - lo, lo - unit.offset};
}

ParamLayout::ParamLayout(const GPTConfig& cfg, size_t pad_multiple, int embedding_rows)
    : cfg_(cfg), pad_(pad_multiple) {
  ZT_ASSERT(pad_multiple > 0);
  ZT_ASSERT(cfg.C <= INT_MAX / 4);  // the plan refuses wider models: shapes below hold 4C as an int
  const int C = cfg.C, L = cfg.L;
  index_.assign(size_t(kNumParamIds) * (size_t(L) + 1), -1);
  const std::string what = "model: parameter count (about 12 x n_layer x n_embd^2)";

  auto begin_unit = [&](const std::string& name) {
    units_.push_back(Unit{name, total_, 0, 0, {}});
  };
  auto add = [&](ParamId id, int layer, std::vector<int> shape, bool decay, std::string name) {
    size_t n = 1;
    for (int d : shape) n = checked_mul(n, size_t(d), what);
    Unit& u = units_.back();
    const int unit = int(units_.size()) - 1;
    TensorSlot s{id, layer, unit, unit, u.offset + u.numel, n, std::move(shape), decay, std::move(name)};
    u.numel = checked_add(u.numel, n, what);
    u.tensors.push_back(int(tensors_.size()));
    index_[size_t(id) * (size_t(L) + 1) + size_t(layer + 1)] = int(tensors_.size());
    tensors_.push_back(std::move(s));
  };
  auto end_unit = [&] {
    Unit& u = units_.back();
    u.padded = checked_round_up(u.numel, pad_, what);
    total_ = checked_add(total_, u.padded, what);
    num_params_ = checked_add(num_params_, u.numel, what);
  };

  // Embedding chunks: wte is added whole to chunk 0, then its rows are moved on to the next
  // chunks (each of which lists it too), so the tensor stays contiguous across the units.
  ZT_ASSERT(embedding_rows >= 0 && size_t(embedding_rows) % chunk_row_multiple(cfg, pad_) == 0);
  // This tensor rank's rows of the vocabulary (all of them without tensor parallelism).
  const int Vl = cfg.vocab();
  const size_t rows = embedding_rows > 0 ? std::min(size_t(embedding_rows), size_t(Vl)) : size_t(Vl);
  // A middle pipeline stage holds no embedding (E = 0: its units start with its first block).
  const int E = cfg.has_embedding() ? int((size_t(Vl) + rows - 1) / rows) : 0;
  for (int e = 0; e < E; ++e) {
    const int row0 = int(size_t(e) * rows), n = e == E - 1 ? Vl - row0 : int(rows);
    vocab_rows_.push_back({row0, n});
    begin_unit(E == 1 ? "embedding" : "embedding." + std::to_string(e));
    if (e == 0) {
      add(ParamId::wte, -1, {Vl, C}, true, "wte.weight");
      units_.back().numel = size_t(n) * size_t(C);
    } else {
      TensorSlot& wte = tensors_[size_t(tensor_index(ParamId::wte))];
      wte.last_unit = e;
      units_.back().numel = size_t(n) * size_t(C);
      units_.back().tensors.push_back(tensor_index(ParamId::wte));
    }
    if (e == E - 1) add(ParamId::wpe, -1, {cfg.maxT, C}, true, "wpe.weight");
    end_unit();
    ZT_ASSERT(e == E - 1 || units_.back().padded == units_.back().numel);  // wte stays contiguous
  }
 // Split matrices as this tensor rank holds them (model/tensor_parallel.h): A = its attention
  // channels (heads x head size), H = its hidden units.
  const int A = cfg.attn_C(), H = cfg.mlp_C();
  for (int l = 0; l < L; ++l) {
    begin_unit("block." + std::to_string(cfg.whole_layer(l)));  // named by its layer in the whole model
    const std::string p = "h." + std::to_string(cfg.whole_layer(l)) + ".";
    auto blk = [&](ParamId id, std::vector<int> shape) {
      add(id, l, shape, shape.size() == 2, p + block_tensor_name(id));
    };
    blk(ParamId::ln1w, {C});
    blk(ParamId::ln1b, {C});
    blk(ParamId::qkvw, {3 * A, C});
    blk(ParamId::qkvb, {3 * A});
    blk(ParamId::attprojw, {C, A});
    blk(ParamId::attprojb, {C});
    blk(ParamId::ln2w, {C});
    blk(ParamId::ln2b, {C});
    blk(ParamId::fcw, {H, C});
    blk(ParamId::fcb, {H});
    blk(ParamId::fcprojw, {C, H});
    blk(ParamId::fcprojb, {C});
    end_unit();
  }
  if (!cfg.last_stage) return;  // the final norm is the last pipeline stage's
  begin_unit("final_norm");
  add(ParamId::lnfw, -1, {C}, false, "ln_f.weight");
  add(ParamId::lnfb, -1, {C}, false, "ln_f.bias");
  end_unit();
}

int ParamLayout::whole_tensor_index(int k) const {
  // The whole model's order: wte, wpe, 12 tensors per block (ParamId order), ln_f w, b.
  const TensorSlot& s = tensors_[size_t(k)];
  constexpr int kBlockTensors = int(ParamId::fcprojb) - int(ParamId::ln1w) + 1;
  if (s.layer >= 0) return int(ParamId::ln1w) + kBlockTensors * cfg_.whole_layer(s.layer) + int(s.id) - int(ParamId::ln1w);
  if (s.id == ParamId::lnfw || s.id == ParamId::lnfb)
    return int(ParamId::ln1w) + kBlockTensors * cfg_.layers() + int(s.id) - int(ParamId::lnfw);
  return int(s.id);  // wte, wpe
}

int ParamLayout::tensor_index(ParamId id, int layer) const {
  ZT_ASSERT(layer >= -1 && layer < cfg_.L);
  int i = index_[size_t(id) * (size_t(cfg_.L) + 1) + size_t(layer + 1)];
  ZT_ASSERT(i >= 0);
  return i;
}

const TensorSlot& ParamLayout::slot(ParamId id, int layer) const { return tensors_[size_t(tensor_index(id, layer))]; }

}  // namespace zt
