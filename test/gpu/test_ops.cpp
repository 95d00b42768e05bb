// GPU kernel tests: every zt::cuda op, forward and backward, for T = float (the strict fp32 parity
// mode) and T = bf16, against the CPU reference op in double (zt::cpu::...<double>) on the same inputs.
// Helpers, poisoning and the tolerance scheme: gpu_test_util.h. Without a GPU every test is SKIPPED.
//
// What is checked besides the values:
//   * overwrite outputs are poisoned (NaN) before every run; accumulate outputs (+=) start from the
//     same random values on both sides, so "+=" vs "=" is checked too;
//   * outputs sit in guarded allocations: a write before or after the buffer fails the test;
//   * determinism where the headers promise it (encoder_backward, layernorm_backward, the matmul
//     dbias kernel and cuBLASLt's products, sum_squares_accumulate, AdamW's stochastic rounding) and
//     attention_backward (deterministic by the design in attention_common.cuh, not stated in attention.h): the
//     same inputs run twice give bit-identical results;
//   * odd lengths for the element-wise ops (tails after the 128-bit packets), odd row counts, a
//     matmul on pointers 64 bytes into an allocation, classifier padding columns (exact zero grad).
//
// Shapes: small odd ones and GPT-2-like ones (C = 768, NH = 12, V = 50257 / Vp = 50304), sized so the
// whole binary runs well under a minute on an H100 (the double CPU references dominate).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "gpu_test_util.h"
#include "kernels/adamw.h"
#include "kernels/attention.h"
#include "kernels/encoder.h"
#include "kernels/gelu.h"
#include "kernels/global_norm.h"
#include "kernels/layernorm.h"
#include "kernels/matmul.h"
#include "kernels/residual.h"
#include "kernels/softmax_xent.h"

namespace {

using namespace zt::gpu_test;
using zt::bf16;
using Vec = std::vector<double>;
using VecF = std::vector<float>;

std::string shape_str(std::initializer_list<std::pair<const char*, long long>> dims) {
  std::string s;
  for (const auto& [k, v] : dims) s += std::string(s.empty() ? "" : " ") + k + "=" + std::to_string(v);
  return s;
}

template <class T> std::string tag(const char* op) { return std::string(op) + "<" + DType<T>::name + ">"; }

// Columns [c0, c0 + w) of a row-major (rows, ld) array (to compare the q, k, v parts of dqkv apart).
template <class V> V columns(const V& a, size_t rows, size_t ld, size_t c0, size_t w) {
  V r(rows * w);
  for (size_t i = 0; i < rows; i++)
    for (size_t j = 0; j < w; j++) r[i * w + j] = a[i * ld + c0 + j];
  return r;
}

// fp32 mode: a K-term dot product accumulated in fp32 has a relative error growing like sqrt(K) *
// 2^-24 (random-walk rounding of the running sum); at K <= 1024 this is well inside 1e-5, beyond it
// (the classifier's dinp sums over Vp = 50304) the tolerance grows with sqrt(K / 1024). bf16 outputs
// are dominated by their final rounding, so no growth there.
template <class T> double k_factor(long long K) {
  if (DType<T>::is_bf16) return 1.0;
  return std::max(1.0, std::sqrt(double(K) / 1024.0));
}

template <class T> class GpuOps : public ::testing::Test {};
struct TypeNames {
  template <class T> static std::string GetName(int) { return DType<T>::name; }
};
using OpTypes = ::testing::Types<float, bf16>;
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
// matmul

struct MatmulShape {
  int N, C, OC;
};

template <class T> void check_matmul_forward(MatmulShape s, bool bias, bool gelu, size_t front, uint32_t seed) {
  const auto [N, C, OC] = s;
  SCOPED_TRACE(tag<T>("matmul_forward") + " " +
               shape_str({{"N", N}, {"C", C}, {"OC", OC}, {"bias", bias}, {"gelu", gelu}, {"offset_elems", (long long)front}}));
  GpuContext& g = gpu();
  const float wr = 3.0f / std::sqrt(float(C));  // outputs ~ unit variance, so GELU sees its curved part
  const VecF inp = rand_t<T>(size_t(N) * C, seed), w = rand_t<T>(size_t(OC) * C, seed + 1, -wr, wr);
  const VecF b = rand_t<T>(OC, seed + 2, -0.5f, 0.5f);
  Guarded<T> d_inp(inp, front), d_w(w, front), d_b(b, front), d_out(size_t(N) * OC, front), d_pre(size_t(N) * OC, front);
  d_out.poison(), d_pre.poison();
  zt::cuda::matmul_forward<T>(d_out.p(), gelu ? d_pre.p() : nullptr, d_inp.p(), d_w.p(), bias ? d_b.p() : nullptr, N, C,
                              OC, g.blas());
  g.sync();
  Vec rpre(size_t(N) * OC);
  const Vec bd = to_double(b);
  zt::cpu::matmul_forward<double>(rpre.data(), to_double(inp).data(), to_double(w).data(), bias ? bd.data() : nullptr, N,
                                  C, OC);
  const double kf = k_factor<T>(C);
  if (gelu) {
    Vec rout(rpre.size());
    zt::cpu::gelu_forward<double>(rout.data(), rpre.data(), rpre.size());
    expect_close("matmul_forward.pre_gelu", d_pre.download(), rpre, tol_for<T>(rpre, kf));
    // factor 2: cuBLASLt's GELU epilogue evaluates tanh its own way (and the unfused fallback applies
    // GELU to the rounded pre-activation in bf16).
    expect_close("matmul_forward.out (gelu)", d_out.download(), rout, tol_for<T>(rout, 2.0 * kf));
    d_pre.expect_guards("matmul_forward.pre_gelu");
  } else {
    expect_close("matmul_forward.out", d_out.download(), rpre, tol_for<T>(rpre, kf));
  }
  d_out.expect_guards("matmul_forward.out");
}

// write: how dinp is written (matmul.h: Dinp). through_gelu: inp is gelu(pre), and dinp must be the
// gradient before that GELU (the DGELU epilogue, or its unfused fallback when C % 8 != 0).
template <class T> void check_matmul_backward(MatmulShape s, bool with_dinp, bool with_dbias, size_t front, uint32_t seed,
                                               zt::Dinp write = zt::Dinp::accumulate, bool through_gelu = false) {
  const auto [N, C, OC] = s;
  const bool overwrite = write == zt::Dinp::overwrite;
  SCOPED_TRACE(tag<T>("matmul_backward") + " " +
               shape_str({{"N", N}, {"C", C}, {"OC", OC}, {"dinp", with_dinp}, {"dbias", with_dbias},
                          {"offset_elems", (long long)front}, {"overwrite", overwrite}, {"through_gelu", through_gelu}}));
  GpuContext& g = gpu();
  const float wr = 3.0f / std::sqrt(float(C));
  const VecF inp = rand_t<T>(size_t(N) * C, seed), w = rand_t<T>(size_t(OC) * C, seed + 1, -wr, wr);
  const VecF dout = rand_t<T>(size_t(N) * OC, seed + 3);
  const VecF dinp0 = rand_t<T>(size_t(N) * C, seed + 4), dw0 = rand_t<T>(size_t(OC) * C, seed + 5);
  const VecF db0 = rand_t<T>(OC, seed + 6);
  const VecF pre = through_gelu ? rand_t<T>(size_t(N) * C, seed + 7, -4.0f, 4.0f) : VecF(1, 0.0f);
  Guarded<T> d_inp(inp, front), d_w(w, front), d_dout(dout, front), d_pre(pre, front);
  Guarded<T> d_dinp(dinp0, front), d_dw(dw0, front), d_db(db0, front);
  auto scratch = make_scratch(zt::cuda::matmul_backward_scratch_bytes(N, OC));
  auto run = [&] {
    zt::cuda::matmul_backward<T>(with_dinp ? d_dinp.p() : nullptr, d_dw.p(), with_dbias ? d_db.p() : nullptr, d_dout.p(),
                                 d_inp.p(), d_w.p(), N, C, OC, scratch.get(), g.blas(), -1, write,
                                 through_gelu ? d_pre.p() : nullptr);
    g.sync();
  };
  run();
  Vec rdinp = to_double(dinp0), rdw = to_double(dw0), rdb = to_double(db0);
  zt::cpu::matmul_backward<double>(with_dinp ? rdinp.data() : nullptr, rdw.data(), with_dbias ? rdb.data() : nullptr,
                                   to_double(dout).data(), to_double(inp).data(), to_double(w).data(), N, C, OC, -1, write);
  if (through_gelu) zt::cpu::gelu_backward<double>(rdinp.data(), to_double(pre).data(), rdinp.data(), rdinp.size());
  // dinp sums over OC, dweight and dbias over N. Overwritten, dinp's scale is its own (dinp0 left in
  // place would be far outside it).
  if (with_dinp)
    expect_close("matmul_backward.dinp", d_dinp.download(), rdinp,
                 tol_acc<T>(rdinp, overwrite ? VecF(rdinp.size(), 0.0f) : dinp0, k_factor<T>(OC)));
  expect_close("matmul_backward.dweight", d_dw.download(), rdw, tol_acc<T>(rdw, dw0, k_factor<T>(N)));
  if (with_dbias) expect_close("matmul_backward.dbias", d_db.download(), rdb, tol_acc<T>(rdb, db0, k_factor<T>(N)));
  // A nullptr output must be left alone (it is not passed, so the guarded buffer must be unchanged).
  if (!with_dinp) expect_bitwise_equal("matmul_backward.dinp (not requested: untouched)", Guarded<T>(dinp0).download_raw(),
                                       d_dinp.download_raw());
  if (!with_dbias) expect_bitwise_equal("matmul_backward.dbias (not requested: untouched)", Guarded<T>(db0).download_raw(),
                                        d_db.download_raw());
  d_dinp.expect_guards("matmul_backward.dinp");
  d_dw.expect_guards("matmul_backward.dweight");
  d_db.expect_guards("matmul_backward.dbias");

  // Deterministic: dbias by construction (fixed-order partial sums), the products because cuBLASLt
  // gives bit-identical results for the same call on the same GPU. Overwritten, dinp must not depend
  // on what the buffer held: the rerun starts it poisoned.
  const auto dinp1 = d_dinp.download_raw(), dw1 = d_dw.download_raw(), db1 = d_db.download_raw();
  d_dinp.upload(dinp0), d_dw.upload(dw0), d_db.upload(db0);
  if (overwrite && with_dinp) d_dinp.poison();
  poison(scratch);
  run();
  expect_bitwise_equal("matmul_backward.dinp (rerun)", dinp1, d_dinp.download_raw());
  expect_bitwise_equal("matmul_backward.dweight (rerun)", dw1, d_dw.download_raw());
  expect_bitwise_equal("matmul_backward.dbias (rerun)", db1, d_db.download_raw());
}

// The bias gradient's packed first pass (128-bit loads: dout 16-byte aligned, OC a multiple of
// 16 / sizeof(T)) and the scalar one (any other dout: here one element into its allocation) add in
// the same order: bit for bit the same dbias, and right.
TYPED_TEST(GpuOps, MatmulBiasGradientPackedEqualsScalar) {
  ZT_REQUIRE_GPU();
  using T = TypeParam;
  GpuContext& g = gpu();
  uint32_t seed = 900;
  for (MatmulShape s : {MatmulShape{2 * 257, 768, 3072}, MatmulShape{26, 64, 192}, MatmulShape{300, 8, 40}}) {
    const auto [N, C, OC] = s;
    SCOPED_TRACE(tag<T>("bias gradient") + " " + shape_str({{"N", N}, {"OC", OC}}));
    const VecF dout = rand_t<T>(size_t(N) * OC, seed += 10), db0 = rand_t<T>(OC, seed + 1);
    Guarded<T> d_aligned(dout), d_odd(dout, 1), d_db_packed(db0), d_db_scalar(db0);
    auto scratch = make_scratch(zt::cuda::matmul_backward_scratch_bytes(N, OC));
    zt::cuda::matmul_backward<T>(nullptr, nullptr, d_db_packed.p(), d_aligned.p(), nullptr, nullptr, N, C, OC,
                                 scratch.get(), g.blas());
    zt::cuda::matmul_backward<T>(nullptr, nullptr, d_db_scalar.p(), d_odd.p(), nullptr, nullptr, N, C, OC,
                                 scratch.get(), g.blas());
    g.sync();
    expect_bitwise_equal("dbias: packed vs scalar first pass", d_db_scalar.download_raw(), d_db_packed.download_raw());
    Vec rdb = to_double(db0);
    zt::cpu::matmul_backward<double>(nullptr, nullptr, rdb.data(), to_double(dout).data(), nullptr, nullptr, N, C, OC);
    expect_close("dbias", d_db_packed.download(), rdb, tol_acc<T>(rdb, db0, k_factor<T>(N)));
    d_db_packed.expect_guards("dbias");
  }
}

TYPED_TEST(GpuOps, MatmulForward) {
  ZT_REQUIRE_GPU();
  using T = TypeParam;
  uint32_t seed = 400;
  // every epilogue variant on small and GPT-2 shapes
  for (MatmulShape s : {MatmulShape{1, 64, 64}, MatmulShape{26, 64, 192}, MatmulShape{2 * 257, 768, 3072}})
    for (bool bias : {false, true})
      for (bool gelu : {false, true}) check_matmul_forward<T>(s, bias, gelu, 0, seed += 10);
  check_matmul_forward<T>({4 * 64, 128, 3 * 128}, true, false, 0, seed += 10);
  check_matmul_forward<T>({2 * 257, 768, 3 * 768}, true, false, 0, seed += 10);  // qkv
  check_matmul_forward<T>({2 * 257, 3072, 768}, true, false, 0, seed += 10);      // mlp projection, K = 3072
  check_matmul_forward<T>({64, 768, 50304}, false, false, 0, seed += 10);         // classifier, no bias
  // pointers 64 bytes into their allocations (activations and parameters live inside arenas)
  const size_t off = 64 / sizeof(T);
  check_matmul_forward<T>({26, 128, 256}, true, true, off, seed += 10);
  check_matmul_forward<T>({26, 128, 256}, true, false, off, seed += 10);
}

TYPED_TEST(GpuOps, MatmulBackward) {
  ZT_REQUIRE_GPU();
  using T = TypeParam;
  uint32_t seed = 500;
  for (MatmulShape s : {MatmulShape{1, 64, 64}, MatmulShape{26, 64, 192}, MatmulShape{2 * 257, 768, 768}})
    for (bool dinp : {false, true})
      for (bool dbias : {false, true}) check_matmul_backward<T>(s, dinp, dbias, 0, seed += 10);
  check_matmul_backward<T>({4 * 257, 768, 3072}, true, true, 0, seed += 10);  // mlp fc, N = 1028 rows
  check_matmul_backward<T>({2 * 257, 3072, 768}, true, true, 0, seed += 10);
  check_matmul_backward<T>({64, 768, 50304}, true, false, 0, seed += 10);     // classifier: no bias, K = 50304
  check_matmul_backward<T>({26, 128, 256}, true, true, 64 / sizeof(T), seed += 10);
  // A block's layers overwrite dinp (gpt_block.cpp); the MLP projection's dinp goes through the GELU.
  const zt::Dinp over = zt::Dinp::overwrite;
  check_matmul_backward<T>({2 * 257, 768, 768}, true, true, 0, seed += 10, over);           // attention projection
  check_matmul_backward<T>({2 * 257, 3072, 768}, true, true, 0, seed += 10, over, true);    // MLP projection: DGELU
  check_matmul_backward<T>({26, 128, 256}, true, true, 64 / sizeof(T), seed += 10, over, true);  // inside an arena
  check_matmul_backward<T>({26, 100, 64}, true, true, 0, seed += 10, over, true);  // C % 8 != 0: the unfused fallback
}

// =====================================================================================================
// attention

template <class T> void check_attention(int B, int Tn, int C, int NH, uint32_t seed) {
  SCOPED_TRACE(tag<T>("attention") + " " + shape_str({{"B", B}, {"T", Tn}, {"C", C}, {"NH", NH}, {"hs", C / NH}}));
  GpuContext& g = gpu();
  const size_t BT = size_t(B) * Tn, n_qkv = BT * 3 * C, n_out = BT * C, n_lse = size_t(B) * NH * Tn;
  // N(0, 1) entries: scores q.k / sqrt(hs) ~ N(0, 1), softmax neither uniform nor one-hot.
  const VecF qkv = randn_t<T>(n_qkv, seed);
  Guarded<T> d_qkv(qkv), d_out(n_out);
  Guarded<float> d_lse(n_lse);

  // forward
  d_out.poison(), d_lse.poison();
  zt::cuda::attention_forward<T>(d_out.p(), d_lse.p(), d_qkv.p(), B, Tn, C, NH, g.stream);
  g.sync();
  Vec rout(n_out), rlse(n_lse);
  zt::cpu::attention_forward<double>(rout.data(), rlse.data(), to_double(qkv).data(), B, Tn, C, NH);
  // factor 2: the exp/log of an online softmax (exp2 with a folded log2(e) scale) and, in bf16, the
  // probabilities rounded to bf16 for the P.V tensor-core product (FlashAttention-2 does this).
  expect_close("attention_forward.out", d_out.download(), rout, tol_for<T>(rout, 2.0));
  expect_close("attention_forward.lse", d_lse.download(), rlse, tol_rms(DType<T>::stat_tol_rounded, rlse));
  d_out.expect_guards("attention_forward.out");
  d_lse.expect_guards("attention_forward.lse");

  // backward from the reference out / lse, rounded to what the GPU stores (T and fp32); the CPU
  // backward gets the same rounded values.
  VecF out_in = to_float(rout);
  make_representable<T>(out_in);
  const VecF lse_in = to_float(rlse);
  const VecF dout = rand_t<T>(n_out, seed + 1), dqkv0 = rand_t<T>(n_qkv, seed + 2);
  Guarded<T> d_outin(out_in), d_dout(dout), d_dqkv(dqkv0);
  Guarded<float> d_lsein(lse_in);
  auto scratch = make_scratch(zt::cuda::attention_backward_scratch_bytes(B, Tn, C, NH));
  auto run = [&] {
    zt::cuda::attention_backward<T>(d_dqkv.p(), d_dout.p(), d_qkv.p(), d_outin.p(), d_lsein.p(), B, Tn, C, NH,
                                    scratch.get(), g.stream);
    g.sync();
  };
  run();
  Vec rdqkv = to_double(dqkv0);  // overwritten by both sides: dqkv0 must leave no trace
  zt::cpu::attention_backward<double>(rdqkv.data(), to_double(dout).data(), to_double(qkv).data(), to_double(out_in).data(),
                                      to_double(lse_in).data(), B, Tn, C, NH);
  const VecF got = d_dqkv.download();
  // factor 2 (fp32: exp approximations, dq accumulated in a different order) or 4 (bf16: P and
  // dS = P (dP - D) rounded to bf16 for the dV, dQ and dK tensor-core products, as FlashAttention-2;
  // atol is scaled by the rms of the whole dqkv delta: dq and dk can cancel to ~0 (at T = 1 exactly:
  // ds = p (dp - D) = 0) while their rounding errors stay proportional to dp and D.
  // bf16 also grows with the context: dk and dv sum up to T bf16-rounded products per element, so
  // independent rounding errors grow like sqrt(T); the factor covers T = 256 and scales beyond it
  // (emulated on the CPU, T = 1024 reached 1.03x of the unscaled bound in 1 of 786k elements).
  const double f = DType<T>::is_bf16 ? 4.0 * std::sqrt(std::max(1.0, Tn / 256.0)) : 2.0;
  const Tol tol = tol_acc<T>(rdqkv, VecF(rdqkv.size(), 0.0f), f);
  const char* part[3] = {"attention_backward.dq", "attention_backward.dk", "attention_backward.dv"};
  for (int p = 0; p < 3; p++) {
    const size_t ld = 3 * size_t(C), c0 = size_t(p) * C;
    expect_close(part[p], columns(got, BT, ld, c0, C), columns(rdqkv, BT, ld, c0, C), tol);
  }
  d_dqkv.expect_guards("attention_backward.dqkv");

  // Deterministic: attention_common.cuh documents one owner thread per dq / dk / dv element summing in a
  // fixed order, no atomics (attention.h itself does not say so).
  const auto raw1 = d_dqkv.download_raw();
  d_dqkv.poison();  // overwritten: what the buffer held must not matter
  poison(scratch);
  run();
  expect_bitwise_equal("attention_backward.dqkv (rerun)", raw1, d_dqkv.download_raw());

  // The tensor-core kernels' other ways of dividing the work (attention.h: AttentionTcVariant) give
  // the default's results bit for bit: same arithmetic per row, only warps and launch order differ.
  if constexpr (DType<T>::is_bf16) {
    const auto raw_out = d_out.download_raw(), raw_lse = d_lse.download_raw();
    for (const zt::cuda::AttentionTcVariant v :
         {zt::cuda::AttentionTcVariant{16, false}, zt::cuda::AttentionTcVariant{16, true},
          zt::cuda::AttentionTcVariant{32, false}, zt::cuda::AttentionTcVariant{32, true}}) {
      SCOPED_TRACE("variant warp_rows " + std::to_string(v.warp_rows) + " heads_fastest " +
                   std::to_string(v.heads_fastest));
      d_out.poison(), d_lse.poison();
      zt::cuda::attention_forward<T>(d_out.p(), d_lse.p(), d_qkv.p(), B, Tn, C, NH, g.stream, v);
      d_dqkv.poison();
      poison(scratch);
      zt::cuda::attention_backward<T>(d_dqkv.p(), d_dout.p(), d_qkv.p(), d_outin.p(), d_lsein.p(), B, Tn, C, NH,
                                      scratch.get(), g.stream, v);
      g.sync();
      expect_bitwise_equal("attention_forward.out (variant)", raw_out, d_out.download_raw());
      expect_bitwise_equal("attention_forward.lse (variant)", raw_lse, d_lse.download_raw());
      expect_bitwise_equal("attention_backward.dqkv (variant)", raw1, d_dqkv.download_raw());
    }
  }
}

TYPED_TEST(GpuOps, Attention) {
  ZT_REQUIRE_GPU();
  using T = TypeParam;
  // hs = C / NH in {16, 32, 64, 128} (attention.h).
  check_attention<T>(1, 1, 64, 1, 600);       // one position: out = v, lse = the single score
  check_attention<T>(2, 33, 64, 4, 601);      // hs 16, one past a tile of 32
  check_attention<T>(2, 128, 128, 4, 602);    // hs 32: the default plan's heads (C 128, NH 4)
  check_attention<T>(2, 65, 96, 3, 603);      // hs 32, odd head count, one past a tile of 64
  check_attention<T>(2, 13, 128, 1, 610);     // hs 128
  check_attention<T>(2, 13, 256, 4, 620);     // hs 64
  check_attention<T>(3, 64, 256, 2, 630);     // hs 128, one full tile
  check_attention<T>(2, 257, 512, 4, 640);    // hs 128, ragged last tile
  check_attention<T>(4, 257, 768, 12, 650);   // GPT-2 heads
  // GPT-2 context: minutes under the CPU emulator (label emu), which runs every other shape.
  if (!zt::gpu_test::emulated()) check_attention<T>(1, 1024, 768, 12, 660);
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

// =====================================================================================================
// AdamW

zt::cpu::AdamWArgs adamw_args() {
  // lr, beta1, beta2, eps, weight_decay, grad_scale (as after global-norm clipping), step (bias
  // corrections not trivial)
  return zt::cpu::AdamWArgs{1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.7f, 3};
}
// fp32 AdamW against double: a handful of fp32 roundings per element (~1 ulp of the parameter).
constexpr double kTolAdam = 1e-6;

struct AdamState {
  VecF param, grad, m, v;
};
template <class G> AdamState adam_state(size_t n, uint32_t seed) {
  AdamState s;
  s.param = random_uniform(n, seed, -1.0f, 1.0f);
  s.grad = randn_t<G>(n, seed + 1, 0.0f, 1e-2f);
  s.m = random_normal(n, seed + 2, 0.0f, 3e-3f);
  s.v = random_uniform(n, seed + 3, 1e-6f, 2e-4f);
  return s;
}

// The two bf16 values a stochastic rounding of x may give: x truncated toward zero, and one bf16 ulp
// further from zero (only truncation if x is exactly a bf16 value).
inline bool sr_candidate(float x, uint16_t got) {
  const uint32_t xb = f32_bits(x), lo = xb & 0xFFFF0000u, g = uint32_t(got) << 16;
  return g == lo || ((xb & 0xFFFFu) != 0 && g == lo + 0x10000u);
}

TEST(GpuAdamW, Fp32WithAndWithoutMaster) {
  ZT_REQUIRE_GPU();
  GpuContext& g = gpu();
  const auto args = adamw_args();
  for (size_t n : {size_t(1), size_t(1001), size_t(1) << 20})
    for (bool with_master : {false, true}) {
      SCOPED_TRACE(tag<float>("adamw") + " " + shape_str({{"n", (long long)n}, {"master", with_master}}));
      const AdamState s = adam_state<float>(n, 1000 + uint32_t(n));
      Guarded<float> d_p(s.param), d_g(s.grad), d_m(s.m), d_v(s.v), d_master(s.param);
      zt::cuda::adamw_update<float>(d_p.p(), with_master ? d_master.p() : nullptr, d_g.p(), d_m.p(), d_v.p(), n, args, 1234u, 0,
                                    g.stream);
      g.sync();
      Vec rp = to_double(s.param), rm = to_double(s.m), rv = to_double(s.v);
      zt::cpu::adamw_update<double>(rp.data(), to_double(s.grad).data(), rm.data(), rv.data(), n, args);
      expect_close("adamw.param", d_p.download(), rp, tol_rms(kTolAdam, rp));
      expect_close("adamw.m", d_m.download(), rm, tol_rms(kTolAdam, rm));
      expect_close("adamw.v", d_v.download(), rv, tol_rms(kTolAdam, rv));
      if (with_master) {
        expect_close("adamw.master", d_master.download(), rp, tol_rms(kTolAdam, rp));
        expect_bitwise_equal("adamw: fp32 param == master", d_p.download_raw(), d_master.download_raw());
      } else {
        expect_bitwise_equal("adamw: master not passed, untouched", Guarded<float>(s.param).download_raw(),
                             d_master.download_raw());
      }
      d_p.expect_guards("adamw.param");
      d_m.expect_guards("adamw.m");
      d_v.expect_guards("adamw.v");
      d_master.expect_guards("adamw.master");
    }
}

// clear_grad (the stage-0 step in memory): the same update bit for bit, the gradient left zero (for
// both parameter types), and nothing outside it written.
TEST(GpuAdamW, ClearGradLeavesZeroAndTheSameUpdate) {
  ZT_REQUIRE_GPU();
  GpuContext& g = gpu();
  const size_t n = 1001;
  const AdamState s = adam_state<float>(n, 1300);
  Guarded<float> p_keep(s.param), g_keep(s.grad), m_keep(s.m), v_keep(s.v);
  Guarded<float> p_clear(s.param), g_clear(s.grad), m_clear(s.m), v_clear(s.v);
  auto args = adamw_args();
  zt::cuda::adamw_update<float>(p_keep.p(), nullptr, g_keep.p(), m_keep.p(), v_keep.p(), n, args, 1u, 0, g.stream);
  args.clear_grad = true;
  zt::cuda::adamw_update<float>(p_clear.p(), nullptr, g_clear.p(), m_clear.p(), v_clear.p(), n, args, 1u, 0, g.stream);
  g.sync();
  expect_bitwise_equal("adamw clear_grad: param", p_keep.download_raw(), p_clear.download_raw());
  expect_bitwise_equal("adamw clear_grad: m", m_keep.download_raw(), m_clear.download_raw());
  expect_bitwise_equal("adamw clear_grad: v", v_keep.download_raw(), v_clear.download_raw());
  expect_bitwise_equal("adamw without clear_grad: grad untouched", Guarded<float>(s.grad).download_raw(),
                       g_keep.download_raw());
  EXPECT_EQ(VecF(n, 0.f), g_clear.download());
  g_clear.expect_guards("adamw.grad");

  VecF p16 = s.param;
  round_to_bf16(p16);
  Guarded<bf16> b_p(p16), b_g(s.grad);
  Guarded<float> b_master(s.param), b_m(s.m), b_v(s.v);
  zt::cuda::adamw_update<bf16>(b_p.p(), b_master.p(), b_g.p(), b_m.p(), b_v.p(), n, args, 1u, 0, g.stream);
  g.sync();
  EXPECT_EQ(VecF(n, 0.f), b_g.download());
  b_g.expect_guards("adamw.grad bf16");
}

// bf16 parameters with an fp32 master: the master follows the CPU update to fp32 accuracy; the bf16
// parameter is a stochastic rounding of the new master (one of its two bf16 neighbours), unbiased,
// reproducible for a given seed and different for another seed.
TEST(GpuAdamW, Bf16WithMasterStochasticRounding) {
  ZT_REQUIRE_GPU();
  GpuContext& g = gpu();
  const auto args = adamw_args();
  for (size_t n : {size_t(1), size_t(1001), size_t(1) << 20}) {
    SCOPED_TRACE(tag<bf16>("adamw") + " master, " + shape_str({{"n", (long long)n}}));
    const AdamState s = adam_state<bf16>(n, 1100 + uint32_t(n));
    VecF p16 = s.param;
    round_to_bf16(p16);
    Guarded<bf16> d_p(p16), d_g(s.grad);
    Guarded<float> d_master(s.param), d_m(s.m), d_v(s.v);
    const uint32_t seed = 777u;
    auto run = [&](uint32_t sd) {
      zt::cuda::adamw_update<bf16>(d_p.p(), d_master.p(), d_g.p(), d_m.p(), d_v.p(), n, args, sd, 0, g.stream);
      g.sync();
    };
    run(seed);
    Vec rp = to_double(s.param), rm = to_double(s.m), rv = to_double(s.v);
    zt::cpu::adamw_update<double>(rp.data(), to_double(s.grad).data(), rm.data(), rv.data(), n, args);
    const VecF master = d_master.download();
    expect_close("adamw.master", master, rp, tol_rms(kTolAdam, rp));
    expect_close("adamw.m", d_m.download(), rm, tol_rms(kTolAdam, rm));
    expect_close("adamw.v", d_v.download(), rv, tol_rms(kTolAdam, rv));
    d_p.expect_guards("adamw.param");
    d_master.expect_guards("adamw.master");

    const std::vector<bf16> praw = d_p.download_raw();
    size_t not_neighbour = 0, first = 0;
    double z_num = 0, z_var = 0;  // sum(up - P(up)), sum P(1-P)
    size_t mid_n = 0, mid_up = 0;  // elements with fraction in [0.1, 0.4]: P(up) averages 0.25
    for (size_t i = 0; i < n; i++) {
      uint16_t pb;
      std::memcpy(&pb, static_cast<const void*>(&praw[i]), 2);
      if (!sr_candidate(master[i], pb)) {
        if (not_neighbour++ == 0) first = i;
        continue;
      }
      const uint32_t xb = f32_bits(master[i]);
      const double frac = double(xb & 0xFFFFu) / 65536.0;
      const bool up = (uint32_t(pb) << 16) != (xb & 0xFFFF0000u);
      z_num += double(up) - frac;
      z_var += frac * (1.0 - frac);
      if (frac >= 0.1 && frac <= 0.4) mid_n++, mid_up += up;
    }
    EXPECT_EQ(not_neighbour, 0u) << "bf16 param is not a bf16 neighbour of the new fp32 master; first at [" << first
                                 << "]: master " << master[first];
    if (n >= 100000) {
      // Unbiased: E[up] = frac, so sum(up - frac) / sqrt(sum frac(1-frac)) is ~N(0, 1).
      const double z = z_num / std::sqrt(std::max(z_var, 1e-30));
      EXPECT_LT(std::fabs(z), 6.0) << "stochastic rounding is biased: z = " << z;
      // Stochastic, not round-to-nearest: below half an ulp, round-to-nearest never rounds up.
      const double rate = double(mid_up) / double(std::max<size_t>(mid_n, 1));
      EXPECT_GT(rate, 0.2) << "fraction in [0.1, 0.4] rounded away from zero: " << rate << " (expect ~0.25)";
      EXPECT_LT(rate, 0.3) << "fraction in [0.1, 0.4] rounded away from zero: " << rate << " (expect ~0.25)";
    }

    // same seed: bit-identical; another seed: a different rounding somewhere (n large enough)
    auto reset = [&] {
      d_p.upload(p16), d_master.upload(s.param), d_m.upload(s.m), d_v.upload(s.v);
    };
    reset();
    run(seed);
    expect_bitwise_equal("adamw.param (rerun, same seed)", praw, d_p.download_raw());
    expect_bitwise_equal("adamw.master (rerun)", d_master.download_raw(), Guarded<float>(master).download_raw());
    if (n >= 1000) {
      reset();
      run(seed + 1);
      EXPECT_GT(count_bitwise_diff(praw, d_p.download_raw()), 0u) << "the seed does not change the rounding";
    }
  }
}

// The CUDA backend's offloaded optimizer (zero/host_optimizer.cpp) runs the kernel's bf16 update on the
// CPU: cpu::adamw_update_bf16_master. Same inputs, same seed: bit for bit (m, v, master, parameters).
// Until both sides were built without FMA contraction, an H100 moved the fp32 results by an ulp, and the
// offload runs of test/emu/offload_emu.sh drifted from the device's (2026-11-27).
TEST(GpuAdamW, HostBf16MasterMatchesKernel) {
  ZT_REQUIRE_GPU();
  GpuContext& g = gpu();
  const auto args = adamw_args();
  const size_t n = 100003;
  const uint32_t seed = 4242u;
  AdamState s = adam_state<bf16>(n, 1700);
  Guarded<bf16> d_p(s.param), d_g(s.grad);
  Guarded<float> d_master(s.param), d_m(s.m), d_v(s.v);
  const std::vector<bf16> p0 = d_p.download_raw(), g0 = d_g.download_raw();
  std::vector<uint16_t> hp(n), hg(n);
  std::memcpy(hp.data(), static_cast<const void*>(p0.data()), 2 * n);
  std::memcpy(hg.data(), static_cast<const void*>(g0.data()), 2 * n);
  std::vector<float> hmaster(s.param.begin(), s.param.end()), hm(s.m.begin(), s.m.end()), hv(s.v.begin(), s.v.end());
  zt::cuda::adamw_update<bf16>(d_p.p(), d_master.p(), d_g.p(), d_m.p(), d_v.p(), n, args, seed, 0, g.stream);
  g.sync();
  zt::cpu::adamw_update_bf16_master(hp.data(), hmaster.data(), hg.data(), hm.data(), hv.data(), n, args, seed, 0);
  const std::vector<bf16> dp = d_p.download_raw();
  std::vector<uint16_t> dpb(n);
  std::memcpy(dpb.data(), static_cast<const void*>(dp.data()), 2 * n);
  const std::vector<float> dm = d_m.download(), dv = d_v.download(), dmaster = d_master.download();
  size_t diff_p = 0, diff_f = 0;
  for (size_t i = 0; i < n; ++i) {
    diff_p += dpb[i] != hp[i];
    diff_f += dm[i] != hm[i] || dv[i] != hv[i] || dmaster[i] != hmaster[i];
  }
  // Bit for bit on a GPU too: neither side contracts into FMAs (CMakeLists.txt, adamw.cu -fmad=false).
  EXPECT_EQ(diff_f, 0u) << "m, v or master differ from the kernel's";
  EXPECT_EQ(diff_p, 0u) << "bf16 parameters differ from the kernel's";
}

// The kernel's stochastic rounding draws by the element's global index (first + i): one launch over
// a buffer and launches over its slices (shards, offload sub-groups) give the same bf16 bits.
TEST(GpuAdamW, Bf16RoundingIndependentOfSlices) {
  ZT_REQUIRE_GPU();
  GpuContext& g = gpu();
  const auto args = adamw_args();
  const size_t n = 100003, cut1 = 4097, cut2 = 77777;
  const uint64_t first = (uint64_t(1) << 32) + 99;
  const AdamState s = adam_state<bf16>(n, 1800);
  auto update = [&](const std::vector<size_t>& cuts) {
    Guarded<bf16> d_p(s.param), d_g(s.grad);
    Guarded<float> d_master(s.param), d_m(s.m), d_v(s.v);
    for (size_t c = 0; c + 1 < cuts.size(); ++c) {
      const size_t lo = cuts[c];
      zt::cuda::adamw_update<bf16>(d_p.p() + lo, d_master.p() + lo, d_g.p() + lo, d_m.p() + lo, d_v.p() + lo,
                                   cuts[c + 1] - lo, args, 4243u, first + lo, g.stream);
    }
    g.sync();
    return d_p.download_raw();
  };
  const std::vector<bf16> whole = update({0, n}), sliced = update({0, cut1, cut2, n});
  EXPECT_EQ(count_bitwise_diff(whole, sliced), 0u) << "the rounding depends on where the buffer is cut";
}

// bf16 parameters without a master: the update is computed in fp32 from the bf16 value and
// stochastically rounded back.
TEST(GpuAdamW, Bf16WithoutMaster) {
  ZT_REQUIRE_GPU();
  GpuContext& g = gpu();
  const auto args = adamw_args();
  for (size_t n : {size_t(1), size_t(1001), size_t(1) << 18}) {
    SCOPED_TRACE(tag<bf16>("adamw") + " no master, " + shape_str({{"n", (long long)n}}));
    AdamState s = adam_state<bf16>(n, 1200 + uint32_t(n));
    round_to_bf16(s.param);
    Guarded<bf16> d_p(s.param), d_g(s.grad);
    Guarded<float> d_m(s.m), d_v(s.v);
    zt::cuda::adamw_update<bf16>(d_p.p(), nullptr, d_g.p(), d_m.p(), d_v.p(), n, args, 99u, 0, g.stream);
    g.sync();
    Vec rp = to_double(s.param), rm = to_double(s.m), rv = to_double(s.v);
    zt::cpu::adamw_update<double>(rp.data(), to_double(s.grad).data(), rm.data(), rv.data(), n, args);
    expect_close("adamw.m", d_m.download(), rm, tol_rms(kTolAdam, rm));
    expect_close("adamw.v", d_v.download(), rv, tol_rms(kTolAdam, rv));
    // The GPU's fp32 update is within kTolAdam of the reference, so its two bf16 neighbours are among
    // those of ref * (1 -/+ kTolAdam).
    const std::vector<bf16> praw = d_p.download_raw();
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < n; i++) {
      uint16_t pb;
      std::memcpy(&pb, static_cast<const void*>(&praw[i]), 2);
      const float lo = float(rp[i] * (1.0 - kTolAdam)), hi = float(rp[i] * (1.0 + kTolAdam));
      if (!sr_candidate(lo, pb) && !sr_candidate(hi, pb) && bad++ == 0) first = i;
    }
    EXPECT_EQ(bad, 0u) << "bf16 param not a bf16 neighbour of the updated value; first at [" << first
                       << "]: ref " << rp[first];
    d_p.expect_guards("adamw.param");
  }
}

// =====================================================================================================
// sum of squares (global norm)

template <class T> void check_sum_squares(size_t n, uint32_t seed) {
  SCOPED_TRACE(tag<T>("sum_squares_accumulate") + " " + shape_str({{"n", (long long)n}}));
  GpuContext& g = gpu();
  const VecF x = rand_t<T>(n, seed, -2.0f, 2.0f);
  const float init = 1.25f;
  Guarded<T> d_x(x);
  Guarded<float> d_acc(VecF{init});
  auto scratch = make_scratch(zt::cuda::global_norm_scratch_bytes());
  zt::cuda::sum_squares_accumulate<T>(d_acc.p(), d_x.p(), n, scratch.get(), g.stream);
  g.sync();
  const double ss = zt::cpu::sum_squares<double>(to_double(x).data(), n);
  // fp32 partial sums of positive terms: relative error ~ log2(n) * 2^-24 at worst for a tree,
  // more for long per-thread runs; 1e-5 covers n up to millions.
  const Tol tol{0.0, kTolStat};
  const VecF first = d_acc.download();
  expect_close("sum_squares_accumulate (init + sum)", first, Vec{double(init) + ss}, tol);
  // accumulates: a second call adds the sum again
  zt::cuda::sum_squares_accumulate<T>(d_acc.p(), d_x.p(), n, scratch.get(), g.stream);
  g.sync();
  expect_close("sum_squares_accumulate (twice)", d_acc.download(), Vec{double(init) + 2.0 * ss}, tol);
  d_acc.expect_guards("sum_squares_accumulate.out");
  // deterministic
  d_acc.upload(VecF{init});
  poison(scratch);
  zt::cuda::sum_squares_accumulate<T>(d_acc.p(), d_x.p(), n, scratch.get(), g.stream);
  g.sync();
  expect_bitwise_equal("sum_squares_accumulate (rerun)", Guarded<float>(first).download_raw(), d_acc.download_raw());
}

TYPED_TEST(GpuOps, SumSquares) {
  ZT_REQUIRE_GPU();
  using T = TypeParam;
  check_sum_squares<T>(1, 1300);
  check_sum_squares<T>(7, 1310);
  check_sum_squares<T>(1001, 1320);
  check_sum_squares<T>((size_t(1) << 20) + 3, 1330);
  check_sum_squares<T>(size_t(7) << 20, 1340);
}

}  // namespace
