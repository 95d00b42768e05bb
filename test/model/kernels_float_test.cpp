// The CPU kernels' float instantiation and their reproducibility (src/kernels/*.cpp):
//  * float vs double: the float instantiation (vectorised exp/tanh, float accumulators) must agree
//    with the double one to ~1e-5 relative on realistic sizes.
//  * Reproducibility: results do not depend on the number of OpenMP threads.
#include "kernels_testing.h"

namespace {

using namespace kernels_test;

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

// The two register tiles (attention.h: the AVX2 one and the AVX-512 one, whichever is the default
// here) give the same bits: each output sums its terms in the same order. Both against double too.
TEST_P(AttentionFloat, TilesAgreeBitForBit) {
  const auto [B, Tn, C, NH] = GetParam();
  std::mt19937_64 rng(29);
  const Vec qkv = random_vec((size_t)B * Tn * 3 * C, rng, -2.0, 2.0), dy = random_vec((size_t)B * Tn * C, rng);
  Vec out((size_t)B * Tn * C), lse((size_t)B * NH * Tn), dqkv(qkv.size());
  attention_forward(out.data(), lse.data(), qkv.data(), B, Tn, C, NH);
  attention_backward(dqkv.data(), dy.data(), qkv.data(), out.data(), lse.data(), B, Tn, C, NH);
  const VecF qkvf = to_float(qkv), dyf = to_float(dy);
  struct Result { VecF out, lse, dqkv; };
  auto run = [&](AttentionTile tile) {
    Result r{VecF(out.size()), VecF(lse.size()), VecF(qkv.size())};
    attention_forward(r.out.data(), r.lse.data(), qkvf.data(), B, Tn, C, NH, tile);
    attention_backward(r.dqkv.data(), dyf.data(), qkvf.data(), r.out.data(), r.lse.data(), B, Tn, C, NH, tile);
    EXPECT_LT(rel_err(r.out, out), kFloatTol);
    EXPECT_LT(rel_err(r.dqkv, dqkv), kFloatTol);
    return r;
  };
  const Result narrow = run(AttentionTile::avx2_6x16), wide = run(AttentionTile::avx512_8x32);
  EXPECT_EQ(narrow.out, wide.out);
  EXPECT_EQ(narrow.lse, wide.lse);
  EXPECT_EQ(narrow.dqkv, wide.dqkv);
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
