// The CPU backend's bf16 products (src/kernels/matmul_bf16.h, backend "cpu-bf16") against an
// arithmetic oracle: the same products in double of the operands rounded to bf16. bf16 x bf16 is
// exact in fp32, so only the fp32 accumulation differs from the oracle (~1e-6 relative); the
// rounding itself moves the result by ~1e-3 (checked too, so that rounding cannot silently vanish).
// Skipped where this build has no oneDNN or this CPU no AVX512-BF16.
#include <cmath>
#include <cstdint>
#include <limits>

#include "backend/ops_cpu.h"
#include "kernels/matmul_bf16.h"
#include "kernels_testing.h"

namespace {

using namespace kernels_test;
namespace bf = zt::cpu::bf16;

// What the products see of v: each element rounded to bf16, as double.
Vec rounded(const Vec& v) {
  Vec r(v.size());
  for (size_t i = 0; i < v.size(); ++i) r[i] = bf::bf16_to_float(bf::round_to_bf16(float(v[i])));
  return r;
}

// A bound workspace for products up to N x max(C, OC), OC x C; unbound when the test ends.
struct Workspace {
  std::vector<uint16_t> mem;
  Workspace(size_t N, size_t C, size_t OC) : mem(N * std::max(C, OC) + OC * C + N * C) {
    bf::bind_workspace(mem.data(), mem.size() * sizeof(uint16_t));
  }
  ~Workspace() { bf::bind_workspace(nullptr, 0); }
};

bool runs_here() { return bf::built() && bf::cpu_supported(); }

TEST(Bf16Rounding, NearestEvenAndSpecials) {
  auto r = [](float f) { return bf::bf16_to_float(bf::round_to_bf16(f)); };
  EXPECT_EQ(r(1.0f), 1.0f);
  EXPECT_EQ(r(1.0f + 0x1p-8f), 1.0f);                  // a tie: to the even neighbour (1.0)
  EXPECT_EQ(r(1.0f + 3 * 0x1p-8f), 1.0f + 0x1p-6f);    // a tie: to the even neighbour (1 + 2^-6)
  EXPECT_EQ(r(1.0f + 0x1p-8f + 0x1p-20f), 1.0f + 0x1p-7f);  // above the tie: up
  EXPECT_EQ(r(-2.5f), -2.5f);
  EXPECT_EQ(r(std::numeric_limits<float>::infinity()), std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(r(std::numeric_limits<float>::quiet_NaN())));
  EXPECT_TRUE(std::isnan(r(-std::numeric_limits<float>::quiet_NaN())));
  EXPECT_EQ(r(std::numeric_limits<float>::max()), std::numeric_limits<float>::infinity());  // overflows as RNE does
}

TEST(Bf16Matmul, ForwardAndBackwardAgainstRoundedOperandsInDouble) {
  if (!runs_here()) GTEST_SKIP() << "no oneDNN in this build or no AVX512-BF16 on this CPU";
  std::mt19937_64 rng(57);
  const int N = 37, C = 65, OC = 130, ld = 141;  // odd sizes; ld: a wider output (the LM head's chunks)
  const Vec x = random_vec(size_t(N) * C, rng), w = random_vec(size_t(OC) * C, rng), b = random_vec(OC, rng),
            dy = random_vec(size_t(N) * ld, rng), dx0 = random_vec(size_t(N) * C, rng),
            dw0 = random_vec(size_t(OC) * C, rng), db0 = random_vec(OC, rng);
  const Vec xr = rounded(x), wr = rounded(w), dyr = rounded(dy);
  Workspace ws(N, C, OC);

  // Forward with the bias, then bias-free into the wider output.
  Vec out(size_t(N) * OC), out_ld(size_t(N) * ld, 0.0), out_plain(size_t(N) * OC);
  zt::cpu::matmul_forward(out.data(), xr.data(), wr.data(), b.data(), N, C, OC);
  zt::cpu::matmul_forward(out_ld.data(), xr.data(), wr.data(), (const double*)nullptr, N, C, OC, ld);
  zt::cpu::matmul_forward(out_plain.data(), x.data(), w.data(), b.data(), N, C, OC);
  VecF outf(out.size()), outf_ld(out_ld.size(), 0.0f);
  bf::matmul_forward(outf.data(), to_float(x).data(), to_float(w).data(), to_float(b).data(), N, C, OC);
  bf::matmul_forward(outf_ld.data(), to_float(x).data(), to_float(w).data(), nullptr, N, C, OC, ld);
  EXPECT_LT(rel_err(outf, out), 1e-5);
  EXPECT_LT(rel_err(outf_ld, out_ld), 1e-5);
  EXPECT_GT(rel_err(outf, out_plain), 1e-4) << "the operands were not rounded to bf16";

  // Backward from the wider dout: dinp accumulated and overwritten, dweight and dbias accumulated.
  for (const zt::Dinp mode : {zt::Dinp::accumulate, zt::Dinp::overwrite}) {
    SCOPED_TRACE(mode == zt::Dinp::accumulate ? "accumulate" : "overwrite");
    Vec dx = dx0, dw = dw0;
    zt::cpu::matmul_backward(dx.data(), dw.data(), (double*)nullptr, dyr.data(), xr.data(), wr.data(), N, C, OC, ld,
                             mode);
    VecF dxf = to_float(dx0), dwf = to_float(dw0);
    bf::matmul_backward(dxf.data(), dwf.data(), nullptr, to_float(dy).data(), to_float(x).data(), to_float(w).data(), N,
                        C, OC, ld, mode);
    EXPECT_LT(rel_err(dxf, dx), 1e-5);
    EXPECT_LT(rel_err(dwf, dw), 1e-5);
  }
  // The bias gradient: fp32 column sums of the unrounded dout, as on fp32.
  const Vec dy_dense = random_vec(size_t(N) * OC, rng);
  Vec db = db0;
  zt::cpu::matmul_backward((double*)nullptr, (double*)nullptr, db.data(), dy_dense.data(), x.data(), w.data(), N, C, OC);
  VecF dbf = to_float(db0);
  bf::matmul_backward(nullptr, nullptr, dbf.data(), to_float(dy_dense).data(), to_float(x).data(), to_float(w).data(),
                      N, C, OC);
  EXPECT_LT(rel_err(dbf, db), 1e-6);
}

// The op table routes its products to bf16 exactly while a workspace is bound, and runs the same
// bits twice.
TEST(Bf16Matmul, CpuOpsRouteWhileBoundAndRepeatBitForBit) {
  if (!runs_here()) GTEST_SKIP() << "no oneDNN in this build or no AVX512-BF16 on this CPU";
  using Ops = zt::CpuOps<float>;
  std::mt19937_64 rng(58);
  const int N = 64, C = 96, OC = 200;
  const VecF x = to_float(random_vec(size_t(N) * C, rng)), w = to_float(random_vec(size_t(OC) * C, rng));
  VecF fp32(size_t(N) * OC), direct(fp32.size()), routed(fp32.size()), again(fp32.size());
  Ops::matmul_forward(fp32.data(), x.data(), w.data(), nullptr, N, C, OC);  // unbound: OpenBLAS sgemm
  {
    Workspace ws(N, C, OC);
    bf::matmul_forward(direct.data(), x.data(), w.data(), nullptr, N, C, OC);
    Ops::matmul_forward(routed.data(), x.data(), w.data(), nullptr, N, C, OC);
    Ops::matmul_forward(again.data(), x.data(), w.data(), nullptr, N, C, OC);
  }
  EXPECT_EQ(routed, direct);
  EXPECT_EQ(again, routed);
  EXPECT_NE(routed, fp32);
  EXPECT_FALSE(bf::active());
}

}  // namespace
