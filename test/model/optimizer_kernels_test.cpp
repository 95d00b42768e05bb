// The optimizer's CPU kernels (src/kernels/adamw.cpp, global_norm.cpp): AdamW against a scalar
// transcription of torch.optim.AdamW, its bf16 and fp32 variants' rounding, the sum of squares.
#include "kernels_testing.h"

namespace {

using namespace kernels_test;

// ---------------------------------------------------------------------------------------------
// AdamW: compared with a plain scalar transcription of torch.optim.AdamW's formula.

struct ScalarAdamW {
  Vec p, m, v;
  void step(const Vec& grad, const AdamWArgs& a) {
    const double lr = a.lr, b1 = a.beta1, b2 = a.beta2, eps = a.eps, wd = a.weight_decay;
    for (size_t i = 0; i < p.size(); i++) {
      const double g = grad[i] * double(a.grad_scale);
      p[i] *= 1.0 - lr * wd;
      m[i] = b1 * m[i] + (1.0 - b1) * g;
      v[i] = b2 * v[i] + (1.0 - b2) * g * g;
      const double mhat = m[i] / (1.0 - std::pow(b1, a.step));
      const double vhat = v[i] / (1.0 - std::pow(b2, a.step));
      p[i] -= lr * mhat / (std::sqrt(vhat) + eps);
    }
  }
};

TEST(AdamW, MatchesScalarReferenceOverSeveralSteps) {
  std::mt19937_64 rng(12);
  const size_t n = 20011;  // above the parallel threshold, not a multiple of any vector width
  const Vec p0 = random_vec(n, rng);
  ScalarAdamW ref{p0, Vec(n, 0.0), Vec(n, 0.0)};
  Vec pd = p0, md(n, 0.0), vd(n, 0.0);
  VecF pf = to_float(p0), mf(n, 0.f), vf(n, 0.f);
  AdamWArgs a{1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.7f, 0};
  for (int step = 1; step <= 5; step++) {
    Vec g = random_vec(n, rng, -0.5, 0.5);
    VecF gf = to_float(g);
    a.step = step;
    ref.step(g, a);
    adamw_update(pd.data(), g.data(), md.data(), vd.data(), n, a);
    adamw_update(pf.data(), gf.data(), mf.data(), vf.data(), n, a);
    SCOPED_TRACE("step " + std::to_string(step));
    EXPECT_LT(rel_err(pd, ref.p), 1e-13);
    EXPECT_LT(rel_err(md, ref.m), 1e-13);
    EXPECT_LT(rel_err(vd, ref.v), 1e-13);
    EXPECT_LT(rel_err(pf, ref.p), 1e-6);
    EXPECT_LT(rel_err(mf, ref.m), 1e-6);
    EXPECT_LT(rel_err(vf, ref.v), 1e-6);
    // the parameters did move, by about lr per step
    EXPECT_GT(rel_err(pd, p0), 1e-4);
  }
}

TEST(AdamW, SmallBufferAndNoWeightDecay) {
  std::mt19937_64 rng(13);
  const size_t n = 5;
  const Vec p0 = random_vec(n, rng);
  Vec g = random_vec(n, rng);
  ScalarAdamW ref{p0, Vec(n, 0.1), Vec(n, 0.2)};
  Vec p = p0, m(n, 0.1), v(n, 0.2);
  const AdamWArgs a{6e-4f, 0.9f, 0.95f, 1e-8f, 0.0f, 1.0f, 3};
  ref.step(g, a);
  adamw_update(p.data(), g.data(), m.data(), v.data(), n, a);
  EXPECT_LT(rel_err(p, ref.p), 1e-14);
  EXPECT_LT(rel_err(m, ref.m), 1e-14);
  EXPECT_LT(rel_err(v, ref.v), 1e-14);
}

// clear_grad (the stage-0 step in memory): the same update bit for bit, and the gradient left zero,
// so that the next step accumulates from zero without a zeroing pass.
TEST(AdamW, ClearGradLeavesZeroAndTheSameUpdate) {
  std::mt19937_64 rng(14);
  const size_t n = 20011;  // above the parallel threshold: every thread's slice
  const VecF p0 = to_float(random_vec(n, rng)), g0 = to_float(random_vec(n, rng, -0.5, 0.5));
  VecF p_keep = p0, g_keep = g0, m_keep(n, 0.1f), v_keep(n, 0.2f);
  VecF p_clear = p0, g_clear = g0, m_clear(n, 0.1f), v_clear(n, 0.2f);
  AdamWArgs a{1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.7f, 2};
  adamw_update(p_keep.data(), g_keep.data(), m_keep.data(), v_keep.data(), n, a);
  a.clear_grad = true;
  adamw_update(p_clear.data(), g_clear.data(), m_clear.data(), v_clear.data(), n, a);
  EXPECT_EQ(0, std::memcmp(p_keep.data(), p_clear.data(), n * sizeof(float)));
  EXPECT_EQ(0, std::memcmp(m_keep.data(), m_clear.data(), n * sizeof(float)));
  EXPECT_EQ(0, std::memcmp(v_keep.data(), v_clear.data(), n * sizeof(float)));
  EXPECT_EQ(0, std::memcmp(g_keep.data(), g0.data(), n * sizeof(float)));  // without it: untouched
  EXPECT_EQ(VecF(n, 0.f), g_clear);
}

// The mixed-precision update the CUDA backend's CPU AdamW runs: its stochastic rounding draws by the
// element's global index (first + i), so a buffer updated in one call and the same buffer cut into
// slices (shards, offload sub-groups) end bit for bit alike; another `first` draws other bits.
TEST(AdamW, Bf16MasterRoundsByGlobalIndex) {
  std::mt19937_64 rng(15);
  const size_t n = 20011, cut1 = 777, cut2 = 13001;
  const uint64_t first = (uint64_t(1) << 32) + 12345;  // past 2^32: the high bits reach the draw too
  const VecF master0 = to_float(random_vec(n, rng)), grad = to_float(random_vec(n, rng, -0.5, 0.5));
  std::vector<uint16_t> g16(n);
  for (size_t i = 0; i < n; ++i) {
    uint32_t u;
    std::memcpy(&u, &grad[i], 4);
    g16[i] = uint16_t(u >> 16);
  }
  const AdamWArgs a{1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 1.0f, 1};
  auto update = [&](const std::vector<size_t>& cuts, uint64_t at) {
    VecF master = master0, m(n, 0.f), v(n, 0.f);
    std::vector<uint16_t> p(n, 0);
    for (size_t c = 0; c + 1 < cuts.size(); ++c) {
      const size_t lo = cuts[c], len = cuts[c + 1] - lo;
      adamw_update_bf16_master(p.data() + lo, master.data() + lo, g16.data() + lo, m.data() + lo, v.data() + lo, len,
                               a, 77u, at + lo);
    }
    return p;
  };
  const std::vector<uint16_t> whole = update({0, n}, first), sliced = update({0, cut1, cut2, n}, first);
  size_t differ = 0;
  for (size_t i = 0; i < n; ++i) differ += whole[i] != sliced[i];
  EXPECT_EQ(differ, 0u) << "the rounding depends on where the buffer is cut";
  const std::vector<uint16_t> shifted = update({0, n}, first + 1);
  differ = 0;
  for (size_t i = 0; i < n; ++i) differ += whole[i] != shifted[i];
  EXPECT_GT(differ, n / 20) << "the global index does not reach the draw";
}

// The fp32 AdamW, the offloaded optimizer of the CUDA backend, must update exactly as the device's
// kernel does (docs/offload.md: offload is bit for bit against no offload). Both are built without
// fused multiply-adds (CMakeLists.txt), so each equals the formula evaluated one rounded operation at
// a time, which `volatile` forces here whatever the compiler would contract. On an H100 the GPU and
// -march=native contracted different products and the offload runs drifted by an ulp a step.
TEST(AdamW, EveryOperationRoundedAlone) {
  std::mt19937_64 rng(16);
  const size_t n = 20011;
  const VecF p0 = to_float(random_vec(n, rng)), g = to_float(random_vec(n, rng, -0.5, 0.5)),
             m0 = to_float(random_vec(n, rng, -0.1, 0.1)), v0 = to_float(random_vec(n, rng, 0.0, 0.01));
  const AdamWArgs a{1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.7f, 3};
  // the per-call scalars as adamw_update computes them (double, rounded to float)
  const float step_size = float(double(a.lr) / (1.0 - std::pow(double(a.beta1), a.step)));
  const float bc2_sqrt = float(std::sqrt(1.0 - std::pow(double(a.beta2), a.step)));
  const float decay = float(1.0 - double(a.lr) * double(a.weight_decay));
  const float omb1 = 1.0f - a.beta1, omb2 = 1.0f - a.beta2;
  VecF ref_p(n), ref_m(n), ref_v(n);
  for (size_t i = 0; i < n; i++) {
    volatile float gs = g[i] * a.grad_scale, t = gs - m0[i], u = omb1 * t, mi = m0[i] + u;
    volatile float bv = a.beta2 * v0[i], og = omb2 * gs, ogg = og * gs, vi = bv + ogg;
    volatile float sq = std::sqrt(float(vi)), d = sq / bc2_sqrt, denom = d + a.eps, q = mi / denom;
    volatile float r = step_size * q, pd = p0[i] * decay, pn = pd - r;
    ref_p[i] = pn, ref_m[i] = mi, ref_v[i] = vi;
  }
  VecF p = p0, gg = g, m = m0, v = v0;
  adamw_update(p.data(), gg.data(), m.data(), v.data(), n, a);
  size_t differ = 0;
  for (size_t i = 0; i < n; i++) differ += p[i] != ref_p[i] || m[i] != ref_m[i] || v[i] != ref_v[i];
  EXPECT_EQ(differ, 0u) << "fp32 AdamW: elements not as the formula rounded op by op (FMA contraction?)";
  // bf16 parameters with an fp32 master: the master, m and v are the same formula
  std::vector<uint16_t> g16(n), p16(n, 0);
  VecF gb(n);
  for (size_t i = 0; i < n; ++i) {
    uint32_t bits;
    std::memcpy(&bits, &g[i], 4);
    g16[i] = uint16_t(bits >> 16);
    bits = uint32_t(g16[i]) << 16;
    std::memcpy(&gb[i], &bits, 4);
  }
  VecF master = p0, mb = m0, vb = v0, ref_master = p0, ref_mb = m0, ref_vb = v0, gb_copy = gb;
  adamw_update(ref_master.data(), gb_copy.data(), ref_mb.data(), ref_vb.data(), n, a);  // fp32, checked above
  adamw_update_bf16_master(p16.data(), master.data(), g16.data(), mb.data(), vb.data(), n, a, 5u, 0);
  differ = 0;
  for (size_t i = 0; i < n; i++) differ += master[i] != ref_master[i] || mb[i] != ref_mb[i] || vb[i] != ref_vb[i];
  EXPECT_EQ(differ, 0u) << "bf16 AdamW: master, m or v not as the fp32 formula";
}

// ---------------------------------------------------------------------------------------------
// sum of squares

TEST(SumSquares, MatchesNaive) {
  std::mt19937_64 rng(14);
  for (size_t n : {size_t(0), size_t(1), size_t(37), size_t(200003)}) {
    const Vec x = random_vec(n, rng);
    const VecF xf = to_float(x);
    double ref = 0, reff = 0;
    for (size_t i = 0; i < n; i++) ref += x[i] * x[i], reff += double(xf[i]) * double(xf[i]);
    EXPECT_NEAR(sum_squares(x.data(), n), ref, 1e-12 * std::max(ref, 1.0)) << n;
    EXPECT_NEAR(sum_squares(xf.data(), n), reff, 1e-12 * std::max(reff, 1.0)) << n;
  }
}

}  // namespace
