// The whole model in double precision: backward against central finite differences, the layout's
// padding and offsets, GPT-2 initialisation statistics, and the llm.c weight format round trip.
#include <gtest/gtest.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstring>
#include <cstdio>
#include <filesystem>
#include <random>

#include "model/gpt.h"
#include "backend/ops_cpu.h"
#include "runtime/error.h"

namespace zt {
namespace {

TEST(Layout, UnitsArePaddedAndTensorsContiguous) {
  const GPTConfig cfg = GPTConfig::make(3, 3, 48, 24, 211);
  for (size_t pad : {size_t(128), size_t(384), size_t(7)}) {
    ParamLayout layout(cfg, pad);
    ASSERT_EQ(layout.num_units(), cfg.L + 2);
    size_t offset = 0, real = 0;
    for (const Unit& u : layout.units()) {
      EXPECT_EQ(u.offset, offset);
      EXPECT_EQ(u.padded % pad, 0u);
      EXPECT_GE(u.padded, u.numel);
      EXPECT_LT(u.padded - u.numel, pad);
      size_t t_off = u.offset;
      for (int ti : u.tensors) {
        EXPECT_EQ(layout.tensors()[size_t(ti)].offset, t_off);  // tensors packed in order
        t_off += layout.tensors()[size_t(ti)].numel;
      }
      EXPECT_EQ(t_off - u.offset, u.numel);
      offset += u.padded;
      real += u.numel;
    }
    EXPECT_EQ(layout.total(), offset);
    EXPECT_EQ(layout.num_params(), real);
  }
  // GPT-2 124M has 124,475,904 parameters with the vocabulary padded to 50304 (llm.c's count).
  ParamLayout gpt2(GPTConfig::make(12, 12, 768, 1024, 50257), 128);
  EXPECT_EQ(gpt2.num_params(), 124475904u);
  EXPECT_EQ(gpt2.slot(ParamId::wte).shape, (std::vector<int>{50304, 768}));
  EXPECT_TRUE(gpt2.slot(ParamId::qkvw, 3).decay);
  EXPECT_FALSE(gpt2.slot(ParamId::qkvb, 3).decay);
  EXPECT_FALSE(gpt2.slot(ParamId::lnfw).decay);
}

// Stage 3's layout (docs/design.md §3.9): the embedding in row chunks keeps every tensor at the
// flat offset it has in one unit; only the unit boundaries move.
TEST(Layout, EmbeddingChunksKeepTheFlatLayout) {
  const GPTConfig cfg = GPTConfig::make(2, 2, 24, 40, 3001);  // Vp 3072
  for (size_t pad : {size_t(128), size_t(384)}) {
    const ParamLayout one(cfg, pad);
    const ParamLayout split(cfg, pad, ParamLayout::block_sized_rows(cfg, pad));
    const int E = split.embedding_units();
    ASSERT_GT(E, 3);
    ASSERT_EQ(split.num_units(), E + cfg.L + 1);
    EXPECT_EQ(split.total(), one.total());
    EXPECT_EQ(split.num_params(), one.num_params());
    for (size_t k = 0; k < one.tensors().size(); ++k) EXPECT_EQ(split.tensors()[k].offset, one.tensors()[k].offset);
    EXPECT_EQ(split.block_unit(0), E);
    EXPECT_EQ(split.final_unit(), E + cfg.L);
    EXPECT_EQ(split.units()[0].name, "embedding.0");
    // Chunks are consecutive wte rows; the last also holds wpe. Each holds at most a padded
    // block's rows (12C^2 + 13C = 7224 elements, padded; 24 elements per row).
    const size_t block = split.units()[size_t(E)].padded;
    int next_row = 0;
    for (int e = 0; e < E; ++e) {
      const VocabRows r = split.vocab_rows(e);
      EXPECT_EQ(r.row0, next_row);
      next_row += r.rows;
      EXPECT_LE(size_t(r.rows) * 24, block);
      EXPECT_EQ(split.units()[size_t(e)].numel, size_t(r.rows) * 24 + (e == E - 1 ? size_t(40) * 24 : 0));
      if (e < E - 1) EXPECT_EQ(split.units()[size_t(e)].padded, split.units()[size_t(e)].numel);
    }
    EXPECT_EQ(next_row, 3072);
    EXPECT_EQ(split.slot(ParamId::wpe).unit, E - 1);
    // Every element of every tensor in exactly one unit's piece, at its flat place.
    for (size_t k = 0; k < split.tensors().size(); ++k) {
      const TensorSlot& s = split.tensors()[k];
      size_t covered = 0;
      for (int u = 0; u < split.num_units(); ++u) {
        const UnitPiece p = split.piece(u, int(k));
        if (p.count == 0) continue;
        EXPECT_TRUE(u >= s.unit && u <= s.last_unit) << s.name;
        EXPECT_EQ(split.units()[size_t(u)].offset + p.at, s.offset + p.begin) << s.name;
        covered += p.count;
      }
      EXPECT_EQ(covered, s.numel) << s.name;
    }
  }
  // A vocabulary no larger than a chunk stays one unit.
  EXPECT_EQ(ParamLayout::block_sized_rows(GPTConfig::make(2, 2, 24, 40, 200), 128), 0);
}

// The model with its embedding in chunks (lookup and LM head per chunk, the embedding's gradients
// last) computes what the one-unit model computes: the loss and every gradient, in double.
TEST(ModelChunks, SplitEmbeddingMatchesOneUnit) {
  using Model = GPT<CpuOps<double>>;
  const GPTConfig cfg = GPTConfig::make(2, 2, 16, 8, 2900);  // Vp 2944
  const int B = 2, Tn = 8, N = B * Tn;
  MemoryTracker mem;
  Model one(cfg, B, Tn, mem, 128), split(cfg, B, Tn, mem, 128, true, true, Recompute{}, ParamLayout::block_sized_rows(cfg, 128));
  const int E = split.layout().embedding_units();
  ASSERT_GT(E, 3);
  ASSERT_EQ(one.layout().total(), split.layout().total());
  one.init_gpt2(3);
  split.init_gpt2(3);
  one.zero_grad();
  split.zero_grad();
  ASSERT_EQ(0, std::memcmp(one.params(), split.params(), one.layout().total() * sizeof(double)));
  std::mt19937 rng(9);
  std::vector<int> in(N), tg(N);
  for (int i = 0; i < N; ++i) { in[size_t(i)] = int(rng() % cfg.V); tg[size_t(i)] = int(rng() % cfg.V); }
  in[0] = cfg.V - 1;  // a token in the last chunk, beside wpe
  for (int pass = 0; pass < 2; ++pass) {  // the second accumulates onto the first
    const double a = one.forward(in.data(), tg.data(), B, Tn, true, 1.0 / N);
    const double b = split.forward(in.data(), tg.data(), B, Tn, true, 1.0 / N);
    EXPECT_NEAR(a, b, 1e-13 * a);
    one.backward();
    split.backward();
  }
  double max_g = 0, max_d = 0;
  for (size_t i = 0; i < one.layout().total(); ++i) {
    max_g = std::max(max_g, std::fabs(one.grads()[i]));
    max_d = std::max(max_d, std::fabs(one.grads()[i] - split.grads()[i]));
  }
  EXPECT_GT(max_g, 0.0);
  EXPECT_LE(max_d, 1e-13 * max_g);
  // The embedding's gradient is not all zero in the chunks the tokens fall in.
  const double* dwte_last = split.wte_grad_rows(E - 1);
  const VocabRows last = split.layout().vocab_rows(E - 1);
  double s = 0;
  for (int c = 0; c < cfg.C; ++c) s += std::fabs(dwte_last[size_t(cfg.V - 1 - last.row0) * size_t(cfg.C) + size_t(c)]);
  EXPECT_GT(s, 0.0);
}

TEST(Init, Gpt2StatisticsAndDeterminism) {
  const GPTConfig cfg = GPTConfig::make(4, 4, 64, 32, 300);
  MemoryTracker mem;
  GPT<CpuOps<float>> a(cfg, 1, 8, mem), b(cfg, 1, 8, mem), c(cfg, 1, 8, mem);
  a.init_gpt2(7); b.init_gpt2(7); c.init_gpt2(8);
  const size_t n = a.layout().total();
  EXPECT_EQ(0, std::memcmp(a.params(), b.params(), n * sizeof(float)));
  EXPECT_NE(0, std::memcmp(a.params(), c.params(), n * sizeof(float)));
  auto stddev = [&](const float* p, size_t k) {
    double s = 0, ss = 0;
    for (size_t i = 0; i < k; ++i) { s += p[i]; ss += double(p[i]) * p[i]; }
    return std::sqrt(ss / double(k) - (s / double(k)) * (s / double(k)));
  };
  const size_t fc = a.layout().slot(ParamId::fcw, 1).numel;
  EXPECT_NEAR(stddev(a.param(ParamId::fcw, 1), fc), 0.02, 0.001);
  EXPECT_NEAR(stddev(a.param(ParamId::fcprojw, 1), fc), 0.02 / std::sqrt(2.0 * cfg.L), 0.0005);
  EXPECT_EQ(a.param(ParamId::ln2w, 2)[5], 1.0f);
  EXPECT_EQ(a.param(ParamId::qkvb, 0)[5], 0.0f);
  // padded vocabulary rows are zero
  const float* wte = a.param(ParamId::wte);
  for (size_t i = size_t(cfg.V) * cfg.C; i < size_t(cfg.Vp) * cfg.C; ++i) ASSERT_EQ(wte[i], 0.0f);
}

TEST(LlmcFormat, SaveLoadRoundTripAndErrors) {
  const GPTConfig cfg = GPTConfig::make(2, 2, 16, 8, 50);
  MemoryTracker mem;
  GPT<CpuOps<float>> a(cfg, 1, 8, mem), b(cfg, 1, 8, mem);
  a.init_gpt2(3);
  const std::string path = (std::filesystem::temp_directory_path() / "zt_roundtrip.bin").string();
  a.save_llmc(path);
  b.load_llmc(path);
  EXPECT_EQ(0, std::memcmp(a.params(), b.params(), a.layout().total() * sizeof(float)));
  EXPECT_EQ(std::filesystem::file_size(path), 256 * 4 + a.layout().num_params() * 4);
  GPT<CpuOps<float>> wrong(GPTConfig::make(2, 2, 32, 8, 50), 1, 8, mem);
  try {
    wrong.load_llmc(path);
    FAIL() << "dimension mismatch accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("n_embd 16"), std::string::npos) << e.what();
  }
  std::filesystem::resize_file(path, 256 * 4 + 100);
  EXPECT_THROW(b.load_llmc(path), Error);
  std::filesystem::remove(path);
}

// Finite differences on the whole model in double: loss(theta + h e_i) - loss(theta - h e_i).
TEST(ModelGradients, MatchFiniteDifferencesInDouble) {
  using Model = GPT<CpuOps<double>>;
  const GPTConfig cfg = GPTConfig::make(2, 3, 12, 7, 23);
  const int B = 2, Tn = 5, N = B * Tn;
  MemoryTracker mem;
  Model m(cfg, B, Tn, mem, 128);
  m.init_gpt2(11);
  std::mt19937 rng(5);
  std::normal_distribution<double> nd(0.0, 0.3);
  // Larger, non-trivial values everywhere (incl. biases and LN gains) so every gradient matters.
  for (const TensorSlot& s : m.layout().tensors()) {
    double* p = m.param(s.id, s.layer);
    const size_t n = s.id == ParamId::wte ? size_t(cfg.V) * cfg.C : s.numel;
    for (size_t i = 0; i < n; ++i) p[i] += nd(rng);
  }
  std::vector<int> in(N), tg(N);
  for (int i = 0; i < N; ++i) { in[size_t(i)] = int(rng() % cfg.V); tg[size_t(i)] = int(rng() % cfg.V); }

  m.zero_grad();
  m.forward(in.data(), tg.data(), B, Tn, true, 1.0 / N);
  m.backward();

  const double h = 1e-5;
  for (const TensorSlot& s : m.layout().tensors()) {
    double* p = m.param(s.id, s.layer);
    const double* g = m.grad(s.id, s.layer);
    const size_t n = s.id == ParamId::wte ? size_t(cfg.V) * cfg.C : s.numel;
    double max_g = 0;
    for (size_t i = 0; i < n; ++i) max_g = std::max(max_g, std::fabs(g[i]));
    ASSERT_GT(max_g, 0.0) << s.name;
    for (int k = 0; k < 6; ++k) {
      const size_t i = size_t(rng()) % n;
      const double keep = p[i];
      p[i] = keep + h;
      const double lp = m.forward(in.data(), tg.data(), B, Tn);
      p[i] = keep - h;
      const double lm = m.forward(in.data(), tg.data(), B, Tn);
      p[i] = keep;
      const double fd = (lp - lm) / (2 * h);
      EXPECT_NEAR(g[i], fd, 1e-7 * std::max(1.0, max_g)) << s.name << "[" << i << "]";
    }
  }
}

}  // namespace

// Recomputation changes where numbers are computed, not what (docs/design.md §3.11): every policy
// gives the loss, logits and every gradient of `none` bit for bit over two accumulated passes, a
// smaller batch in between (sampling reuses the buffers), and allocates exactly activation_bytes().
TEST(Recompute, EveryPolicyMatchesNoneBitForBitAndAllocatesWhatItSays) {
  using Model = GPT<CpuOps<float>>;
  const GPTConfig cfg = GPTConfig::make(5, 3, 24, 9, 61);
  const int B = 3, Tn = 9, N = B * Tn;
  std::mt19937 rng(3);
  std::vector<int> in(2 * N), tg(2 * N);
  for (int i = 0; i < 2 * N; ++i) { in[size_t(i)] = int(rng() % cfg.V); tg[size_t(i)] = int(rng() % cfg.V); }
  struct Out { std::vector<double> losses; std::vector<float> logits, grads; };
  auto run = [&](const Recompute& rc) {
    MemoryTracker mem;
    Model m(cfg, B, Tn, mem, 128, true, true, rc);
    EXPECT_EQ(mem.current(Tier::host, Category::activations), Model::activation_bytes(cfg, B, Tn, rc));
    m.init_gpt2(5);
    m.zero_grad();
    Out o;
    for (int pass = 0; pass < 2; ++pass) {
      o.losses.push_back(m.forward(in.data() + pass * N, tg.data() + pass * N, B, Tn, true, 1.0f / float(N)));
      m.backward();
      if (pass == 0) {  // a smaller forward between two training passes, as sampling does
        m.forward(in.data(), nullptr, 1, 4);
        const std::vector<float> row = m.logits_row(3);
        o.losses.insert(o.losses.end(), row.begin(), row.end());
      }
    }
    o.logits.assign(m.logits(), m.logits() + size_t(N) * size_t(cfg.Vp));
    o.grads.assign(m.grads(), m.grads() + m.layout().total());
    return o;
  };
  const Out ref = run(Recompute::from("none", 1));
  const size_t none_bytes = Model::activation_bytes(cfg, B, Tn, Recompute::from("none", 1));
  for (const auto& [name, every] : std::vector<std::pair<std::string, int>>{
           {"selective", 1}, {"block", 1}, {"block", 2}, {"block", 5}, {"block", 6}, {"block", INT_MAX}}) {
    SCOPED_TRACE(name + " every " + std::to_string(every));
    const Recompute rc = Recompute::from(name, every);
    const Out o = run(rc);
    EXPECT_EQ(o.losses, ref.losses);
    EXPECT_EQ(0, std::memcmp(o.logits.data(), ref.logits.data(), o.logits.size() * sizeof(float)));
    EXPECT_EQ(0, std::memcmp(o.grads.data(), ref.grads.data(), o.grads.size() * sizeof(float)));
    // Recomputing a single block saves nothing: its scratch is one layer's worth.
    if (name == "selective" || rc.blocks_recomputed_before(cfg.L) >= 2)
      EXPECT_LT(Model::activation_bytes(cfg, B, Tn, rc), none_bytes);
  }
}

// Classifier chunks (docs/design.md §3.11) against whole logits, on the CPU backend. Both run the
// same arithmetic but for the LM head's products: each row's logits (dot products of length C), its
// dlnf (length Vp) and wte's head gradient (a sum over the B*T positions, taken chunk by chunk). A
// BLAS kernel may order a row's products differently for a different number of rows in the call
// (OpenBLAS's Haswell and Zen kernels do: their micro-kernels differ by width, and the rows a call
// has decide which one a row gets), so the bound is rounding, not bits. Two orders of a length-n
// dot product differ by at most 2*gamma_n of the sum of its terms' magnitudes (gamma_n = n*u/(1-n*u),
// u = 2^-24), n = max(C, Vp, B*T) the longest reordered product; the rest of the step is the same
// arithmetic on inputs that close, and at this scale (three layers at initialisation, softmax
// gradients summing to zero) it does not amplify the difference. So every loss, sampled logit and
// gradient is held to 2*gamma_n of its tensor's largest magnitude: 256 u here, where the Haswell and
// Zen kernels give at most about 8 u and a wrong row, offset or stale buffer gives O(1). Every policy
// with chunks equals none with the same chunks bit for bit (the same calls, so no kernel can tell
// them apart), and the tracker holds activation_bytes exactly.
TEST(Recompute, ClassifierChunksMatchWholeLogits) {
  using Model = GPT<CpuOps<float>>;
  const GPTConfig cfg = GPTConfig::make(3, 3, 24, 9, 61);
  const int B = 3, Tn = 9, N = B * Tn;
  const double n = std::max({cfg.C, cfg.Vp, N}), u = 0x1p-24, tol = 2 * n * u / (1 - n * u);
  std::mt19937 rng(4);
  std::vector<int> in(2 * N), tg(2 * N);
  for (int i = 0; i < 2 * N; ++i) { in[size_t(i)] = int(rng() % cfg.V); tg[size_t(i)] = int(rng() % cfg.V); }
  struct Out { std::vector<double> losses; std::vector<std::vector<float>> logits; std::vector<float> grads; };
  auto run = [&](const Recompute& rc) {
    MemoryTracker mem;
    Model m(cfg, B, Tn, mem, 128, true, true, rc);
    EXPECT_EQ(mem.current(Tier::host, Category::activations), Model::activation_bytes(cfg, B, Tn, rc));
    m.init_gpt2(6);
    m.zero_grad();
    Out o;
    for (int pass = 0; pass < 2; ++pass) {
      o.losses.push_back(m.forward(in.data() + pass * N, tg.data() + pass * N, B, Tn, true, 1.0f / float(N)));
      m.backward();
      m.forward(in.data(), nullptr, 2, 7);  // sampling: the last row's logits
      o.logits.push_back(m.logits_row(13));
    }
    o.grads.assign(m.grads(), m.grads() + m.layout().total());
    return o;
  };
  // max |a - b| over a range against tol times the largest |b| in it.
  auto near = [&](const auto* a, const auto* b, size_t count, const std::string& what) {
    double scale = 0, diff = 0;
    for (size_t i = 0; i < count; ++i) {
      scale = std::max(scale, std::fabs(double(b[i])));
      diff = std::max(diff, std::fabs(double(a[i]) - double(b[i])));
    }
    EXPECT_LE(diff, tol * scale) << what << ": max |d| " << diff << " = " << diff / scale / u << " u of " << scale;
  };
  const Out whole = run(Recompute{});
  const ParamLayout layout(cfg, 128);
  for (int chunk : {1, 5, 7, 26, 27, 100, -1}) {
    SCOPED_TRACE("chunk " + std::to_string(chunk));
    const Recompute rc = Recompute::from("none", 1, chunk);
    const int rows = Model::classifier_rows(cfg, B, Tn, rc);
    EXPECT_EQ(rows, chunk > 0 ? std::min(chunk, N) : N);  // auto: at least 256 positions: whole
    if (rows < N) EXPECT_LT(Model::activation_bytes(cfg, B, Tn, rc), Model::activation_bytes(cfg, B, Tn, Recompute{}));
    const Out o = run(rc);
    for (size_t i = 0; i < o.losses.size(); ++i) {
      near(&o.losses[i], &whole.losses[i], 1, "loss " + std::to_string(i));
      near(o.logits[i].data(), whole.logits[i].data(), o.logits[i].size(), "sampled logits " + std::to_string(i));
    }
    for (const TensorSlot& t : layout.tensors())
      near(o.grads.data() + t.offset, whole.grads.data() + t.offset, t.numel, t.name + " gradient");
    for (const auto& [name, every] : std::vector<std::pair<std::string, int>>{{"selective", 1}, {"block", 1}, {"block", 2}}) {
      SCOPED_TRACE(name + " every " + std::to_string(every));
      const Out p = run(Recompute::from(name, every, chunk));
      EXPECT_EQ(p.losses, o.losses);
      EXPECT_EQ(p.logits, o.logits);
      EXPECT_EQ(0, std::memcmp(p.grads.data(), o.grads.data(), o.grads.size() * sizeof(float)));
    }
  }
}

// A chunked classifier over a split embedding (stage 3's layout, docs/design.md §3.11): vocabulary
// chunks outer with an online log-sum-exp, positions inner; backward forms dlogits from the kept
// log-sum-exp, takes dlnf at the start and each unit's weight gradient at the end, with the unit's
// parameters used once more (hooks recorded). In double against the one-unit whole-logits model;
// every policy with the same chunks equals none bit for bit.
TEST(ModelChunks, SplitEmbeddingChunkedClassifierMatchesOneUnit) {
  using Model = GPT<CpuOps<double>>;
  const GPTConfig cfg = GPTConfig::make(2, 2, 16, 8, 2900);  // Vp 2944
  const int B = 2, Tn = 8, N = B * Tn;
  const int rows = ParamLayout::block_sized_rows(cfg, 128);
  std::mt19937 rng(10);
  std::vector<int> in(2 * N), tg(2 * N);
  for (int i = 0; i < 2 * N; ++i) { in[size_t(i)] = int(rng() % cfg.V); tg[size_t(i)] = int(rng() % cfg.V); }
  tg[3] = cfg.V - 1;  // a target in the last chunk
  struct Record : UnitHooks {
    std::vector<int> bwd;  // units of before_backward, in order
    void before_backward(int u) override { bwd.push_back(u); }
  };
  auto run = [&](const Recompute& rc, int emb_rows, std::vector<double>& losses, Record* rec) {
    MemoryTracker mem;
    Model m(cfg, B, Tn, mem, 128, true, true, rc, emb_rows);
    EXPECT_EQ(mem.current(Tier::host, Category::activations), Model::activation_bytes(cfg, B, Tn, rc));
    if (rec) m.set_hooks(rec);
    m.init_gpt2(3);
    m.zero_grad();
    for (int pass = 0; pass < 2; ++pass) {
      losses.push_back(m.forward(in.data() + pass * N, tg.data() + pass * N, B, Tn, true, 1.0 / N));
      m.backward();
    }
    return std::vector<double>(m.grads(), m.grads() + m.layout().total());
  };
  std::vector<double> l_ref;
  const std::vector<double> g_ref = run(Recompute{}, 0, l_ref, nullptr);
  for (int chunk : {5, 16 - 1, 3}) {
    SCOPED_TRACE("chunk " + std::to_string(chunk));
    const Recompute rc = Recompute::from("none", 1, chunk);
    ASSERT_LT(Model::classifier_rows(cfg, B, Tn, rc), N);
    std::vector<double> l;
    Record rec;
    const std::vector<double> g = run(rc, rows, l, &rec);
    for (size_t i = 0; i < l.size(); ++i) EXPECT_NEAR(l[i], l_ref[i], 1e-12 * l_ref[i]);
    double max_g = 0, max_d = 0;
    for (size_t i = 0; i < g.size(); ++i) {
      max_g = std::max(max_g, std::fabs(g_ref[i]));
      max_d = std::max(max_d, std::fabs(g[i] - g_ref[i]));
    }
    EXPECT_LE(max_d, 1e-12 * max_g);
    // Backward per pass: E-1..0 (head), final norm, blocks, then E-1..0 again (their gradients).
    const int E = ParamLayout(cfg, 128, rows).embedding_units();
    ASSERT_GT(E, 3);
    std::vector<int> want;
    for (int u = E - 1; u >= 0; --u) want.push_back(u);
    for (int u = E + cfg.L; u >= E; --u) want.push_back(u);
    for (int u = E - 1; u >= 0; --u) want.push_back(u);
    want.insert(want.end(), want.begin(), want.end());
    EXPECT_EQ(rec.bwd, want);
    for (const auto& [name, every] : std::vector<std::pair<std::string, int>>{{"selective", 1}, {"block", 1}}) {
      SCOPED_TRACE(name);
      std::vector<double> lp;
      EXPECT_TRUE(run(Recompute::from(name, every, chunk), rows, lp, nullptr) == g);
      EXPECT_EQ(lp, l);
    }
  }
}

}  // namespace zt

