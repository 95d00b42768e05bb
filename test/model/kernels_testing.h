// What the CPU kernel tests share (test/model/kernels*_test.cpp, optimizer_kernels_test.cpp):
// random inputs, error measures, the finite-difference gradient check, naive double references.
#pragma once
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

namespace kernels_test {

using namespace zt::cpu;
using Vec = std::vector<double>;
using VecF = std::vector<float>;

// ---------------------------------------------------------------------------------------------
// helpers

inline Vec random_vec(size_t n, std::mt19937_64& rng, double lo = -1.0, double hi = 1.0) {
  std::uniform_real_distribution<double> u(lo, hi);
  Vec v(n);
  for (double& x : v) x = u(rng);
  return v;
}

inline std::vector<int> random_ints(size_t n, int hi, std::mt19937_64& rng) {
  std::uniform_int_distribution<int> u(0, hi - 1);
  std::vector<int> v(n);
  for (int& x : v) x = u(rng);
  return v;
}

inline VecF to_float(const Vec& v) { return VecF(v.begin(), v.end()); }

inline double dot(const Vec& a, const Vec& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); i++) s += a[i] * b[i];
  return s;
}

inline double max_abs(const Vec& v) {
  double m = 0;
  for (double x : v) m = std::max(m, std::fabs(x));
  return m;
}

inline Vec minus(const Vec& a, const Vec& b) {
  Vec d(a.size());
  for (size_t i = 0; i < a.size(); i++) d[i] = a[i] - b[i];
  return d;
}

// max_i |a_i - b_i| / max_i |b_i|
template <class A>
inline double rel_err(const A& a, const Vec& b) {
  double num = 0;
  for (size_t i = 0; i < b.size(); i++) num = std::max(num, std::fabs(double(a[i]) - b[i]));
  return num / std::max(max_abs(b), 1e-300);
}

// Checks an analytic gradient of loss() with respect to x against central differences, element by
// element. Error measure: max_i |fd_i - analytic_i| / max_i |analytic_i|.
inline void expect_grad_fd(const std::string& what, Vec& x, const Vec& analytic, const std::function<double()>& loss,
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
inline void with_threads(int n, F&& f) {
  const int before = omp_get_max_threads();
  omp_set_num_threads(n);
  f();
  omp_set_num_threads(before);
}

// ---------------------------------------------------------------------------------------------
// naive double references

inline void naive_attention(Vec& out, Vec& lse, const Vec& qkv, int B, int Tn, int C, int NH) {
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

inline double naive_gelu(double x) {
  return 0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
}

// An attention shape (the parameter of the Attention and AttentionFloat suites).
struct AttnShape {
  int B, Tn, C, NH;
};
inline void PrintTo(const AttnShape& s, std::ostream* os) {
  *os << "B=" << s.B << " T=" << s.Tn << " C=" << s.C << " NH=" << s.NH;
}

}  // namespace kernels_test
