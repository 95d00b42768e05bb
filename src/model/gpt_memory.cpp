// What a GPT allocates (docs/design.md §3.11, §3.14): its flat parameters and gradients, and the
// activations, laid out field by field for the recompute policy, in activation_slots copies for a
// pipeline stage's micro-batches in flight (use_activation_slot). activation_bytes() is the same
// sizing for the estimate: one field table serves both, so the estimate is what is allocated.
#include <algorithm>
#include <array>
#include <cstdint>
#include <initializer_list>
#include <vector>

#include "backend/ops_cpu.h"
#if ZT_HAVE_CUDA
#include "backend/ops_cuda.h"
#endif
#include "model/gpt.h"
#include "runtime/checked.h"
#include "runtime/error.h"

namespace zt {

namespace {
// Kind of element of an activation field: token id, storage type T, or statistic type S.
enum class Elem { token, t, s };
struct FieldSize {
  size_t n;
  Elem kind;
};
template <class T, class S>
size_t elem_bytes(Elem kind) {
  return kind == Elem::token ? sizeof(int) : kind == Elem::t ? sizeof(T) : sizeof(S);
}

// What model/recompute.h's field table says of a BlockActs field.
Elem block_field_kind(int f) { return block_field_is_stat(f) ? Elem::s : Elem::t; }

// Pointers to the fields of a BlockActs, in declaration order (the type is deduced: it is private).
template <class A>
std::array<void**, kBlockFields> block_fields(A& a) {
  return {(void**)&a.ln1,       (void**)&a.ln1_mean, (void**)&a.ln1_rstd, (void**)&a.qkv,      (void**)&a.atty,
          (void**)&a.att_lse,   (void**)&a.attproj,  (void**)&a.residual2, (void**)&a.ln2,     (void**)&a.ln2_mean,
          (void**)&a.ln2_rstd,  (void**)&a.fch,      (void**)&a.fch_gelu, (void**)&a.fcproj};
}

// Element counts of the activation fields, in the declaration order of GPT::Activations (the
// BlockActs `kept`, then `scratch`, field by field), then of GPT::GradScratch. One list serves
// the constructor and activation_bytes(). Every product is checked: layers x batch x sequence x
// channels can pass 2^64 for a plan that validates.
const char* const kActivationSize = "model: activation memory (n_layer x micro_batch x seq_len x 4 n_embd elements)";
size_t product(std::initializer_list<size_t> xs) {
  size_t r = 1;
  for (size_t x : xs) r = checked_mul(r, x, kActivationSize);
  return r;
}
// Positions per classifier chunk for batches up to (B, Tn) (B*Tn: one chunk). Auto (-1): one
// chunk's logits (rows x Vp elements of T) at most one block's activations (every BlockActs field
// of one layer, B*Tn tokens), but at least kMinAutoRows: thinner chunks make the head's matmuls
// and the loss's parallel loops so small that their overhead dominates (5-row chunks: 10x the CPU
// time of a step, docs/design.md §3.11).
constexpr size_t kMinAutoRows = 256;
size_t classifier_rows_for(const GPTConfig& cfg, int B, int Tn, const Recompute& rc, size_t t_bytes, size_t s_bytes) {
  const size_t BT = product({size_t(B), size_t(Tn)});
  if (rc.classifier_chunk > 0) return std::min(BT, size_t(rc.classifier_chunk));
  // Tensor parallelism: auto keeps whole logits (each rank's are 1/tp of them already); a positive
  // chunk still cuts them.
  if (rc.classifier_chunk == 0 || cfg.tp > 1) return BT;
  size_t per_token = 0;
  for (int f = 0; f < kBlockFields; ++f)
    per_token += block_field_width(cfg, f) * (block_field_is_stat(f) ? s_bytes : t_bytes);
  const size_t rows = product({BT, per_token}) / product({size_t(cfg.vocab()), t_bytes});
  return std::clamp<size_t>(rows, std::min(BT, kMinAutoRows), BT);
}
template <class T, class S>
std::vector<FieldSize> activation_sizes(const GPTConfig& cfg, int B, int Tn, const Recompute& rc) {
  const size_t L = size_t(cfg.L), C = size_t(cfg.C), Vp = size_t(cfg.vocab());
  const size_t BT = product({size_t(B), size_t(Tn)});
  // Under sequence parallelism the residual stream (encoded, residual3) holds BT / tp positions.
  const size_t BTC = product({BT, C}), R = cfg.sp_rows(BT), RC = product({R, C}), LRC = product({L, R, C});
  const Elem i = Elem::token, t = Elem::t, s = Elem::s;
  std::vector<FieldSize> sizes = {{BT, i}, {BT, i}, {RC, t}};
  auto field = [&](int f) { return product({block_field_rows(cfg, f, BT), block_field_width(cfg, f)}); };
  for (int f = 0; f < kBlockFields; ++f)
    sizes.push_back({product({size_t(kept_layers(rc, cfg.L, f)), field(f)}), block_field_kind(f)});
  for (int f = 0; f < kBlockFields; ++f)
    sizes.push_back({kept_layers(rc, cfg.L, f) < cfg.L ? field(f) : 0, block_field_kind(f)});
  // Logits: one classifier chunk's rows (all B*T without chunks).
  const size_t rows = classifier_rows_for(cfg, B, Tn, rc, sizeof(T), sizeof(S));
  // With chunks, the log-sum-exp and the running sum of exp per position (a split embedding's
  // vocabulary chunks are folded in one after the other; unused with one unit, kept for one layout);
  // the same two for the vocabulary-parallel loss (tensor parallelism).
  const size_t lse = rows < BT || cfg.tp > 1 ? BT : 0;
  // The final norm and the head run on the last pipeline stage only: the others keep none of theirs.
  const size_t head = cfg.last_stage ? 1 : 0;
  sizes.insert(sizes.end(), {{LRC, t}, {head * BTC, t}, {head * BT, s}, {head * BT, s}, {head * product({rows, Vp}), t},
                             {head * BT, s}, {head * lse, s}, {head * lse, s}});
  // Sequence parallelism: one (B, T, C) buffer the sequence region's chunks are gathered into (the
  // LayerNorm outputs before the column-parallel matmuls, the residual gradient before the row-parallel ones).
  sizes.push_back({cfg.sp ? BTC : 0, t});
  // Tensor parallelism: the loss statistics exchanged, and one gathered row of logits (sampling).
  const bool tp = cfg.tp > 1 && cfg.last_stage;
  sizes.insert(sizes.end(), {{tp ? product({1 + size_t(cfg.tp), 3, BT}) : 0, s}, {tp ? size_t(cfg.Vp) : 0, t}});
  // A pipeline's last stage with a chunked head: the head's input gradient, taken in forward, kept
  // with its micro-batch until backward (GPipe runs every forward before the first backward).
  sizes.push_back({cfg.whole_L > 0 && cfg.last_stage && rows < BT ? BTC : 0, t});
  return sizes;
}
std::vector<FieldSize> grad_scratch_sizes(const GPTConfig& cfg, int B, int Tn) {
  const size_t BT = product({size_t(B), size_t(Tn)}), BTC = product({BT, size_t(cfg.C)});
  const size_t BTH = product({BT, size_t(cfg.mlp_C())}), BT3A = product({BT, 3, size_t(cfg.attn_C())});
  const size_t chunk = cfg.sp ? product({cfg.sp_rows(BT), size_t(cfg.C)}) : 0, ln = cfg.sp ? 2 * size_t(cfg.C) : 0;
  return {{BTC, Elem::t}, {BTC, Elem::t}, {BTH, Elem::t}, {BT3A, Elem::t}, {chunk, Elem::t}, {ln, Elem::t}};
}
// Each field starts on a 64-byte boundary so kernels get aligned rows (and 128-bit loads).
size_t aligned_bytes(size_t bytes) { return checked_round_up(bytes, MemoryTracker::kAlign, kActivationSize); }
template <class T, class S>
size_t field_bytes(const FieldSize& f) {
  return aligned_bytes(checked_mul(f.n, elem_bytes<T, S>(f.kind), kActivationSize));
}
template <class T, class S>
size_t total_bytes(const std::vector<FieldSize>& fields) {
  size_t n = 0;
  for (const FieldSize& f : fields) n = checked_add(n, field_bytes<T, S>(f), kActivationSize);
  return n;
}
}  // namespace

template <class Ops>
size_t GPT<Ops>::activation_bytes(const GPTConfig& cfg, int B, int Tn, const Recompute& rc, int slots) {
  const size_t slot = total_bytes<T, S>(activation_sizes<T, S>(cfg, B, Tn, rc));
  size_t n = checked_add(checked_mul(slot, size_t(slots), kActivationSize), total_bytes<T, S>(grad_scratch_sizes(cfg, B, Tn)),
                         kActivationSize);
  return checked_add(n, aligned_bytes(Ops::scratch_bytes(B, Tn, cfg.C, cfg.NH, cfg.Vp)), kActivationSize);
}

template <class Ops>
int GPT<Ops>::classifier_rows(const GPTConfig& cfg, int B, int Tn, const Recompute& rc) {
  return int(classifier_rows_for(cfg, B, Tn, rc, sizeof(T), sizeof(S)));
}

template <class Ops>
typename GPT<Ops>::BlockActs GPT<Ops>::block_acts(int l) const {
  static_assert(sizeof(BlockActs) == kBlockFields * sizeof(void*), "model/recompute.h lists every BlockActs field");
  BlockActs a{}, kept = acts_.kept, scratch = acts_.scratch;
  const auto out = block_fields(a), k = block_fields(kept), s = block_fields(scratch);
  const size_t BT = size_t(B_) * size_t(T_);
  for (int f = 0; f < kBlockFields; ++f) {
    const size_t layer = block_field_rows(cfg_, f, BT) * block_field_width(cfg_, f) * elem_bytes<T, S>(block_field_kind(f));
    *out[f] = keeps(rc_, f, l) ? static_cast<char*>(*k[f]) + size_t(kept_index(rc_, l)) * layer : *s[f];
  }
  return a;
}

template <class Ops>
GPT<Ops>::GPT(const GPTConfig& cfg, int B, int Tn, MemoryTracker& mem, size_t pad_multiple, bool full_params,
              bool full_grads, const Recompute& rc, int embedding_rows, int activation_slots)
    : cfg_(cfg), rc_(rc), layout_(cfg, pad_multiple, embedding_rows), B_(B), T_(Tn) {
  ZT_ASSERT(rc.every >= 1 && activation_slots >= 1);
  ZT_REQUIRE(cfg.L >= 1 || cfg.whole_L == 0, "model: a pipeline stage without blocks");
  cls_rows_ = int(classifier_rows_for(cfg, B, Tn, rc, sizeof(T), sizeof(S)));
  ZT_REQUIRE(cfg.C % cfg.NH == 0, "model: n_embd " << cfg.C << " is not divisible by n_head " << cfg.NH);
  ZT_REQUIRE(cfg.NH % cfg.tp == 0 && cfg.Vp % cfg.tp == 0 && cfg.tp_rank >= 0 && cfg.tp_rank < cfg.tp,
             "model: n_head " << cfg.NH << " is not divisible by mesh.tensor " << cfg.tp);
  ZT_REQUIRE(Tn <= cfg.maxT, "model: sequence length " << Tn << " exceeds the position table (" << cfg.maxT << ")");

  const size_t flat_bytes = checked_mul(layout_.total(), sizeof(T), "model: parameter bytes (parameter count x element size)");
  if (full_params) params_ = mem.alloc(flat_bytes, Ops::tier, Category::params, "parameters");
  if (full_grads) grads_ = mem.alloc(flat_bytes, Ops::tier, Category::grads, "gradients");
  for (const Unit& u : layout_.units()) {
    unit_param_.push_back(full_params ? params() + u.offset : nullptr);
    unit_grad_.push_back(full_grads ? grads() + u.offset : nullptr);
  }

  // Activations: one tracked block per struct, carved into its fields in declaration order
  // (field pointers stored as void** since the struct mixes int, T and S fields). A pipeline stage
  // keeps activation_slots copies of the activations (micro-batches in flight), one block.
  const std::vector<void**> act_fields = activation_fields();
  void** grad_fields[] = {(void**)&gs_.dresidual, (void**)&gs_.dC, (void**)&gs_.d4C,
                          (void**)&gs_.dqkv, (void**)&gs_.dchunk, (void**)&gs_.ln_grads};
  auto carve = [&](void** const* fields, const std::vector<FieldSize>& sizes, Allocation& block, const char* name,
                   size_t copies, std::vector<size_t>* offsets) {
    block = mem.alloc(checked_mul(total_bytes<T, S>(sizes), copies, kActivationSize), Ops::tier, Category::activations, name);
    size_t at = 0;
    for (size_t i = 0; i < sizes.size(); ++i) {
      *fields[i] = block.as<char>() + at;
      if (offsets) offsets->push_back(at);
      at += field_bytes<T, S>(sizes[i]);
    }
  };
  const auto act_sizes = activation_sizes<T, S>(cfg, B, Tn, rc);
  const auto grad_sizes = grad_scratch_sizes(cfg, B, Tn);
  ZT_ASSERT(act_sizes.size() == act_fields.size() && grad_sizes.size() == std::size(grad_fields));
  carve(act_fields.data(), act_sizes, act_mem_, "activations", size_t(activation_slots), &act_offsets_);
  carve(grad_fields, grad_sizes, grad_act_mem_, "activation gradients", 1, nullptr);
  act_slot_bytes_ = total_bytes<T, S>(act_sizes);
  slots_ = activation_slots;
  // Kernel working memory (deterministic reductions, attention backward): sized once, here.
  const size_t scratch = Ops::scratch_bytes(B, Tn, cfg.C, cfg.NH, cfg.Vp);
  if (scratch > 0) scratch_ = mem.alloc(scratch, Ops::tier, Category::activations, "kernel scratch");
}

template <class Ops>
std::vector<void**> GPT<Ops>::activation_fields() {
  std::vector<void**> f = {(void**)&acts_.inputs, (void**)&acts_.targets, (void**)&acts_.encoded};
  for (void** k : block_fields(acts_.kept)) f.push_back(k);
  for (void** k : block_fields(acts_.scratch)) f.push_back(k);
  f.insert(f.end(), {(void**)&acts_.residual3, (void**)&acts_.lnf, (void**)&acts_.lnf_mean, (void**)&acts_.lnf_rstd,
                     (void**)&acts_.logits, (void**)&acts_.losses, (void**)&acts_.lse, (void**)&acts_.lse_sum,
                     (void**)&acts_.gathered, (void**)&acts_.loss_stats, (void**)&acts_.vocab_row,
                     (void**)&acts_.dlnf});
  return f;
}

template <class Ops>
void GPT<Ops>::use_activation_slot(int k) {
  ZT_ASSERT(k >= 0 && k < slots_);
  const std::vector<void**> f = activation_fields();
  for (size_t i = 0; i < f.size(); ++i) *f[i] = act_mem_.as<char>() + size_t(k) * act_slot_bytes_ + act_offsets_[i];
}

// The members defined here, for the backends gpt.cpp instantiates the class with.
#define ZT_GPT_MEMORY_MEMBERS(O)                                                                                  \
  template GPT<O>::GPT(const GPTConfig&, int, int, MemoryTracker&, size_t, bool, bool, const Recompute&, int, int); \
  template size_t GPT<O>::activation_bytes(const GPTConfig&, int, int, const Recompute&, int);                    \
  template int GPT<O>::classifier_rows(const GPTConfig&, int, int, const Recompute&);                            \
  template GPT<O>::BlockActs GPT<O>::block_acts(int) const;                                                       \
  template std::vector<void**> GPT<O>::activation_fields();                                                       \
  template void GPT<O>::use_activation_slot(int);
ZT_GPT_MEMORY_MEMBERS(CpuOps<float>)
ZT_GPT_MEMORY_MEMBERS(CpuOps<double>)
#if ZT_HAVE_CUDA
ZT_GPT_MEMORY_MEMBERS(CudaOps<float>)
ZT_GPT_MEMORY_MEMBERS(CudaOps<bf16>)
#endif
#undef ZT_GPT_MEMORY_MEMBERS

}  // namespace zt
