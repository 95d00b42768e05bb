// The GPU optimizer ops against the CPU ops (ops_testing.h): AdamW in fp32 and bf16 (stochastic
// rounding, with and without master weights, the host variant), the sum of squares of the global norm.
#include "ops_testing.h"
#include "kernels/adamw.h"
#include "kernels/global_norm.h"

namespace {

using namespace gpu_ops_test;
TYPED_TEST_SUITE(GpuOps, OpTypes, TypeNames);

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
