#include "model/layout.h"

#include <climits>

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
}  // namespace

ParamLayout::ParamLayout(const GPTConfig& cfg, size_t pad_multiple) : cfg_(cfg), pad_(pad_multiple) {
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
    TensorSlot s{id, layer, int(units_.size()) - 1, u.offset + u.numel, n, std::move(shape), decay, std::move(name)};
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

  begin_unit("embedding");
  add(ParamId::wte, -1, {cfg.Vp, C}, true, "wte.weight");
  add(ParamId::wpe, -1, {cfg.maxT, C}, true, "wpe.weight");
  end_unit();
  for (int l = 0; l < L; ++l) {
    begin_unit("block." + std::to_string(l));
    const std::string p = "h." + std::to_string(l) + ".";
    auto blk = [&](ParamId id, std::vector<int> shape) {
      add(id, l, shape, shape.size() == 2, p + block_tensor_name(id));
    };
    blk(ParamId::ln1w, {C});
    blk(ParamId::ln1b, {C});
    blk(ParamId::qkvw, {3 * C, C});
    blk(ParamId::qkvb, {3 * C});
    blk(ParamId::attprojw, {C, C});
    blk(ParamId::attprojb, {C});
    blk(ParamId::ln2w, {C});
    blk(ParamId::ln2b, {C});
    blk(ParamId::fcw, {4 * C, C});
    blk(ParamId::fcb, {4 * C});
    blk(ParamId::fcprojw, {C, 4 * C});
    blk(ParamId::fcprojb, {C});
    end_unit();
  }
  begin_unit("final_norm");
  add(ParamId::lnfw, -1, {C}, false, "ln_f.weight");
  add(ParamId::lnfb, -1, {C}, false, "ln_f.bias");
  end_unit();
}

int ParamLayout::tensor_index(ParamId id, int layer) const {
  ZT_ASSERT(layer >= -1 && layer < cfg_.L);
  int i = index_[size_t(id) * (size_t(cfg_.L) + 1) + size_t(layer + 1)];
  ZT_ASSERT(i >= 0);
  return i;
}

const TensorSlot& ParamLayout::slot(ParamId id, int layer) const { return tensors_[size_t(tensor_index(id, layer))]; }

}  // namespace zt
