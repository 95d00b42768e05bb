// The GPU ops against the CPU ops in double (ops_testing.h): encoder, layernorm (and its fused
// residual form), GELU, residual, the fused classifier.
#include "ops_testing.h"
#include "kernels/encoder.h"
#include "kernels/gelu.h"
#include "kernels/layernorm.h"
#include "kernels/residual.h"
#include "kernels/softmax_xent.h"

namespace {

using namespace gpu_ops_test;
TYPED_TEST_SUITE(GpuOps, OpTypes, TypeNames);

// =====================================================================================================
// encoder

template <class T> void check_encoder(int B, int Tn, int C, int V, bool one_token, uint32_t seed) {
  SCOPED_TRACE(tag<T>("encoder") + " " + shape_str({{"B", B}, {"T", Tn}, {"C", C}, {"V", V}, {"one_token", one_token}}));
  GpuContext& g = gpu();
  const int N = B * Tn, maxT = Tn + 3;  // rows of wpe beyond T must stay untouched
  std::vector<int> tokens = one_token ? std::vector<int>(N, V - 1) : random_ints(N, V, seed);
  if (!one_token) tokens[0] = V - 1, tokens[N - 1] = 0;  // both ends of the vocabulary
  const VecF wte = rand_t<T>(size_t(V) * C, seed + 1), wpe = rand_t<T>(size_t(maxT) * C, seed + 2);
  DeviceBuffer<int> d_tok(N);
  d_tok.upload_raw(tokens);
  Guarded<T> d_wte(wte), d_wpe(wpe), d_out(size_t(N) * C);

  // forward (overwrite)
  d_out.poison();
  zt::cuda::encoder_forward<T>(d_out.p(), d_tok.get(), d_wte.p(), d_wpe.p(), B, Tn, C, g.stream);
  g.sync();
  Vec ref(size_t(N) * C);
  zt::cpu::encoder_forward<double>(ref.data(), tokens.data(), to_double(wte).data(), to_double(wpe).data(), B, Tn, C);
  expect_close("encoder_forward.out", d_out.download(), ref, tol_for<T>(ref));
  d_out.expect_guards("encoder_forward.out");

  // backward (accumulate into dwte, dwpe; deterministic)
  const VecF dout = rand_t<T>(size_t(N) * C, seed + 3);
  const VecF dwte0 = rand_t<T>(size_t(V) * C, seed + 4), dwpe0 = rand_t<T>(size_t(maxT) * C, seed + 5);
  Guarded<T> d_dout(dout), d_dwte(dwte0), d_dwpe(dwpe0);
  auto scratch = make_scratch(zt::cuda::encoder_backward_scratch_bytes(B, Tn));
  zt::cuda::encoder_backward<T>(d_dwte.p(), d_dwpe.p(), d_dout.p(), d_tok.get(), B, Tn, C, scratch.get(), g.stream);
  g.sync();
  Vec rdwte = to_double(dwte0), rdwpe = to_double(dwpe0);
  zt::cpu::encoder_backward<double>(rdwte.data(), rdwpe.data(), to_double(dout).data(), tokens.data(), B, Tn, C);
  const auto dwte1 = d_dwte.download_raw(), dwpe1 = d_dwpe.download_raw();
  expect_close("encoder_backward.dwte", d_dwte.download(), rdwte, tol_acc<T>(rdwte, dwte0));
  expect_close("encoder_backward.dwpe", d_dwpe.download(), rdwpe, tol_acc<T>(rdwpe, dwpe0));
  d_dwte.expect_guards("encoder_backward.dwte");
  d_dwpe.expect_guards("encoder_backward.dwpe");

  d_dwte.upload(dwte0);
  d_dwpe.upload(dwpe0);
  poison(scratch);
  zt::cuda::encoder_backward<T>(d_dwte.p(), d_dwpe.p(), d_dout.p(), d_tok.get(), B, Tn, C, scratch.get(), g.stream);
  g.sync();
  expect_bitwise_equal("encoder_backward.dwte (rerun)", dwte1, d_dwte.download_raw());
  expect_bitwise_equal("encoder_backward.dwpe (rerun)", dwpe1, d_dwpe.download_raw());
}

TYPED_TEST(GpuOps, Encoder) {
  ZT_REQUIRE_GPU();
  using T = TypeParam;
  check_encoder<T>(1, 1, 64, 7, false, 100);
  check_encoder<T>(2, 13, 64, 5, false, 110);       // every token repeated ~5 times
  check_encoder<T>(3, 257, 128, 50, true, 120);     // one token everywhere: 771 rows into one
  check_encoder<T>(4, 64, 128, 97, false, 130);
  check_encoder<T>(4, 257, 768, 1000, false, 140);  // GPT-2 width
}

// =====================================================================================================
// layernorm

// Rows with their own mean in [-1, 1] and standard deviation in [0.5, 2], as a residual stream has.
template <class T> VecF layernorm_input(int N, int C, uint32_t seed) {
  const VecF mu = random_uniform(N, seed, -1.0f, 1.0f), sd = random_uniform(N, seed + 1, 0.5f, 2.0f);
  VecF x = random_normal(size_t(N) * C, seed + 2);
  for (int i = 0; i < N; i++)
    for (int j = 0; j < C; j++) x[size_t(i) * C + j] = mu[i] + sd[i] * x[size_t(i) * C + j];
  make_representable<T>(x);
  return x;
}

template <class T> void check_layernorm(int N, int C, uint32_t seed) {
  SCOPED_TRACE(tag<T>("layernorm") + " " + shape_str({{"N", N}, {"C", C}}));
  GpuContext& g = gpu();
  const size_t NC = size_t(N) * C;
  const VecF inp = layernorm_input<T>(N, C, seed);
  const VecF w = rand_t<T>(C, seed + 10, 0.5f, 1.5f), b = rand_t<T>(C, seed + 11, -0.5f, 0.5f);
  Guarded<T> d_inp(inp), d_w(w), d_b(b), d_out(NC);
  Guarded<float> d_mean(N), d_rstd(N);

  // forward
  d_out.poison(), d_mean.poison(), d_rstd.poison();
  zt::cuda::layernorm_forward<T>(d_out.p(), d_mean.p(), d_rstd.p(), d_inp.p(), d_w.p(), d_b.p(), N, C, g.stream);
  g.sync();
  Vec rout(NC), rmean(N), rrstd(N);
  zt::cpu::layernorm_forward<double>(rout.data(), rmean.data(), rrstd.data(), to_double(inp).data(), to_double(w).data(),
                                     to_double(b).data(), N, C);
  expect_close("layernorm_forward.out", d_out.download(), rout, tol_for<T>(rout));
  // Statistics are fp32 from inputs exact in T: fp32 accuracy whatever T is.
  // The mean's rounding error scales with the inputs, not with the (possibly near-zero) mean.
  expect_close("layernorm_forward.mean", d_mean.download(), rmean, tol_scale(kTolStat, rms(inp)));
  expect_close("layernorm_forward.rstd", d_rstd.download(), rrstd, tol_rms(kTolStat, rrstd));
  d_out.expect_guards("layernorm_forward.out");
  d_mean.expect_guards("layernorm_forward.mean");
  d_rstd.expect_guards("layernorm_forward.rstd");

  // backward: the GPU gets the reference statistics rounded to fp32, and the CPU the same values.
  const VecF mean_f = to_float(rmean), rstd_f = to_float(rrstd);
  const VecF dout = rand_t<T>(NC, seed + 20);
  const VecF dinp0 = rand_t<T>(NC, seed + 21), dw0 = rand_t<T>(C, seed + 22), db0 = rand_t<T>(C, seed + 23);
  Guarded<T> d_dout(dout), d_dinp(dinp0), d_dw(dw0), d_db(db0);
  Guarded<float> d_m(mean_f), d_r(rstd_f);
  auto scratch = make_scratch(zt::cuda::layernorm_backward_scratch_bytes(N, C));
  auto run = [&] {
    zt::cuda::layernorm_backward<T>(d_dinp.p(), d_dw.p(), d_db.p(), d_dout.p(), d_inp.p(), d_w.p(), d_m.p(), d_r.p(), N,
                                    C, scratch.get(), g.stream);
    g.sync();
  };
  run();
  Vec rdinp = to_double(dinp0), rdw = to_double(dw0), rdb = to_double(db0);
  zt::cpu::layernorm_backward<double>(rdinp.data(), rdw.data(), rdb.data(), to_double(dout).data(), to_double(inp).data(),
                                      to_double(w).data(), to_double(mean_f).data(), to_double(rstd_f).data(), N, C);
  expect_close("layernorm_backward.dinp", d_dinp.download(), rdinp, tol_acc<T>(rdinp, dinp0));
  expect_close("layernorm_backward.dweight", d_dw.download(), rdw, tol_acc<T>(rdw, dw0));
  expect_close("layernorm_backward.dbias", d_db.download(), rdb, tol_acc<T>(rdb, db0));
  d_dinp.expect_guards("layernorm_backward.dinp");
  d_dw.expect_guards("layernorm_backward.dweight");
  d_db.expect_guards("layernorm_backward.dbias");

  const auto dinp1 = d_dinp.download_raw(), dw1 = d_dw.download_raw(), db1 = d_db.download_raw();
  d_dinp.upload(dinp0), d_dw.upload(dw0), d_db.upload(db0);
  poison(scratch);
  run();
  expect_bitwise_equal("layernorm_backward.dinp (rerun)", dinp1, d_dinp.download_raw());
  expect_bitwise_equal("layernorm_backward.dweight (rerun)", dw1, d_dw.download_raw());
  expect_bitwise_equal("layernorm_backward.dbias (rerun)", db1, d_db.download_raw());
}

TYPED_TEST(GpuOps, Layernorm) {
  ZT_REQUIRE_GPU();
  using T = TypeParam;
  check_layernorm<T>(1, 64, 200);
  check_layernorm<T>(26, 64, 210);
  check_layernorm<T>(26, 200, 220);  // C not a power of two, not a multiple of 32 * 8
  check_layernorm<T>(2 * 257, 128, 230);
  check_layernorm<T>(4 * 257, 768, 240);
}

// residual + layernorm, fused; the CPU equivalent is residual_forward then layernorm_forward.
template <class T> void check_residual_layernorm(int N, int C, uint32_t seed) {
  SCOPED_TRACE(tag<T>("residual_layernorm") + " " + shape_str({{"N", N}, {"C", C}}));
  GpuContext& g = gpu();
  const size_t NC = size_t(N) * C;
  // a + b has row means in [-0.3, 0.3] and std in [0.7, 1.5] (so |x - 0| <~ 4.5 std, see the bf16
  // tolerance on out below).
  const VecF mu = random_uniform(N, seed, -0.3f, 0.3f), sd = random_uniform(N, seed + 1, 0.7f, 1.5f);
  VecF a = random_normal(NC, seed + 2), b = random_normal(NC, seed + 3);
  for (int i = 0; i < N; i++)
    for (int j = 0; j < C; j++) {
      const size_t k = size_t(i) * C + j;
      a[k] = mu[i] + 0.8f * sd[i] * a[k];
      b[k] = 0.6f * sd[i] * b[k];
    }
  make_representable<T>(a);
  make_representable<T>(b);
  const VecF w = rand_t<T>(C, seed + 10, 0.5f, 1.5f), bias = rand_t<T>(C, seed + 11, -0.5f, 0.5f);
  Guarded<T> d_a(a), d_b(b), d_w(w), d_bias(bias), d_res(NC), d_out(NC);
  Guarded<float> d_mean(N), d_rstd(N);
  d_res.poison(), d_out.poison(), d_mean.poison(), d_rstd.poison();
  zt::cuda::residual_layernorm_forward<T>(d_res.p(), d_out.p(), d_mean.p(), d_rstd.p(), d_a.p(), d_b.p(), d_w.p(),
                                          d_bias.p(), N, C, g.stream);
  g.sync();
  Vec rres(NC), rout(NC), rmean(N), rrstd(N);
  zt::cpu::residual_forward<double>(rres.data(), to_double(a).data(), to_double(b).data(), NC);
  zt::cpu::layernorm_forward<double>(rout.data(), rmean.data(), rrstd.data(), rres.data(), to_double(w).data(),
                                     to_double(bias).data(), N, C);
  expect_close("residual_layernorm.residual", d_res.download(), rres, tol_for<T>(rres));
  // bf16: the kernel may normalise the bf16-rounded residual (what it stores) rather than the fp32
  // sum. That rounding (2^-8 |x| relative at most) is amplified by rstd: up to ~4.5 * 2^-8 in an
  // output of rms ~1, hence factor 4 for bf16 (and stats at kTolStatBF16).
  const double f_out = DType<T>::is_bf16 ? 4.0 : 1.0;
  expect_close("residual_layernorm.out", d_out.download(), rout, tol_for<T>(rout, f_out));
  expect_close("residual_layernorm.mean", d_mean.download(), rmean, tol_scale(DType<T>::stat_tol_rounded, rms(rres)));
  expect_close("residual_layernorm.rstd", d_rstd.download(), rrstd, tol_rms(DType<T>::stat_tol_rounded, rrstd));
  d_res.expect_guards("residual_layernorm.residual");
  d_out.expect_guards("residual_layernorm.out");
  d_mean.expect_guards("residual_layernorm.mean");
  d_rstd.expect_guards("residual_layernorm.rstd");
}

TYPED_TEST(GpuOps, ResidualLayernorm) {
  ZT_REQUIRE_GPU();
  using T = TypeParam;
  check_residual_layernorm<T>(1, 64, 300);
  check_residual_layernorm<T>(26, 200, 310);
  check_residual_layernorm<T>(4 * 257, 768, 320);
}


// =====================================================================================================
// element-wise: GELU, residual

template <class T> void check_gelu(size_t n, uint32_t seed) {
  SCOPED_TRACE(tag<T>("gelu") + " " + shape_str({{"n", (long long)n}}));
  GpuContext& g = gpu();
  const VecF x = rand_t<T>(n, seed, -5.0f, 5.0f);
  Guarded<T> d_x(x), d_out(n);
  d_out.poison();
  zt::cuda::gelu_forward<T>(d_out.p(), d_x.p(), n, g.stream);
  g.sync();
  Vec rout(n);
  zt::cpu::gelu_forward<double>(rout.data(), to_double(x).data(), n);
  // Scaled by rms(x): for x << 0, gelu(x) = 0.5 x (1 + tanh(..)) cancels to ~0 while the rounding
  // error of tanh stays ~2^-24 * 0.5 |x|.
  expect_close("gelu_forward.out", d_out.download(), rout, tol_scale(DType<T>::tol, rms(x)));
  d_out.expect_guards("gelu_forward.out");

  const VecF dout = rand_t<T>(n, seed + 1), dinp0 = rand_t<T>(n, seed + 2);
  Guarded<T> d_dout(dout), d_dinp(dinp0);
  zt::cuda::gelu_backward<T>(d_dinp.p(), d_x.p(), d_dout.p(), n, g.stream);
  g.sync();
  Vec rdinp = to_double(dinp0);
  zt::cpu::gelu_backward<double>(rdinp.data(), to_double(x).data(), to_double(dout).data(), n);
  expect_close("gelu_backward.dinp", d_dinp.download(), rdinp, tol_acc<T>(rdinp, VecF(n, 0.0f)));
  d_dinp.expect_guards("gelu_backward.dinp");
  // In place (dinp = dout), as the unfused DGELU would: the same bits as out of place.
  const auto raw = d_dinp.download_raw();
  zt::cuda::gelu_backward<T>(d_dout.p(), d_x.p(), d_dout.p(), n, g.stream);
  g.sync();
  expect_bitwise_equal("gelu_backward in place", raw, d_dout.download_raw());
}

TYPED_TEST(GpuOps, Gelu) {
  ZT_REQUIRE_GPU();
  using T = TypeParam;
  check_gelu<T>(1, 700);
  check_gelu<T>(1001, 710);  // not a multiple of the 128-bit packet: a tail
  check_gelu<T>(26 * 256, 720);
  check_gelu<T>(size_t(4) * 257 * 3072, 730);
}

template <class T> void check_residual(size_t n, uint32_t seed) {
  SCOPED_TRACE(tag<T>("residual_forward") + " " + shape_str({{"n", (long long)n}}));
  GpuContext& g = gpu();
  const VecF a = rand_t<T>(n, seed, -4.0f, 4.0f), b = rand_t<T>(n, seed + 1);
  Guarded<T> d_a(a), d_b(b), d_out(n);
  d_out.poison();
  zt::cuda::residual_forward<T>(d_out.p(), d_a.p(), d_b.p(), n, g.stream);
  g.sync();
  Vec rout(n);
  zt::cpu::residual_forward<double>(rout.data(), to_double(a).data(), to_double(b).data(), n);
  expect_close("residual_forward.out", d_out.download(), rout, tol_for<T>(rout));
  d_out.expect_guards("residual_forward.out");
}

TYPED_TEST(GpuOps, Residual) {
  ZT_REQUIRE_GPU();
  using T = TypeParam;
  check_residual<T>(1, 800);
  check_residual<T>(1001, 810);
  check_residual<T>(size_t(4) * 257 * 768, 820);
}

// =====================================================================================================
// fused classifier

template <class T> void check_softmax_xent(int N, int V, int Vp, uint32_t seed) {
  SCOPED_TRACE(tag<T>("softmax_xent") + " " + shape_str({{"N", N}, {"V", V}, {"Vp", Vp}}));
  GpuContext& g = gpu();
  const size_t NV = size_t(N) * Vp;
  // Real columns ~ N(0, 2); padding columns hold 30, far above every real logit: if they entered the
  // softmax, the loss would be off by ~25 and every probability near 0.
  VecF logits = random_normal(NV, seed, 0.0f, 2.0f);
  for (int i = 0; i < N; i++)
    for (int j = V; j < Vp; j++) logits[size_t(i) * Vp + j] = 30.0f;
  make_representable<T>(logits);
  std::vector<int> targets = random_ints(N, V, seed + 1);
  targets[0] = V - 1;
  if (N > 1) targets[1] = 0;
  const float dloss = 1.0f / float(N);
  DeviceBuffer<int> d_tgt(N);
  d_tgt.upload_raw(targets);
  Guarded<T> d_logits(logits);
  Guarded<float> d_losses(N);

  // losses only: logits must come back untouched
  d_losses.poison();
  zt::cuda::softmax_xent_forward_backward<T>(d_logits.p(), d_losses.p(), d_tgt.get(), dloss, N, V, Vp, false, g.stream);
  g.sync();
  Vec rl = to_double(logits), rlosses(N);
  zt::cpu::softmax_xent_forward_backward<double>(rl.data(), rlosses.data(), targets.data(), double(dloss), N, V, Vp, false);
  // Losses: fp32 math on inputs exact in T.
  expect_close("softmax_xent.losses (no grad)", d_losses.download(), rlosses, tol_rms(kTolStat, rlosses));
  expect_bitwise_equal("softmax_xent.logits (write_dlogits = false: untouched)", Guarded<T>(logits).download_raw(),
                       d_logits.download_raw());
  d_losses.expect_guards("softmax_xent.losses");

  // losses and dlogits over the logits
  d_losses.poison();
  zt::cuda::softmax_xent_forward_backward<T>(d_logits.p(), d_losses.p(), d_tgt.get(), dloss, N, V, Vp, true, g.stream);
  g.sync();
  Vec rd = to_double(logits), rlosses2(N);
  zt::cpu::softmax_xent_forward_backward<double>(rd.data(), rlosses2.data(), targets.data(), double(dloss), N, V, Vp, true);
  expect_close("softmax_xent.losses", d_losses.download(), rlosses2, tol_rms(kTolStat, rlosses2));
  const VecF dl = d_logits.download();
  expect_close("softmax_xent.dlogits", dl, rd, tol_for<T>(rd));
  size_t pad_nonzero = 0, first = 0;
  for (int i = 0; i < N; i++)
    for (int j = V; j < Vp; j++)
      if (!(dl[size_t(i) * Vp + j] == 0.0f) && pad_nonzero++ == 0) first = size_t(i) * Vp + j;
  EXPECT_EQ(pad_nonzero, 0u) << "padding columns must get exactly zero gradient; first bad at [" << first
                             << "] = " << (pad_nonzero ? dl[first] : 0.0f);
  d_logits.expect_guards("softmax_xent.dlogits");
  d_losses.expect_guards("softmax_xent.losses");
}

TYPED_TEST(GpuOps, SoftmaxCrossEntropy) {
  ZT_REQUIRE_GPU();
  using T = TypeParam;
  check_softmax_xent<T>(1, 97, 128, 900);
  check_softmax_xent<T>(26, 97, 128, 910);
  check_softmax_xent<T>(5, 1000, 1024, 920);
  check_softmax_xent<T>(8, 50257, 50304, 930);  // GPT-2 vocabulary
}

}  // namespace
