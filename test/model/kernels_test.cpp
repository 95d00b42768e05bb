// Unit tests for the CPU reference kernels (src/kernels/*.cpp).
//
//  * Gradients: every backward is checked in double precision against central finite differences
//    of a scalar objective L = sum(out * R) with random weights R (so dout = R), on small odd sizes.
//    Gradient buffers are pre-filled with random values: the check is on (after - before), which
//    also proves that backward accumulates (+=) instead of overwriting.
//  * Forwards are checked against naive double implementations written here.
//  * float vs double: the float instantiation (vectorised exp/tanh, float accumulators) must agree
//    with the double one to ~1e-5 relative on realistic sizes.
//  * Reproducibility: results do not depend on the number of OpenMP threads.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "kernels/adamw.h"
#include "kernels/attention.h"
#include "kernels/cpu_math.h"
#include "kernels/encoder.h"
#include "kernels/gelu.h"
#include "kernels/global_norm.h"
#include "kernels/layernorm.h"
#include "kernels/matmul.h"
#include "kernels/residual.h"
#include "kernels/softmax_xent.h"

namespace {

using namespace zt::cpu;
using Vec = std::vector<double>;
using VecF = std::vector<float>;

// ---------------------------------------------------------------------------------------------
// helpers

Vec random_vec(size_t n, std::mt19937_64& rng, double lo = -1.0, double hi = 1.0) {
  std::uniform_real_distribution<double> u(lo, hi);
  Vec v(n);
  for (double& x : v) x = u(rng);
  return v;
}

std::vector<int> random_ints(size_t n, int hi, std::mt19937_64& rng) {
  std::uniform_int_distribution<int> u(0, hi - 1);
  std::vector<int> v(n);
  for (int& x : v) x = u(rng);
  return v;
}

VecF to_float(const Vec& v) { return VecF(v.begin(), v.end()); }

double dot(const Vec& a, const Vec& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); i++) s += a[i] * b[i];
  return s;
}

double max_abs(const Vec& v) {
  double m = 0;
  for (double x : v) m = std::max(m, std::fabs(x));
  return m;
}

Vec minus(const Vec& a, const Vec& b) {
  Vec d(a.size());
  for (size_t i = 0; i < a.size(); i++) d[i] = a[i] - b[i];
  return d;
}

// max_i |a_i - b_i| / max_i |b_i|
template <class A>
double rel_err(const A& a, const Vec& b) {
  double num = 0;
  for (size_t i = 0; i < b.size(); i++) num = std::max(num, std::fabs(double(a[i]) - b[i]));
  return num / std::max(max_abs(b), 1e-300);
}

// Checks an analytic gradient of loss() with respect to x against central differences, element by
// element. Error measure: max_i |fd_i - analytic_i| / max_i |analytic_i|.
void expect_grad_fd(const std::string& what, Vec& x, const Vec& analytic, const std::function<double()>& loss,
                    double h = 1e-6, double rtol = 1e-6) {
  ASSERT_EQ(x.size(), analytic.size()) << what;
  const double gmax = max_abs(analytic);
  ASSERT_GT(gmax, 1e-6) << what << ": analytic gradient is (nearly) zero, the check would be vacuous";
  double worst = 0;
  size_t worst_i = 0;
  double worst_fd = 0;
  for (size_t i = 0; i < x.size(); i++) {
    const double xi = x[i];
    x[i] = xi + h;
    const double lp = loss();
    x[i] = xi - h;
    const double lm = loss();
    x[i] = xi;
    const double fd = (lp - lm) / (2 * h);
    const double err = std::fabs(fd - analytic[i]);
    if (err > worst) worst = err, worst_i = i, worst_fd = fd;
  }
  EXPECT_LE(worst / gmax, rtol) << what << ": worst element " << worst_i << " analytic " << analytic[worst_i]
                                << " finite-difference " << worst_fd << " (max |grad| " << gmax << ")";
}

// Runs f() with a given number of OpenMP threads, then restores the previous setting.
template <class F>
void with_threads(int n, F&& f) {
  const int before = omp_get_max_threads();
  omp_set_num_threads(n);
  f();
  omp_set_num_threads(before);
}

// ---------------------------------------------------------------------------------------------
// naive double references

void naive_attention(Vec& out, Vec& lse, const Vec& qkv, int B, int Tn, int C, int NH) {
  const int hs = C / NH;
  const double scale = 1.0 / std::sqrt(double(hs));
  out.assign((size_t)B * Tn * C, 0.0);
  lse.assign((size_t)B * NH * Tn, 0.0);
  for (int b = 0; b < B; b++)
    for (int h = 0; h < NH; h++)
      for (int t = 0; t < Tn; t++) {
        // full row of scores with the causal mask as -inf, then a textbook softmax
        std::vector<double> s(Tn);
        double m = -std::numeric_limits<double>::infinity();
        for (int j = 0; j < Tn; j++) {
          if (j > t) {
            s[j] = -std::numeric_limits<double>::infinity();
            continue;
          }
          double d = 0;
          for (int i = 0; i < hs; i++)
            d += qkv[((size_t)b * Tn + t) * 3 * C + h * hs + i] * qkv[((size_t)b * Tn + j) * 3 * C + C + h * hs + i];
          s[j] = d * scale;
          m = std::max(m, s[j]);
        }
        double sum = 0;
        for (int j = 0; j < Tn; j++) sum += std::exp(s[j] - m);
        lse[((size_t)b * NH + h) * Tn + t] = m + std::log(sum);
        for (int j = 0; j < Tn; j++) {
          const double p = std::exp(s[j] - m) / sum;
          for (int i = 0; i < hs; i++)
            out[((size_t)b * Tn + t) * C + h * hs + i] += p * qkv[((size_t)b * Tn + j) * 3 * C + 2 * C + h * hs + i];
        }
      }
}

double naive_gelu(double x) {
  return 0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
}

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

struct AttnShape {
  int B, Tn, C, NH;
};
void PrintTo(const AttnShape& s, std::ostream* os) {
  *os << "B=" << s.B << " T=" << s.Tn << " C=" << s.C << " NH=" << s.NH;
}

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

// ---------------------------------------------------------------------------------------------
// float agrees with double on realistic shapes (exercises the vector bodies and their tails)

constexpr double kFloatTol = 1e-5;

TEST(FloatVsDouble, Encoder) {
  std::mt19937_64 rng(20);
  const int B = 2, Tn = 33, C = 96, V = 50;
  const auto tokens = random_ints((size_t)B * Tn, V, rng);
  const Vec wte = random_vec((size_t)V * C, rng), wpe = random_vec((size_t)Tn * C, rng), dy = random_vec((size_t)B * Tn * C, rng);
  Vec out((size_t)B * Tn * C), dwte(wte.size()), dwpe(wpe.size());
  VecF outf(out.size()), dwtef(wte.size()), dwpef(wpe.size());
  encoder_forward(out.data(), tokens.data(), wte.data(), wpe.data(), B, Tn, C);
  encoder_forward(outf.data(), tokens.data(), to_float(wte).data(), to_float(wpe).data(), B, Tn, C);
  encoder_backward(dwte.data(), dwpe.data(), dy.data(), tokens.data(), B, Tn, C);
  encoder_backward(dwtef.data(), dwpef.data(), to_float(dy).data(), tokens.data(), B, Tn, C);
  EXPECT_LT(rel_err(outf, out), kFloatTol);
  EXPECT_LT(rel_err(dwtef, dwte), kFloatTol);
  EXPECT_LT(rel_err(dwpef, dwpe), kFloatTol);
}

TEST(FloatVsDouble, LayerNorm) {
  std::mt19937_64 rng(21);
  const int N = 50, C = 771;
  const Vec x = random_vec((size_t)N * C, rng, -2.0, 3.0), w = random_vec(C, rng), b = random_vec(C, rng),
            dy = random_vec((size_t)N * C, rng);
  Vec out(x.size()), mean(N), rstd(N), dx(x.size()), dw(C), db(C);
  VecF outf(x.size()), meanf(N), rstdf(N), dxf(x.size()), dwf(C), dbf(C);
  const VecF xf = to_float(x), wf = to_float(w), bf = to_float(b), dyf = to_float(dy);
  layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C);
  layernorm_forward(outf.data(), meanf.data(), rstdf.data(), xf.data(), wf.data(), bf.data(), N, C);
  layernorm_backward(dx.data(), dw.data(), db.data(), dy.data(), x.data(), w.data(), mean.data(), rstd.data(), N, C);
  layernorm_backward(dxf.data(), dwf.data(), dbf.data(), dyf.data(), xf.data(), wf.data(), meanf.data(), rstdf.data(), N, C);
  EXPECT_LT(rel_err(outf, out), kFloatTol);
  EXPECT_LT(rel_err(meanf, mean), kFloatTol);
  EXPECT_LT(rel_err(rstdf, rstd), kFloatTol);
  EXPECT_LT(rel_err(dxf, dx), kFloatTol);
  EXPECT_LT(rel_err(dwf, dw), kFloatTol);
  EXPECT_LT(rel_err(dbf, db), kFloatTol);
}

TEST(FloatVsDouble, Matmul) {
  std::mt19937_64 rng(22);
  const int N = 37, C = 65, OC = 130;
  const Vec x = random_vec((size_t)N * C, rng), w = random_vec((size_t)OC * C, rng), b = random_vec(OC, rng),
            dy = random_vec((size_t)N * OC, rng);
  Vec out((size_t)N * OC), dx(x.size()), dw(w.size()), db(OC);
  VecF outf(out.size()), dxf(x.size()), dwf(w.size()), dbf(OC);
  const VecF xf = to_float(x), wf = to_float(w), bf = to_float(b), dyf = to_float(dy);
  matmul_forward(out.data(), x.data(), w.data(), b.data(), N, C, OC);
  matmul_forward(outf.data(), xf.data(), wf.data(), bf.data(), N, C, OC);
  matmul_backward(dx.data(), dw.data(), db.data(), dy.data(), x.data(), w.data(), N, C, OC);
  matmul_backward(dxf.data(), dwf.data(), dbf.data(), dyf.data(), xf.data(), wf.data(), N, C, OC);
  EXPECT_LT(rel_err(outf, out), kFloatTol);
  EXPECT_LT(rel_err(dxf, dx), kFloatTol);
  EXPECT_LT(rel_err(dwf, dw), kFloatTol);
  EXPECT_LT(rel_err(dbf, db), kFloatTol);
}

class AttentionFloat : public ::testing::TestWithParam<AttnShape> {};

TEST_P(AttentionFloat, AgreesWithDouble) {
  const auto [B, Tn, C, NH] = GetParam();
  std::mt19937_64 rng(23);
  const Vec qkv = random_vec((size_t)B * Tn * 3 * C, rng, -2.0, 2.0), dy = random_vec((size_t)B * Tn * C, rng);
  Vec out((size_t)B * Tn * C), lse((size_t)B * NH * Tn), dqkv(qkv.size());
  VecF outf(out.size()), lsef(lse.size()), dqkvf(qkv.size());
  const VecF qkvf = to_float(qkv), dyf = to_float(dy);
  attention_forward(out.data(), lse.data(), qkv.data(), B, Tn, C, NH);
  attention_forward(outf.data(), lsef.data(), qkvf.data(), B, Tn, C, NH);
  attention_backward(dqkv.data(), dy.data(), qkv.data(), out.data(), lse.data(), B, Tn, C, NH);
  attention_backward(dqkvf.data(), dyf.data(), qkvf.data(), outf.data(), lsef.data(), B, Tn, C, NH);
  EXPECT_LT(rel_err(outf, out), kFloatTol);
  EXPECT_LT(rel_err(lsef, lse), kFloatTol);
  EXPECT_LT(rel_err(dqkvf, dqkv), kFloatTol);
}

// hs = 64 and hs = 32 and hs = 20; T not a multiple of the block or tile sizes
INSTANTIATE_TEST_SUITE_P(Shapes, AttentionFloat,
                         ::testing::Values(AttnShape{2, 67, 192, 3}, AttnShape{1, 130, 96, 3}, AttnShape{2, 200, 60, 3}));

TEST(FloatVsDouble, Gelu) {
  std::mt19937_64 rng(24);
  const size_t n = 10007;
  const Vec x = random_vec(n, rng, -6.0, 6.0), dy = random_vec(n, rng);
  Vec out(n), dx(n);
  VecF outf(n), dxf(n);
  gelu_forward(out.data(), x.data(), n);
  gelu_forward(outf.data(), to_float(x).data(), n);
  gelu_backward(dx.data(), x.data(), dy.data(), n);
  gelu_backward(dxf.data(), to_float(x).data(), to_float(dy).data(), n);
  EXPECT_LT(rel_err(outf, out), kFloatTol);
  EXPECT_LT(rel_err(dxf, dx), kFloatTol);
}

TEST(FloatVsDouble, Residual) {
  std::mt19937_64 rng(25);
  const size_t n = 40009;
  const Vec a = random_vec(n, rng), b = random_vec(n, rng);
  Vec out(n), da(n), db(n);
  VecF outf(n), daf(n), dbf(n);
  residual_forward(out.data(), a.data(), b.data(), n);
  residual_forward(outf.data(), to_float(a).data(), to_float(b).data(), n);
  residual_backward(da.data(), db.data(), a.data(), n);
  residual_backward(daf.data(), dbf.data(), to_float(a).data(), n);
  EXPECT_LT(rel_err(outf, out), kFloatTol);
  EXPECT_LT(rel_err(daf, da), kFloatTol);
  EXPECT_LT(rel_err(dbf, db), kFloatTol);
}

TEST(FloatVsDouble, SoftmaxXent) {
  std::mt19937_64 rng(26);
  const int N = 6, V = 5003, Vp = 5056;
  const Vec logits = random_vec((size_t)N * Vp, rng, -8.0, 8.0);
  const auto targets = random_ints(N, V, rng);
  Vec x = logits, losses(N);
  VecF xf = to_float(logits), lossesf(N);
  softmax_xent_forward_backward(x.data(), losses.data(), targets.data(), 1.0 / N, N, V, Vp, true);
  softmax_xent_forward_backward(xf.data(), lossesf.data(), targets.data(), 1.0f / N, N, V, Vp, true);
  EXPECT_LT(rel_err(lossesf, losses), kFloatTol);
  EXPECT_LT(rel_err(xf, x), kFloatTol);
}

TEST(FloatVsDouble, SumSquares) {
  std::mt19937_64 rng(27);
  const Vec x = random_vec(100003, rng);
  const double d = sum_squares(x.data(), x.size()), f = sum_squares(to_float(x).data(), x.size());
  EXPECT_NEAR(f, d, kFloatTol * d);
}

// ---------------------------------------------------------------------------------------------
// The same bits whatever the number of OpenMP threads (all reductions have a fixed order).

TEST(Determinism, ResultsDoNotDependOnThreadCount) {
  std::mt19937_64 rng(30);
  const int B = 2, Tn = 37, C = 96, NH = 3, V = 101, N = B * Tn, Vv = 1000, Vp = 1024;
  const VecF x = to_float(random_vec((size_t)N * C, rng)), dy = to_float(random_vec((size_t)N * C, rng));
  const VecF w = to_float(random_vec(C, rng)), b = to_float(random_vec(C, rng));
  const VecF qkv = to_float(random_vec((size_t)N * 3 * C, rng, -2, 2));
  const VecF logits = to_float(random_vec((size_t)N * Vp, rng, -5, 5));
  const auto tokens = random_ints(N, V, rng), targets = random_ints(N, Vv, rng);

  auto run = [&] {
    std::vector<VecF> r;
    VecF dwte((size_t)V * C), dwpe((size_t)Tn * C);
    encoder_backward(dwte.data(), dwpe.data(), dy.data(), tokens.data(), B, Tn, C);
    r.push_back(dwte);
    r.push_back(dwpe);
    VecF out(x.size()), mean(N), rstd(N), dx(x.size()), dw(C), db(C);
    layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C);
    layernorm_backward(dx.data(), dw.data(), db.data(), dy.data(), x.data(), w.data(), mean.data(), rstd.data(), N, C);
    r.insert(r.end(), {out, dx, dw, db});
    VecF aout(x.size()), lse((size_t)B * NH * Tn), dqkv(qkv.size());
    attention_forward(aout.data(), lse.data(), qkv.data(), B, Tn, C, NH);
    attention_backward(dqkv.data(), dy.data(), qkv.data(), aout.data(), lse.data(), B, Tn, C, NH);
    r.insert(r.end(), {aout, lse, dqkv});
    VecF dbias(C), dW((size_t)C * C);  // matmul: only the bias column sums are ours (gemm is OpenBLAS's)
    matmul_backward((float*)nullptr, dW.data(), dbias.data(), dy.data(), x.data(), x.data(), N, C, C);
    r.push_back(dbias);
    VecF lg = logits, losses(N);
    softmax_xent_forward_backward(lg.data(), losses.data(), targets.data(), 1.0f / N, N, Vv, Vp, true);
    r.insert(r.end(), {lg, losses});
    return r;
  };
  VecF big(300007);
  for (size_t i = 0; i < big.size(); i++) big[i] = float(i % 1013) * 1e-3f;
  std::vector<VecF> one, two, three;
  double ss1 = 0, ss2 = 0, ss3 = 0;
  with_threads(1, [&] { one = run(), ss1 = sum_squares(big.data(), big.size()); });
  with_threads(2, [&] { two = run(), ss2 = sum_squares(big.data(), big.size()); });
  with_threads(3, [&] { three = run(), ss3 = sum_squares(big.data(), big.size()); });
  EXPECT_EQ(ss1, ss2);
  EXPECT_EQ(ss1, ss3);
  ASSERT_EQ(one.size(), two.size());
  for (size_t i = 0; i < one.size(); i++) {
    EXPECT_EQ(0, std::memcmp(one[i].data(), two[i].data(), one[i].size() * sizeof(float))) << "result " << i;
    EXPECT_EQ(0, std::memcmp(one[i].data(), three[i].data(), one[i].size() * sizeof(float))) << "result " << i;
  }
}

}  // namespace
