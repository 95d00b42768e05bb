// Helpers for the GPU kernel tests (test/gpu/test_*.cpp, host C++ compiled with ZT_HAVE_CUDA=1).
//
// The CPU reference ops (zt::cpu, instantiated for double) are the oracle: every CUDA op is run on
// random inputs that are exactly representable in its element type T (bf16 inputs are generated as
// floats and rounded to bf16 first, so the CPU sees exactly the values the GPU sees), and its
// outputs are compared element-wise with |got - ref| <= atol + rtol * |ref|.
//
//   * No GPU (no driver, or no device): every test calls ZT_REQUIRE_GPU() first and reports itself
//     SKIPPED, never passed; with ZT_EXPECT_GPU=1 in the environment it FAILS instead.
//   * Overwrite-semantics outputs are poisoned (all bytes 0xFF: NaN in fp32 and bf16) before each
//     run, so an element the kernel forgets to write shows up as NaN, and NaN never passes.
//     Accumulate-semantics outputs (+=) start from the same random values on the GPU and the CPU.
//   * Scratch buffers are poisoned too: a kernel that reads scratch it has not written fails.
//
// Tolerances (one place; the tests pick a `factor` per output and say why where it is not 1):
//
//   atol = base * factor * rms(ref)      rtol = base * factor
//
//   base = kTolF32  = 1e-5   fp32 outputs (T = float, the parity mode: strict fp32, no TF32). The
//                            GPU differs from the double reference by fp32 rounding (2^-24 relative
//                            per operation) and by summation order; for the reductions here (up to
//                            ~3k terms, tree or blocked sums) that stays well below 1e-5 of the
//                            magnitude of the summed terms.
//   base = kTolBF16 = 2^-7   bf16 outputs. A bf16 result computed in fp32 and rounded once (round to
//                            nearest) is within 2^-8 relative of the exact value; 2^-7 allows that
//                            rounding plus the fp32 error with a 2x margin. Accumulated outputs
//                            (bf16 += fp32 delta) also round once.
//   base = kTolStat = 1e-5   fp32 statistics (mean, rstd, lse, losses) computed in fp32 from inputs
//                            that are exact in T: the same accuracy as fp32 mode whatever T is.
//   base = kTolStatBF16 = 1e-3  bf16 mode, fp32 statistics that may legitimately depend on a bf16
//                            rounding inside the op. residual_layernorm: mean / rstd may come from
//                            the stored (rounded) bf16 residual; C independent roundings of <= 2^-8
//                            move them by ~2^-8 / sqrt(3 C) relative: 3e-4 at C = 64, 8e-5 at 768.
//                            attention lse: fp32-accurate when q.k is accumulated in fp32 from the
//                            exact bf16 inputs; 1e-3 leaves room for a rounded intermediate (e.g. a
//                            pre-scaled Q) without letting a wrong softmax through.
//
//   atol is scaled by the rms of the reference output, not by |ref| of each element: results of sums
//   with cancellation (gradients, pre-activations near 0) carry an absolute error proportional to
//   the magnitude of the terms, which the rms of the output tracks (tol_for). For accumulated
//   outputs the scale is the rms of what the op added, ref - init (tol_acc), so that random initial
//   values cannot hide an error in a small gradient. Where the output's rms is not the magnitude of
//   its terms (a mean of near-zero-mean rows, gelu(x) -> 0 for x << 0), the test passes an explicit
//   scale (tol_scale). Every scale is floored at 1e-30.
//
// Guarded<T> wraps an allocation with 0xFF guard bytes (and optionally an offset, as tensors inside
// an arena): expect_guards() catches writes outside the buffer.
//
// ZT_GPU_TEST_VERBOSE=1 in the environment prints, for every comparison, the worst element's error
// as a fraction of its bound: the numbers to look at before tightening or loosening a factor.
#pragma once

#if !ZT_HAVE_CUDA
#error "gpu_test_util.h needs the CUDA backend: compile with -DZT_HAVE_CUDA=1"
#endif

#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include "kernels/matmul.h"  // zt::cuda::Blas
#include "runtime/cuda_check.h"

namespace zt::gpu_test {

// ---- is there a GPU? ------------------------------------------------------------------------------
// cudaGetDeviceCount fails without a driver (cudaErrorInsufficientDriver / cudaErrorNoDevice); the
// error is cleared so that it cannot surface in a later check. Cached: asked once per process.
// Empty when there is a device, else why not (the CUDA error, or "0 devices").
inline const std::string& gpu_missing_reason() {
  static const std::string why = [] {
    int n = 0;
    const cudaError_t rc = cudaGetDeviceCount(&n);
    if (rc != cudaSuccess) {
      (void)cudaGetLastError();
      return std::string("cudaGetDeviceCount: ") + cudaGetErrorName(rc) + ": " + cudaGetErrorString(rc);
    }
    return n > 0 ? std::string() : std::string("cudaGetDeviceCount: 0 devices");
  }();
  return why;
}
inline bool have_gpu() { return gpu_missing_reason().empty(); }

// ZT_EXPECT_GPU=1: this machine is meant to have a working GPU (scripts/device/run.sh sets it), so
// a missing or broken one fails every GPU test instead of skipping it; otherwise a bad driver would
// turn the whole GPU suite into "Skipped" and `make test-gpu` would still exit 0. Unset, empty or
// "0": skip, as on machines without a GPU.
inline bool expect_gpu() {
  const char* e = std::getenv("ZT_EXPECT_GPU");
  return e != nullptr && *e != '\0' && std::string(e) != "0";
}

// True when the "GPU" is the CPU emulator of test/emu (zt_gpu_tests_emu, label emu): the tests run
// unchanged, except for the few shapes that would take minutes there (each says so where it skips).
inline bool emulated() {
  static const bool emu = [] {
    if (!have_gpu()) return false;
    cudaDeviceProp p{};
    return cudaGetDeviceProperties(&p, 0) == cudaSuccess && std::strncmp(p.name, "zt-emu", 6) == 0;
  }();
  return emu;
}

}  // namespace zt::gpu_test

// First statement of every GPU test (in the TEST body itself: GTEST_SKIP and FAIL return from the
// function).
#define ZT_REQUIRE_GPU()                                                                              \
  do {                                                                                                \
    if (!::zt::gpu_test::have_gpu()) {                                                                \
      if (::zt::gpu_test::expect_gpu())                                                               \
        FAIL() << "no usable CUDA device (" << ::zt::gpu_test::gpu_missing_reason()                   \
               << ") but ZT_EXPECT_GPU is set: this machine should have one";                         \
      GTEST_SKIP() << "no CUDA device (" << ::zt::gpu_test::gpu_missing_reason() << ")";              \
    }                                                                                                 \
  } while (0)

namespace zt::gpu_test {

// ---- tolerances -----------------------------------------------------------------------------------
constexpr double kTolF32 = 1e-5;
constexpr double kTolBF16 = 0x1p-7;
constexpr double kTolStat = 1e-5;
constexpr double kTolStatBF16 = 1e-3;

// ---- element types --------------------------------------------------------------------------------
template <class T> struct DType;
template <> struct DType<float> {
  static constexpr const char* name = "fp32";
  static constexpr double tol = kTolF32;
  static constexpr double stat_tol_rounded = kTolStat;  // no intermediate rounding worth the name
  static constexpr bool is_bf16 = false;
};
template <> struct DType<__nv_bfloat16> {
  static constexpr const char* name = "bf16";
  static constexpr double tol = kTolBF16;
  static constexpr double stat_tol_rounded = kTolStatBF16;
  static constexpr bool is_bf16 = true;
};

// ---- bf16 <-> float on the host, bit-exact (round to nearest even, NaN kept NaN) --------------------
inline uint16_t f32_to_bf16_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40u);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}
inline float bf16_bits_to_f32(uint16_t b) {
  const uint32_t u = uint32_t(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline float round_bf16(float x) { return bf16_bits_to_f32(f32_to_bf16_bits(x)); }
inline uint32_t f32_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// Rounds every element to the nearest bf16 (the values a bf16 buffer will hold).
inline void round_to_bf16(std::vector<float>& v) {
  for (float& x : v) x = round_bf16(x);
}
// Makes v exactly representable in T: bf16 rounding for bf16, nothing for float.
template <class T> void make_representable(std::vector<float>& v) {
  if constexpr (DType<T>::is_bf16) round_to_bf16(v);
}

static_assert(sizeof(__nv_bfloat16) == 2, "bf16 is 2 bytes");
template <class T> inline T to_dev(float x) {
  if constexpr (std::is_same_v<T, float>) {
    return x;
  } else {
    static_assert(std::is_same_v<T, __nv_bfloat16>, "T is float or bf16");
    const uint16_t b = f32_to_bf16_bits(x);
    T r;
    std::memcpy(static_cast<void*>(&r), &b, 2);
    return r;
  }
}
template <class T> inline float from_dev(const T& x) {
  if constexpr (std::is_same_v<T, float>) {
    return x;
  } else {
    static_assert(std::is_same_v<T, __nv_bfloat16>, "T is float or bf16");
    uint16_t b;
    std::memcpy(&b, static_cast<const void*>(&x), 2);
    return bf16_bits_to_f32(b);
  }
}

// ---- device memory ----------------------------------------------------------------------------------
// Synchronous copies (cudaMemcpy on the legacy default stream, which waits for the blocking stream
// of GpuContext): call GpuContext::sync() after launches anyway, to check for errors there.
template <class T> class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t n) : n_(n) {
    if (n_ > 0) ZT_CHECK_CUDA(cudaMalloc(reinterpret_cast<void**>(&p_), n_ * sizeof(T)));
  }
  // With values: allocates v.size() elements and uploads them.
  explicit DeviceBuffer(const std::vector<float>& v) : DeviceBuffer(v.size()) { upload(v); }
  ~DeviceBuffer() {
    if (p_) (void)cudaFree(p_);
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& o) noexcept : p_(o.p_), n_(o.n_) {
    o.p_ = nullptr;
    o.n_ = 0;
  }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    if (this != &o) {
      if (p_) (void)cudaFree(p_);
      p_ = o.p_;
      n_ = o.n_;
      o.p_ = nullptr;
      o.n_ = 0;
    }
    return *this;
  }

  T* get() const { return p_; }
  size_t size() const { return n_; }
  size_t bytes() const { return n_ * sizeof(T); }

  // float values -> T (bf16: round to nearest even; pass representable values to avoid surprises).
  void upload(const std::vector<float>& v) {
    static_assert(std::is_same_v<T, float> || std::is_same_v<T, __nv_bfloat16>, "upload(float) needs float/bf16");
    ZT_REQUIRE(v.size() == n_, "DeviceBuffer::upload: " << v.size() << " values for " << n_ << " elements");
    std::vector<T> h(n_);
    for (size_t i = 0; i < n_; i++) h[i] = to_dev<T>(v[i]);
    upload_raw(h);
  }
  std::vector<float> download() const {
    static_assert(std::is_same_v<T, float> || std::is_same_v<T, __nv_bfloat16>, "download() needs float/bf16");
    const std::vector<T> h = download_raw();
    std::vector<float> v(n_);
    for (size_t i = 0; i < n_; i++) v[i] = from_dev<T>(h[i]);
    return v;
  }
  void upload_raw(const std::vector<T>& h) {
    ZT_REQUIRE(h.size() == n_, "DeviceBuffer::upload_raw: " << h.size() << " values for " << n_ << " elements");
    if (n_) ZT_CHECK_CUDA(cudaMemcpy(p_, h.data(), bytes(), cudaMemcpyHostToDevice));
  }
  std::vector<T> download_raw() const {
    std::vector<T> h(n_);
    if (n_) ZT_CHECK_CUDA(cudaMemcpy(h.data(), p_, bytes(), cudaMemcpyDeviceToHost));
    return h;
  }
  // The raw bytes (for bit-identity checks).
  std::vector<unsigned char> download_bytes() const {
    std::vector<unsigned char> h(bytes());
    if (n_) ZT_CHECK_CUDA(cudaMemcpy(h.data(), p_, bytes(), cudaMemcpyDeviceToHost));
    return h;
  }

 private:
  T* p_ = nullptr;
  size_t n_ = 0;
};

// All bytes 0xFF: a NaN in fp32 (0xFFFFFFFF) and in bf16 (0xFFFF); -1 in int.
template <class T> void poison(DeviceBuffer<T>& b) {
  if (b.size()) ZT_CHECK_CUDA(cudaMemset(b.get(), 0xFF, b.bytes()));
}

// Scratch memory of a given size in bytes, poisoned.
inline DeviceBuffer<unsigned char> make_scratch(size_t bytes) {
  DeviceBuffer<unsigned char> s(bytes);
  poison(s);
  return s;
}

// A buffer with poisoned guard regions around the n elements the kernel sees: `front` elements
// before (a pointer offset inside an allocation, as activations sit inside a larger arena) and 64
// bytes after. expect_guards() fails if a kernel wrote outside [p(), p() + n).
template <class T> class Guarded {
 public:
  static constexpr size_t kBackBytes = 64;
  explicit Guarded(size_t n, size_t front = 0)
      : n_(n), front_(front), back_((kBackBytes + sizeof(T) - 1) / sizeof(T)), mem_(front + n + back_) {
    ::zt::gpu_test::poison(mem_);
  }
  explicit Guarded(const std::vector<float>& v, size_t front = 0) : Guarded(v.size(), front) { upload(v); }

  T* p() const { return mem_.get() + front_; }
  size_t size() const { return n_; }

  void upload(const std::vector<float>& v) {
    ZT_REQUIRE(v.size() == n_, "Guarded::upload: " << v.size() << " values for " << n_ << " elements");
    std::vector<T> h(n_);
    for (size_t i = 0; i < n_; i++) h[i] = to_dev<T>(v[i]);
    if (n_) ZT_CHECK_CUDA(cudaMemcpy(p(), h.data(), n_ * sizeof(T), cudaMemcpyHostToDevice));
  }
  std::vector<T> download_raw() const {
    std::vector<T> h(n_);
    if (n_) ZT_CHECK_CUDA(cudaMemcpy(h.data(), p(), n_ * sizeof(T), cudaMemcpyDeviceToHost));
    return h;
  }
  std::vector<float> download() const {
    const std::vector<T> h = download_raw();
    std::vector<float> v(n_);
    for (size_t i = 0; i < n_; i++) v[i] = from_dev<T>(h[i]);
    return v;
  }
  // Poisons the elements (and the guards, which must be poisoned anyway).
  void poison() { ::zt::gpu_test::poison(mem_); }

  void expect_guards(const std::string& name) const {
    const std::vector<unsigned char> all = mem_.download_bytes();
    const size_t fb = front_ * sizeof(T), mb = n_ * sizeof(T);
    size_t bad_front = 0, bad_back = 0;
    for (size_t i = 0; i < fb; i++) bad_front += all[i] != 0xFF;
    for (size_t i = fb + mb; i < all.size(); i++) bad_back += all[i] != 0xFF;
    if (bad_front || bad_back)
      ADD_FAILURE() << name << ": kernel wrote outside its buffer: " << bad_front << " bytes changed in the "
                    << fb << " bytes before it, " << bad_back << " in the " << (all.size() - fb - mb) << " after it";
  }

 private:
  size_t n_, front_, back_;
  DeviceBuffer<T> mem_;
};

// ---- stream, cuBLASLt handle, workspace -------------------------------------------------------------
struct GpuContext {
  cudaStream_t stream = nullptr;
  cublasLtHandle_t lt = nullptr;
  void* workspace = nullptr;
  size_t workspace_bytes = size_t(32) << 20;  // 32 MiB

  GpuContext() {
    ZT_CHECK_CUDA(cudaStreamCreate(&stream));
    ZT_CHECK_CUBLAS(cublasLtCreate(&lt));
    ZT_CHECK_CUDA(cudaMalloc(&workspace, workspace_bytes));
  }
  GpuContext(const GpuContext&) = delete;
  GpuContext& operator=(const GpuContext&) = delete;

  zt::cuda::Blas blas() const {
    zt::cuda::Blas b;
    b.lt = lt;
    b.workspace = workspace;
    b.workspace_bytes = workspace_bytes;
    b.stream = stream;
    return b;
  }
  // Waits for the stream and turns any launch or asynchronous error into a thrown zt::Error
  // (gtest reports an exception escaping a test as a failure).
  void sync() const {
    ZT_CHECK_CUDA(cudaStreamSynchronize(stream));
    ZT_CHECK_CUDA(cudaGetLastError());
  }
};
// Created on first use (after ZT_REQUIRE_GPU), never destroyed: destroying it from a static
// destructor could run after the CUDA runtime has shut down.
inline GpuContext& gpu() {
  static GpuContext* ctx = new GpuContext();
  return *ctx;
}

// ---- random inputs (fixed seeds per test) -------------------------------------------------------------
inline std::vector<float> random_uniform(size_t n, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = u(rng);
  return v;
}
inline std::vector<float> random_normal(size_t n, uint32_t seed, float mean = 0.0f, float stddev = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(mean, stddev);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}
inline std::vector<int> random_ints(size_t n, int hi, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> u(0, hi - 1);
  std::vector<int> v(n);
  for (int& x : v) x = u(rng);
  return v;
}
// Uniform values exactly representable in T.
template <class T> std::vector<float> rand_t(size_t n, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::vector<float> v = random_uniform(n, seed, lo, hi);
  make_representable<T>(v);
  return v;
}
template <class T> std::vector<float> randn_t(size_t n, uint32_t seed, float mean = 0.0f, float stddev = 1.0f) {
  std::vector<float> v = random_normal(n, seed, mean, stddev);
  make_representable<T>(v);
  return v;
}

inline std::vector<double> to_double(const std::vector<float>& v) { return std::vector<double>(v.begin(), v.end()); }
// Rounds a double vector to float (e.g. reference statistics handed to a GPU backward as fp32).
inline std::vector<float> to_float(const std::vector<double>& v) { return std::vector<float>(v.begin(), v.end()); }

// ---- comparisons --------------------------------------------------------------------------------------
struct Tol {
  double atol = 0, rtol = 0;
};

inline double rms(const std::vector<double>& v) {
  if (v.empty()) return 0.0;
  double s = 0;
  for (double x : v) s += x * x;
  return std::sqrt(s / double(v.size()));
}
// atol = base * factor * rms(ref), rtol = base * factor (see the top of this file).
inline Tol tol_rms(double base, const std::vector<double>& ref, double factor = 1.0) {
  return Tol{base * factor * std::max(rms(ref), 1e-30), base * factor};
}
// atol = base * factor * scale for an explicit magnitude `scale` (when the rms of the output is not
// the magnitude of the terms that make it: a mean of near-zero rows, gelu(x) -> 0 for x << 0).
inline Tol tol_scale(double base, double scale, double factor = 1.0) {
  return Tol{base * factor * std::max(scale, 1e-30), base * factor};
}
inline double rms(const std::vector<float>& v) {
  if (v.empty()) return 0.0;
  double s = 0;
  for (float x : v) s += double(x) * double(x);
  return std::sqrt(s / double(v.size()));
}
// The tolerance for a T-typed output.
template <class T> Tol tol_for(const std::vector<double>& ref, double factor = 1.0) {
  return tol_rms(DType<T>::tol, ref, factor);
}
// The same for an accumulated (+=) output: atol is scaled by the rms of what the op added
// (ref - init), not by the random initial values, which could otherwise hide errors in a small delta.
// The rounding of the sum itself is relative to |ref| and covered by rtol.
inline Tol tol_acc_base(double base, const std::vector<double>& ref, const std::vector<float>& init, double factor) {
  std::vector<double> delta(ref.size());
  for (size_t i = 0; i < ref.size() && i < init.size(); i++) delta[i] = ref[i] - double(init[i]);
  return tol_rms(base, delta, factor);
}
template <class T> Tol tol_acc(const std::vector<double>& ref, const std::vector<float>& init, double factor = 1.0) {
  return tol_acc_base(DType<T>::tol, ref, init, factor);
}

inline bool verbose() {
  static const bool v = [] {
    const char* e = std::getenv("ZT_GPU_TEST_VERBOSE");
    return e && *e && std::string(e) != "0";
  }();
  return v;
}

// Element-wise |got - ref| <= atol + rtol * |ref|. Fails (ADD_FAILURE, the test goes on) on any
// violation and on any NaN/Inf in got (NaN never passes), reporting the number of violations and the
// worst element (largest error relative to its bound).
inline void expect_close(const std::string& name, const std::vector<float>& got, const std::vector<double>& ref,
                         Tol tol) {
  if (got.size() != ref.size()) {
    ADD_FAILURE() << name << ": size " << got.size() << " vs reference " << ref.size();
    return;
  }
  size_t viol = 0, nonfinite = 0, first_nonfinite = 0, worst = 0;
  double worst_ratio = -1.0;
  for (size_t i = 0; i < got.size(); i++) {
    const double g = got[i], r = ref[i];
    if (!std::isfinite(g)) {
      if (nonfinite++ == 0) first_nonfinite = i;
      continue;
    }
    const double err = std::fabs(g - r), bound = tol.atol + tol.rtol * std::fabs(r);
    // !(err <= bound) also catches a NaN reference (a broken test rather than a broken kernel).
    const bool bad = !(err <= bound);
    double ratio = bound > 0 ? err / bound : (err > 0 ? INFINITY : 0.0);
    if (std::isnan(ratio)) ratio = INFINITY;
    if (bad) viol++;
    if (ratio > worst_ratio) {
      worst_ratio = ratio;
      worst = i;
    }
  }
  if (verbose() && !got.empty())
    std::printf("    [check] %-46s n=%-9zu worst err/bound = %.3g at [%zu] (atol %.3g rtol %.3g)\n", name.c_str(),
                got.size(), worst_ratio, worst, tol.atol, tol.rtol);
  if (viol == 0 && nonfinite == 0) return;
  std::ostringstream os;
  os.precision(9);
  os << name << ": " << viol << " of " << got.size() << " elements out of tolerance (atol " << tol.atol << ", rtol "
     << tol.rtol << ")";
  if (worst_ratio >= 0)
    os << "; worst at [" << worst << "]: got " << got[worst] << ", ref " << ref[worst] << ", |diff| "
       << std::fabs(double(got[worst]) - ref[worst]) << " = " << worst_ratio << " x bound";
  if (nonfinite)
    os << "; " << nonfinite << " NaN/Inf in the result, first at [" << first_nonfinite << "] (ref "
       << ref[first_nonfinite] << ")";
  ADD_FAILURE() << os.str();
}

// Bit-identical results (determinism: the same op on the same inputs, run twice).
template <class T> void expect_bitwise_equal(const std::string& name, const std::vector<T>& a, const std::vector<T>& b) {
  if (a.size() != b.size()) {
    ADD_FAILURE() << name << ": sizes differ, " << a.size() << " vs " << b.size();
    return;
  }
  size_t diff = 0, first = 0;
  for (size_t i = 0; i < a.size(); i++)
    if (std::memcmp(static_cast<const void*>(&a[i]), static_cast<const void*>(&b[i]), sizeof(T)) != 0)
      if (diff++ == 0) first = i;
  if (diff)
    ADD_FAILURE() << name << ": not bit-identical across two runs on the same inputs: " << diff << " of " << a.size()
                  << " elements differ, first at [" << first << "]";
}
// Number of elements that differ bit-wise (for properties that are reported rather than required).
template <class T> size_t count_bitwise_diff(const std::vector<T>& a, const std::vector<T>& b) {
  size_t diff = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); i++)
    if (std::memcmp(static_cast<const void*>(&a[i]), static_cast<const void*>(&b[i]), sizeof(T)) != 0) diff++;
  return diff + (a.size() > b.size() ? a.size() - b.size() : b.size() - a.size());
}

}  // namespace zt::gpu_test
