// What the GPU op tests share (test/gpu/*ops*_gpu_test.cpp, adamw_gpu_test.cpp): every zt::cuda op,
// forward and backward, for T = float (the strict fp32 parity mode) and T = bf16, against the CPU
// reference op in double (zt::cpu::...<double>) on the same inputs. Helpers, poisoning and the
// tolerance scheme: gpu_test_util.h. Without a GPU every test is SKIPPED.
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
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "gpu_test_util.h"

namespace gpu_ops_test {

using namespace zt::gpu_test;
using zt::bf16;
using Vec = std::vector<double>;
using VecF = std::vector<float>;

inline std::string shape_str(std::initializer_list<std::pair<const char*, long long>> dims) {
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


// One typed suite, GpuOps/fp32 and GpuOps/bf16, over every op file: the fixture is this one class
// (gtest refuses a suite whose tests use different fixture classes).
template <class T> class GpuOps : public ::testing::Test {};
struct TypeNames {
  template <class T> static std::string GetName(int) { return DType<T>::name; }
};
using OpTypes = ::testing::Types<float, bf16>;

}  // namespace gpu_ops_test
