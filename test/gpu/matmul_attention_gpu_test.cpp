// The GPU's GEMMs (cuBLASLt with bias / GELU epilogues, the dbias kernel) and attention against the
// CPU ops in double (ops_testing.h).
#include "ops_testing.h"
#include "kernels/attention.h"
#include "kernels/gelu.h"
#include "kernels/matmul.h"

namespace {

using namespace gpu_ops_test;
TYPED_TEST_SUITE(GpuOps, OpTypes, TypeNames);

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

}  // namespace
