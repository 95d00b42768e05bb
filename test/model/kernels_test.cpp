// Unit tests for the CPU reference kernels (src/kernels/*.cpp), op by op (the optimizer's kernels:
// optimizer_kernels_test.cpp; float against double and thread counts: kernels_float_test.cpp).
//
//  * Gradients: every backward is checked in double precision against central finite differences
//    of a scalar objective L = sum(out * R) with random weights R (so dout = R), on small odd sizes.
//    Gradient buffers are pre-filled with random values: the check is on (after - before), which
//    also proves that backward accumulates (+=) instead of overwriting.
//  * Forwards are checked against naive double implementations (kernels_testing.h).
#include "kernels_testing.h"

namespace {

using namespace kernels_test;

// ---------------------------------------------------------------------------------------------
// fast exp / tanh used by the float kernels

TEST(CpuMath, ExpF32IsAccurate) {
  double worst = 0;
  for (int i = 0; i <= 2000000; i++) {
    const float x = -87.0f + 175.0f * float(i) / 2000000.0f;
    const double ref = std::exp(double(x));
    worst = std::max(worst, std::fabs(double(detail::exp_f32(x)) - ref) / ref);
  }
  EXPECT_LT(worst, 3e-7);  // ~2.5 ulp of float
  EXPECT_EQ(detail::exp_f32(0.0f), 1.0f);
  EXPECT_EQ(detail::exp_f32(-100.0f), 0.0f);
  EXPECT_EQ(detail::exp_f32(-std::numeric_limits<float>::infinity()), 0.0f);
  EXPECT_TRUE(std::isfinite(detail::exp_f32(1000.0f)));
  EXPECT_TRUE(std::isnan(detail::exp_f32(std::numeric_limits<float>::quiet_NaN())));
}

TEST(CpuMath, TanhF32IsAccurate) {
  double worst = 0;
  for (int i = 0; i <= 400000; i++) {
    const float x = -20.0f + 40.0f * float(i) / 400000.0f;
    worst = std::max(worst, std::fabs(double(detail::tanh_f32(x)) - std::tanh(double(x))));
  }
  EXPECT_LT(worst, 2.5e-7);
  EXPECT_EQ(detail::tanh_f32(100.0f), 1.0f);
  EXPECT_EQ(detail::tanh_f32(-100.0f), -1.0f);
}

// ---------------------------------------------------------------------------------------------
// encoder

TEST(Encoder, ForwardAndGradients) {
  std::mt19937_64 rng(1);
  const int B = 2, Tn = 5, C = 13, V = 7, maxT = 7;  // 10 positions over 7 tokens: repeats are certain
  const auto tokens = random_ints((size_t)B * Tn, V, rng);
  Vec wte = random_vec((size_t)V * C, rng), wpe = random_vec((size_t)maxT * C, rng);
  const Vec R = random_vec((size_t)B * Tn * C, rng);

  Vec out((size_t)B * Tn * C);
  encoder_forward(out.data(), tokens.data(), wte.data(), wpe.data(), B, Tn, C);
  for (int b = 0; b < B; b++)
    for (int t = 0; t < Tn; t++)
      for (int c = 0; c < C; c++)
        EXPECT_EQ(out[((size_t)b * Tn + t) * C + c], wte[(size_t)tokens[b * Tn + t] * C + c] + wpe[(size_t)t * C + c]);

  auto loss = [&] {
    Vec o((size_t)B * Tn * C);
    encoder_forward(o.data(), tokens.data(), wte.data(), wpe.data(), B, Tn, C);
    return dot(o, R);
  };
  const Vec dwte0 = random_vec(wte.size(), rng), dwpe0 = random_vec(wpe.size(), rng);
  Vec dwte = dwte0, dwpe = dwpe0;
  encoder_backward(dwte.data(), dwpe.data(), R.data(), tokens.data(), B, Tn, C);
  expect_grad_fd("encoder dwte", wte, minus(dwte, dwte0), loss);
  expect_grad_fd("encoder dwpe", wpe, minus(dwpe, dwpe0), loss);
}

// ---------------------------------------------------------------------------------------------
// layernorm

TEST(LayerNorm, ForwardMatchesNaive) {
  std::mt19937_64 rng(2);
  const int N = 10, C = 13;
  const Vec inp = random_vec((size_t)N * C, rng, -1.5, 2.5), w = random_vec(C, rng), bias = random_vec(C, rng);
  Vec out((size_t)N * C), mean(N), rstd(N);
  layernorm_forward(out.data(), mean.data(), rstd.data(), inp.data(), w.data(), bias.data(), N, C);
  for (int n = 0; n < N; n++) {
    double m = 0, v = 0;
    for (int c = 0; c < C; c++) m += inp[n * C + c];
    m /= C;
    for (int c = 0; c < C; c++) v += (inp[n * C + c] - m) * (inp[n * C + c] - m);
    v /= C;
    const double s = 1.0 / std::sqrt(v + 1e-5);
    EXPECT_NEAR(mean[n], m, 1e-14);
    EXPECT_NEAR(rstd[n], s, 1e-12 * s);
    for (int c = 0; c < C; c++) EXPECT_NEAR(out[n * C + c], (inp[n * C + c] - m) * s * w[c] + bias[c], 1e-13);
  }
}

TEST(LayerNorm, Gradients) {
  std::mt19937_64 rng(3);
  const int N = 10, C = 13;
  Vec inp = random_vec((size_t)N * C, rng, -1.5, 2.5), w = random_vec(C, rng), bias = random_vec(C, rng);
  const Vec R = random_vec((size_t)N * C, rng);
  auto loss = [&] {
    Vec o((size_t)N * C), m(N), s(N);
    layernorm_forward(o.data(), m.data(), s.data(), inp.data(), w.data(), bias.data(), N, C);
    return dot(o, R);
  };
  Vec out((size_t)N * C), mean(N), rstd(N);
  layernorm_forward(out.data(), mean.data(), rstd.data(), inp.data(), w.data(), bias.data(), N, C);
  const Vec dinp0 = random_vec(inp.size(), rng), dw0 = random_vec(C, rng), db0 = random_vec(C, rng);
  Vec dinp = dinp0, dw = dw0, db = db0;
  layernorm_backward(dinp.data(), dw.data(), db.data(), R.data(), inp.data(), w.data(), mean.data(), rstd.data(), N, C);
  expect_grad_fd("layernorm dinp", inp, minus(dinp, dinp0), loss);
  expect_grad_fd("layernorm dweight", w, minus(dw, dw0), loss);
  expect_grad_fd("layernorm dbias", bias, minus(db, db0), loss);
}

// ---------------------------------------------------------------------------------------------
// matmul

TEST(Matmul, ForwardMatchesNaive) {
  std::mt19937_64 rng(4);
  const int N = 10, C = 13, OC = 11;
  const Vec inp = random_vec((size_t)N * C, rng), w = random_vec((size_t)OC * C, rng), bias = random_vec(OC, rng);
  Vec out((size_t)N * OC), out_nb((size_t)N * OC, 7.0);  // garbage: forward must overwrite
  matmul_forward(out.data(), inp.data(), w.data(), bias.data(), N, C, OC);
  matmul_forward(out_nb.data(), inp.data(), w.data(), (const double*)nullptr, N, C, OC);
  for (int n = 0; n < N; n++)
    for (int o = 0; o < OC; o++) {
      double s = 0;
      for (int c = 0; c < C; c++) s += inp[n * C + c] * w[o * C + c];
      EXPECT_NEAR(out_nb[n * OC + o], s, 1e-13);
      EXPECT_NEAR(out[n * OC + o], s + bias[o], 1e-13);
    }
}

TEST(Matmul, Gradients) {
  std::mt19937_64 rng(5);
  const int N = 10, C = 13, OC = 11;
  Vec inp = random_vec((size_t)N * C, rng), w = random_vec((size_t)OC * C, rng), bias = random_vec(OC, rng);
  const Vec R = random_vec((size_t)N * OC, rng);
  auto loss = [&] {
    Vec o((size_t)N * OC);
    matmul_forward(o.data(), inp.data(), w.data(), bias.data(), N, C, OC);
    return dot(o, R);
  };
  const Vec dinp0 = random_vec(inp.size(), rng), dw0 = random_vec(w.size(), rng), db0 = random_vec(OC, rng);
  Vec dinp = dinp0, dw = dw0, db = db0;
  matmul_backward(dinp.data(), dw.data(), db.data(), R.data(), inp.data(), w.data(), N, C, OC);
  expect_grad_fd("matmul dinp", inp, minus(dinp, dinp0), loss);
  expect_grad_fd("matmul dweight", w, minus(dw, dw0), loss);
  expect_grad_fd("matmul dbias", bias, minus(db, db0), loss);

  // No bias, and dinp / dbias skipped: dweight must be unchanged by their absence.
  auto loss_nobias = [&] {
    Vec o((size_t)N * OC);
    matmul_forward(o.data(), inp.data(), w.data(), (const double*)nullptr, N, C, OC);
    return dot(o, R);
  };
  Vec dw2 = dw0;
  matmul_backward((double*)nullptr, dw2.data(), (double*)nullptr, R.data(), inp.data(), w.data(), N, C, OC);
  expect_grad_fd("matmul dweight (no bias)", w, minus(dw2, dw0), loss_nobias);
  Vec dinp3 = dinp0, dw3 = dw0;
  matmul_backward(dinp3.data(), dw3.data(), (double*)nullptr, R.data(), inp.data(), w.data(), N, C, OC);
  EXPECT_LT(rel_err(dinp3, dinp), 1e-14);
  EXPECT_LT(rel_err(dw3, dw), 1e-14);
  // Dinp::overwrite: dinp0 leaves no trace; dweight still accumulates.
  Vec dinp4 = dinp0, dw4 = dw0;
  matmul_backward(dinp4.data(), dw4.data(), (double*)nullptr, R.data(), inp.data(), w.data(), N, C, OC, -1,
                  zt::Dinp::overwrite);
  expect_grad_fd("matmul dinp (overwrite)", inp, dinp4, loss);
  EXPECT_LT(rel_err(dw4, dw), 1e-14);
}

// ---------------------------------------------------------------------------------------------
// attention


class Attention : public ::testing::TestWithParam<AttnShape> {};

TEST_P(Attention, ForwardMatchesNaive) {
  const auto [B, Tn, C, NH] = GetParam();
  std::mt19937_64 rng(6);
  const Vec qkv = random_vec((size_t)B * Tn * 3 * C, rng, -2.0, 2.0);
  Vec out((size_t)B * Tn * C), lse((size_t)B * NH * Tn), ref_out, ref_lse;
  attention_forward(out.data(), lse.data(), qkv.data(), B, Tn, C, NH);
  naive_attention(ref_out, ref_lse, qkv, B, Tn, C, NH);
  EXPECT_LT(rel_err(out, ref_out), 1e-13);
  EXPECT_LT(rel_err(lse, ref_lse), 1e-13);
}

TEST_P(Attention, Gradients) {
  const auto [B, Tn, C, NH] = GetParam();
  std::mt19937_64 rng(7);
  Vec qkv = random_vec((size_t)B * Tn * 3 * C, rng, -2.0, 2.0);
  const Vec R = random_vec((size_t)B * Tn * C, rng);
  auto loss = [&] {
    Vec o((size_t)B * Tn * C), l((size_t)B * NH * Tn);
    attention_forward(o.data(), l.data(), qkv.data(), B, Tn, C, NH);
    return dot(o, R);
  };
  Vec out((size_t)B * Tn * C), lse((size_t)B * NH * Tn);
  attention_forward(out.data(), lse.data(), qkv.data(), B, Tn, C, NH);
  const Vec dqkv0 = random_vec(qkv.size(), rng);
  Vec dqkv = dqkv0;
  attention_backward(dqkv.data(), R.data(), qkv.data(), out.data(), lse.data(), B, Tn, C, NH);
  expect_grad_fd("attention dqkv", qkv, dqkv, loss);  // overwritten: dqkv0 leaves no trace
}

// hs = 4 (the brief's shape), hs = 5 (odd), hs = 8, T = 1, and T = 70 with hs = 16: two query blocks,
// full register tiles as well as edge tiles.
INSTANTIATE_TEST_SUITE_P(Shapes, Attention,
                         ::testing::Values(AttnShape{2, 5, 12, 3}, AttnShape{1, 11, 15, 3}, AttnShape{2, 13, 16, 2},
                                           AttnShape{3, 1, 6, 2}, AttnShape{1, 70, 32, 2}));

// ---------------------------------------------------------------------------------------------
// gelu, residual

TEST(Gelu, ForwardAndGradient) {
  std::mt19937_64 rng(8);
  const size_t n = 37;
  Vec x = random_vec(n, rng, -4.0, 4.0);
  const Vec R = random_vec(n, rng);
  Vec out(n);
  gelu_forward(out.data(), x.data(), n);
  for (size_t i = 0; i < n; i++) EXPECT_NEAR(out[i], naive_gelu(x[i]), 1e-15);
  auto loss = [&] {
    Vec o(n);
    gelu_forward(o.data(), x.data(), n);
    return dot(o, R);
  };
  const Vec dx0 = random_vec(n, rng);
  Vec dx = dx0;
  gelu_backward(dx.data(), x.data(), R.data(), n);
  expect_grad_fd("gelu dinp", x, dx, loss);  // overwritten: dx0 leaves no trace
  Vec inplace = R;
  gelu_backward(inplace.data(), x.data(), inplace.data(), n);
  EXPECT_EQ(inplace, dx);
}

TEST(Residual, ForwardAndGradients) {
  std::mt19937_64 rng(9);
  const size_t n = 37;
  Vec a = random_vec(n, rng), b = random_vec(n, rng);
  const Vec R = random_vec(n, rng);
  Vec out(n);
  residual_forward(out.data(), a.data(), b.data(), n);
  for (size_t i = 0; i < n; i++) EXPECT_EQ(out[i], a[i] + b[i]);
  auto loss = [&] {
    Vec o(n);
    residual_forward(o.data(), a.data(), b.data(), n);
    return dot(o, R);
  };
  const Vec da0 = random_vec(n, rng), db0 = random_vec(n, rng);
  Vec da = da0, db = db0;
  residual_backward(da.data(), db.data(), R.data(), n);
  expect_grad_fd("residual da", a, minus(da, da0), loss);
  expect_grad_fd("residual db", b, minus(db, db0), loss);
}

// ---------------------------------------------------------------------------------------------
// softmax + cross-entropy

TEST(SoftmaxXent, LossesMatchNaiveAndForwardOnlyLeavesLogits) {
  std::mt19937_64 rng(10);
  const int N = 10, V = 37, Vp = 40;
  const Vec logits = random_vec((size_t)N * Vp, rng, -3.0, 3.0);
  const auto targets = random_ints(N, V, rng);
  Vec x = logits, losses(N);
  softmax_xent_forward_backward(x.data(), losses.data(), targets.data(), 1.0, N, V, Vp, false);
  EXPECT_EQ(x, logits);
  for (int n = 0; n < N; n++) {
    double sum = 0;  // padding columns [V, Vp) must not enter the softmax
    for (int j = 0; j < V; j++) sum += std::exp(logits[(size_t)n * Vp + j]);
    EXPECT_NEAR(losses[n], std::log(sum) - logits[(size_t)n * Vp + targets[n]], 1e-13);
  }
}

TEST(SoftmaxXent, GradientAndPadding) {
  std::mt19937_64 rng(11);
  const int N = 10, V = 37, Vp = 40;
  const double dloss = 0.37;
  Vec logits = random_vec((size_t)N * Vp, rng, -3.0, 3.0);
  for (int n = 0; n < N; n++)
    for (int j = V; j < Vp; j++) logits[(size_t)n * Vp + j] = 123.0;  // garbage in the padding
  const auto targets = random_ints(N, V, rng);
  auto loss = [&] {
    Vec x = logits, l(N);
    softmax_xent_forward_backward(x.data(), l.data(), targets.data(), dloss, N, V, Vp, false);
    double s = 0;
    for (double v : l) s += dloss * v;
    return s;
  };
  Vec grad = logits, losses(N), losses_fwd(N);
  softmax_xent_forward_backward(grad.data(), losses.data(), targets.data(), dloss, N, V, Vp, true);
  {
    Vec x = logits;
    softmax_xent_forward_backward(x.data(), losses_fwd.data(), targets.data(), dloss, N, V, Vp, false);
  }
  EXPECT_EQ(losses, losses_fwd);  // same losses with and without the gradient
  for (int n = 0; n < N; n++)
    for (int j = V; j < Vp; j++) EXPECT_EQ(grad[(size_t)n * Vp + j], 0.0) << "padding column " << j;
  expect_grad_fd("softmax_xent dlogits", logits, grad, loss);
}

TEST(SoftmaxXent, ExtremeLogitsStayFinite) {
  const int V = 5, Vp = 8;
  VecF xf = {1000.f, -1000.f, 0.f, 999.f, 3.f, 0.f, 0.f, 0.f};
  Vec xd(xf.begin(), xf.end());
  const int target = 1;
  float lf;
  double ld;
  softmax_xent_forward_backward(xf.data(), &lf, &target, 1.0f, 1, V, Vp, true);
  softmax_xent_forward_backward(xd.data(), &ld, &target, 1.0, 1, V, Vp, true);
  const double ref = 1000.0 + std::log1p(std::exp(-1.0)) + 1000.0;
  EXPECT_NEAR(ld, ref, 1e-12);
  EXPECT_NEAR(lf, ref, 1e-4);
  for (int j = 0; j < Vp; j++) {
    EXPECT_TRUE(std::isfinite(xf[j]));
    EXPECT_NEAR(xf[j], xd[j], 1e-6);
  }
  EXPECT_NEAR(xd[1], -1.0, 1e-15);  // target probability 0
}


// ---------------------------------------------------------------------------------------------
// The parameter gradients accumulate: two calls on a zeroed buffer give twice one call. The input
// gradients of a block's ops (attention, GELU, a matmul's dinp with zt::Dinp::overwrite) are written over
// their buffer instead: what it held must not matter (the next test).

TEST(Backward, AccumulatesTwiceIsDouble) {
  std::mt19937_64 rng(15);
  const int B = 2, Tn = 5, C = 12, NH = 3, V = 7, N = B * Tn, OC = 11;
  auto twice = [](const std::string& what, const std::function<void(Vec&)>& backward, size_t n) {
    Vec once(n, 0.0), two(n, 0.0);
    backward(once);
    backward(two);
    backward(two);
    Vec doubled(n);
    for (size_t i = 0; i < n; i++) doubled[i] = 2 * once[i];
    EXPECT_GT(max_abs(once), 0.0) << what;
    EXPECT_LT(rel_err(two, doubled), 1e-14) << what;
  };
  const Vec x = random_vec((size_t)N * C, rng), y = random_vec((size_t)N * C, rng);
  const Vec w = random_vec(C, rng), bvec = random_vec(C, rng);
  const auto tokens = random_ints(N, V, rng);
  twice("encoder dwte", [&](Vec& g) { Vec dwpe((size_t)Tn * C); encoder_backward(g.data(), dwpe.data(), y.data(), tokens.data(), B, Tn, C); },
        (size_t)V * C);
  twice("encoder dwpe", [&](Vec& g) { Vec dwte((size_t)V * C); encoder_backward(dwte.data(), g.data(), y.data(), tokens.data(), B, Tn, C); },
        (size_t)Tn * C);

  Vec out((size_t)N * C), mean(N), rstd(N);
  layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), bvec.data(), N, C);
  // all three layernorm outputs live in one buffer: [dinp | dweight | dbias]
  twice("layernorm", [&](Vec& g) {
    layernorm_backward(g.data(), g.data() + N * C, g.data() + N * C + C, y.data(), x.data(), w.data(), mean.data(), rstd.data(), N, C);
  }, (size_t)N * C + 2 * C);

  const Vec wm = random_vec((size_t)OC * C, rng), dy = random_vec((size_t)N * OC, rng);
  twice("matmul", [&](Vec& g) {
    matmul_backward(g.data(), g.data() + N * C, g.data() + N * C + OC * C, dy.data(), x.data(), wm.data(), N, C, OC);
  }, (size_t)N * C + (size_t)OC * C + OC);

  const Vec qkv = random_vec((size_t)N * 3 * C, rng);
  Vec aout((size_t)N * C), lse((size_t)B * NH * Tn);
  attention_forward(aout.data(), lse.data(), qkv.data(), B, Tn, C, NH);
  twice("residual", [&](Vec& g) { residual_backward(g.data(), g.data() + x.size(), y.data(), x.size()); }, 2 * x.size());
}

TEST(Backward, InputGradientsOverwriteWhatTheBufferHeld) {
  std::mt19937_64 rng(16);
  const int B = 2, Tn = 5, C = 12, NH = 3, N = B * Tn, OC = 11;
  auto overwrites = [&](const std::string& what, const std::function<void(Vec&)>& backward, size_t n) {
    Vec from_zero(n, 0.0), from_noise = random_vec(n, rng);
    backward(from_zero);
    backward(from_noise);
    EXPECT_GT(max_abs(from_zero), 0.0) << what;
    EXPECT_EQ(from_noise, from_zero) << what;
  };
  const Vec x = random_vec((size_t)N * C, rng), y = random_vec((size_t)N * C, rng);
  const Vec wm = random_vec((size_t)OC * C, rng), dy = random_vec((size_t)N * OC, rng);
  overwrites("matmul dinp", [&](Vec& g) {
    matmul_backward(g.data(), (double*)nullptr, (double*)nullptr, dy.data(), x.data(), wm.data(), N, C, OC, -1,
                    zt::Dinp::overwrite);
  }, (size_t)N * C);
  const Vec qkv = random_vec((size_t)N * 3 * C, rng);
  Vec aout((size_t)N * C), lse((size_t)B * NH * Tn);
  attention_forward(aout.data(), lse.data(), qkv.data(), B, Tn, C, NH);
  overwrites("attention", [&](Vec& g) { attention_backward(g.data(), y.data(), qkv.data(), aout.data(), lse.data(), B, Tn, C, NH); },
             qkv.size());
  overwrites("gelu", [&](Vec& g) { gelu_backward(g.data(), x.data(), y.data(), x.size()); }, x.size());
}

}  // namespace
