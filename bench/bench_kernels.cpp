// zt_bench_kernels: device ceilings, then every CUDA kernel timed at GPT-2 124M shapes in bf16.
//
//   zt_bench_kernels [--B 8] [--T 1024] [--reps 20] [--json PATH]
//
// Ceilings, measured on this device (not datasheet numbers):
//   memory bandwidth  cudaMemcpyAsync device-to-device of 1 GiB, counted as read + write (2 GiB moved)
//   bf16 GEMM         zt::cuda::matmul_forward<bf16> (cuBLASLt) at 8192 x 8192 x 8192, 2 M N K flops
// Each kernel: 3 warm-up runs, then `reps` runs each timed with a pair of CUDA events; the median is
// reported. Memory-bound kernels are rated in GB/s against the bandwidth ceiling, counting the
// minimum bytes the kernel must read + write (every input read once, every output written once,
// accumulated outputs read and written; small per-row statistics included). Matmuls and attention
// are rated in TFLOP/s against the GEMM ceiling: matmul forward 2 N C OC, backward 4 N C OC (dinp +
// dweight); causal attention forward 4 B NH T^2 hs / 2, backward 2.5x the forward.
//
// Exit codes: 0 done, 77 no CUDA device ("no CUDA device: skipped", the automake/ctest skip code),
// 1 a failure (message on stderr), 2 bad arguments.
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <fstream>
#include <functional>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "kernels/adamw.h"
#include "kernels/attention.h"
#include "kernels/encoder.h"
#include "kernels/gelu.h"
#include "kernels/global_norm.h"
#include "kernels/layernorm.h"
#include "kernels/matmul.h"
#include "kernels/residual.h"
#include "kernels/softmax_xent.h"
#include "runtime/cuda_check.h"

namespace {

using zt::bf16;

bool have_gpu() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return n > 0;
}

// ---- device memory ---------------------------------------------------------------------------------
template <class T> class Dev {
 public:
  explicit Dev(size_t n) : n_(n) {
    if (n_) ZT_CHECK_CUDA(cudaMalloc(reinterpret_cast<void**>(&p_), n_ * sizeof(T)));
  }
  ~Dev() {
    if (p_) (void)cudaFree(p_);
  }
  Dev(const Dev&) = delete;
  Dev& operator=(const Dev&) = delete;
  T* get() const { return p_; }
  size_t size() const { return n_; }
  size_t bytes() const { return n_ * sizeof(T); }

 private:
  T* p_ = nullptr;
  size_t n_ = 0;
};

uint16_t bf16_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}

// Fills a device buffer with uniform values in [lo, hi): a random host block of up to 4M elements,
// copied over the buffer as many times as needed (the values only need to be realistic, not unique).
template <class T> void fill(const Dev<T>& d, float lo, float hi, uint32_t seed) {
  const size_t block = std::min(d.size(), size_t(1) << 22);
  if (!block) return;
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<T> h(block);
  for (T& x : h) {
    const float f = u(rng);
    if constexpr (std::is_same_v<T, float>) {
      x = f;
    } else {
      const uint16_t b = bf16_bits(f);
      std::memcpy(static_cast<void*>(&x), &b, 2);
    }
  }
  for (size_t off = 0; off < d.size(); off += block)
    ZT_CHECK_CUDA(cudaMemcpy(d.get() + off, h.data(), std::min(block, d.size() - off) * sizeof(T), cudaMemcpyHostToDevice));
}
void fill_ints(const Dev<int>& d, const std::vector<int>& v) {
  ZT_CHECK_CUDA(cudaMemcpy(d.get(), v.data(), v.size() * sizeof(int), cudaMemcpyHostToDevice));
}

// ---- timing ------------------------------------------------------------------------------------------
struct Timer {
  cudaStream_t stream;
  int reps;
  cudaEvent_t start = nullptr, stop = nullptr;
  Timer(cudaStream_t s, int r) : stream(s), reps(r) {
    ZT_CHECK_CUDA(cudaEventCreate(&start));
    ZT_CHECK_CUDA(cudaEventCreate(&stop));
  }
  ~Timer() {
    (void)cudaEventDestroy(start);
    (void)cudaEventDestroy(stop);
  }
  // Median milliseconds of `reps` timed runs after 3 warm-up runs.
  double median_ms(const std::function<void()>& f) const {
    for (int i = 0; i < 3; i++) f();
    ZT_CHECK_CUDA(cudaStreamSynchronize(stream));
    ZT_CHECK_CUDA(cudaGetLastError());
    std::vector<float> t(reps);
    for (int i = 0; i < reps; i++) {
      ZT_CHECK_CUDA(cudaEventRecord(start, stream));
      f();
      ZT_CHECK_CUDA(cudaEventRecord(stop, stream));
      ZT_CHECK_CUDA(cudaEventSynchronize(stop));
      ZT_CHECK_CUDA(cudaEventElapsedTime(&t[i], start, stop));
    }
    ZT_CHECK_CUDA(cudaGetLastError());
    std::sort(t.begin(), t.end());
    return reps % 2 ? t[reps / 2] : 0.5 * (double(t[reps / 2 - 1]) + double(t[reps / 2]));
  }
};

struct Row {
  std::string kernel;
  double ms = NAN;
  double bytes = 0;  // > 0: memory-bound row (GB/s)
  double flops = 0;  // > 0: compute row (TFLOP/s)
  double rate = NAN, pct = NAN;
  std::string error;
};

struct Args {
  int B = 8, T = 1024, reps = 20;
  std::string json;
};

void usage(const char* prog) {
  std::fprintf(stderr, "usage: %s [--B N] [--T N] [--reps N] [--json PATH]\n", prog);
}

// Returns false on bad arguments. Accepts "--B 8" and "--B=8".
bool parse(int argc, char** argv, Args& a) {
  for (int i = 1; i < argc; i++) {
    std::string k = argv[i], v;
    const size_t eq = k.find('=');
    if (k == "--help" || k == "-h") return false;
    if (eq != std::string::npos) {
      v = k.substr(eq + 1);
      k = k.substr(0, eq);
    } else if (i + 1 < argc) {
      v = argv[++i];
    } else {
      std::fprintf(stderr, "%s needs a value\n", k.c_str());
      return false;
    }
    auto to_int = [&](int& dst) {
      char* end = nullptr;
      const long x = std::strtol(v.c_str(), &end, 10);
      if (v.empty() || *end || x <= 0 || x > (1 << 20)) {
        std::fprintf(stderr, "%s: expected a positive integer, got '%s'\n", k.c_str(), v.c_str());
        return false;
      }
      dst = int(x);
      return true;
    };
    if (k == "--B") {
      if (!to_int(a.B)) return false;
    } else if (k == "--T") {
      if (!to_int(a.T)) return false;
    } else if (k == "--reps") {
      if (!to_int(a.reps)) return false;
    } else if (k == "--json") {
      a.json = v;
    } else {
      std::fprintf(stderr, "unknown option %s\n", k.c_str());
      return false;
    }
  }
  return true;
}

std::string json_escape(const std::string& s) {
  std::string r;
  for (char c : s) {
    if (c == '"' || c == '\\') r += '\\', r += c;
    else if (c == '\n') r += "\\n";
    else if (static_cast<unsigned char>(c) < 0x20) r += ' ';
    else r += c;
  }
  return r;
}
std::string json_num(double x) {
  if (!std::isfinite(x)) return "null";
  char b[64];
  std::snprintf(b, sizeof b, "%.6g", x);
  return b;
}

int run(const Args& a) {
  constexpr int C = 768, NH = 12, V = 50257, Vp = 50304, L = 12, maxT = 1024;
  const int B = a.B, T = a.T, N = B * T, hs = C / NH;
  const size_t NC = size_t(N) * C, E = sizeof(bf16);
  if (T > maxT) std::fprintf(stderr, "note: T = %d is beyond GPT-2's context of %d\n", T, maxT);

  int dev = 0;
  ZT_CHECK_CUDA(cudaGetDevice(&dev));
  cudaDeviceProp prop;
  ZT_CHECK_CUDA(cudaGetDeviceProperties(&prop, dev));

  cudaStream_t stream;
  ZT_CHECK_CUDA(cudaStreamCreate(&stream));
  cublasLtHandle_t lt;
  ZT_CHECK_CUBLAS(cublasLtCreate(&lt));
  Dev<unsigned char> workspace(size_t(32) << 20);
  zt::cuda::Blas blas;
  blas.lt = lt;
  blas.workspace = workspace.get();
  blas.workspace_bytes = workspace.bytes();
  blas.stream = stream;
  const Timer timer(stream, a.reps);

  // ---- ceilings ----
  double bw_gbps = NAN, gemm_tflops = NAN;
  {
    const size_t bytes = size_t(1) << 30;
    Dev<unsigned char> src(bytes), dst(bytes);
    ZT_CHECK_CUDA(cudaMemset(src.get(), 1, bytes));
    const double ms = timer.median_ms(
        [&] { ZT_CHECK_CUDA(cudaMemcpyAsync(dst.get(), src.get(), bytes, cudaMemcpyDeviceToDevice, stream)); });
    bw_gbps = 2.0 * double(bytes) / (ms * 1e6);
  }
  {
    const int M = 8192;
    Dev<bf16> A(size_t(M) * M), W(size_t(M) * M), O(size_t(M) * M);
    fill(A, -1.0f, 1.0f, 1);
    fill(W, -0.01f, 0.01f, 2);
    const double ms = timer.median_ms(
        [&] { zt::cuda::matmul_forward<bf16>(O.get(), nullptr, A.get(), W.get(), nullptr, M, M, M, blas); });
    gemm_tflops = 2.0 * double(M) * M * M / (ms * 1e9);
  }

  // ---- GPT-2 124M buffers ----
  std::mt19937 rng(42);
  std::vector<int> tokens(N), targets(N);
  {
    std::uniform_int_distribution<int> u(0, V - 1);
    for (int& t : tokens) t = u(rng);
    for (int& t : targets) t = u(rng);
  }
  const size_t unique_tokens = std::set<int>(tokens.begin(), tokens.end()).size();
  Dev<int> d_tok(N), d_tgt(N);
  fill_ints(d_tok, tokens);
  fill_ints(d_tgt, targets);

  Dev<bf16> wte(size_t(Vp) * C), wpe(size_t(maxT) * C), dwte(size_t(Vp) * C), dwpe(size_t(maxT) * C);
  Dev<bf16> x(NC), x2(NC), res(NC), ln(NC), dx(NC), dln(NC), atty(NC), datty(NC);
  Dev<bf16> lnw(C), lnb(C), dlnw(C), dlnb(C);
  Dev<float> mean(N), rstd(N), losses(N);
  Dev<bf16> qkv(NC * 3), dqkv(NC * 3), fch(NC * 4), fchg(NC * 4), dfch(NC * 4), dfchg(NC * 4);
  Dev<float> lse(size_t(B) * NH * T);
  Dev<bf16> logits(size_t(N) * Vp);
  // the largest weight (fc / fcproj: 4C x C) serves every matmul; the lm head uses wte
  Dev<bf16> w(size_t(4) * C * C), dw(size_t(4) * C * C), bias(Vp), dbias(Vp);
  for (auto* d : {&wte, &wpe, &x, &x2, &ln, &qkv, &fch, &atty, &w, &bias, &logits})
    fill(*d, -1.0f, 1.0f, uint32_t(d->size() % 1000 + 7));
  fill(lnw, 0.5f, 1.5f, 3);
  fill(lnb, -0.5f, 0.5f, 4);
  for (auto* d : {&dwte, &dwpe, &dx, &dln, &datty, &dqkv, &dfch, &dfchg, &dw, &dbias, &dlnw, &dlnb})
    fill(*d, -0.01f, 0.01f, uint32_t(d->size() % 1000 + 11));
  fill(mean, -0.1f, 0.1f, 5);
  fill(rstd, 0.9f, 1.1f, 6);

  const size_t scratch_bytes = std::max({zt::cuda::encoder_backward_scratch_bytes(B, T),
                                         zt::cuda::layernorm_backward_scratch_bytes(N, C),
                                         zt::cuda::matmul_backward_scratch_bytes(N, Vp),
                                         zt::cuda::matmul_backward_scratch_bytes(N, 4 * C),
                                         zt::cuda::attention_backward_scratch_bytes(B, T, C, NH),
                                         zt::cuda::global_norm_scratch_bytes(), size_t(256)});
  Dev<unsigned char> scratch(scratch_bytes);

  std::vector<Row> rows;
  // One row: median time of f, and its rate against the measured ceiling (GB/s for memory-bound
  // kernels, TFLOP/s for matmuls and attention).
  auto add_row = [&](const std::string& name, double bytes, double flops, const std::function<void()>& f) {
    Row r;
    r.kernel = name;
    r.bytes = bytes;
    r.flops = flops;
    try {
      r.ms = timer.median_ms(f);
      r.rate = flops > 0 ? flops / (r.ms * 1e9) : bytes / (r.ms * 1e6);
      r.pct = 100.0 * r.rate / (flops > 0 ? gemm_tflops : bw_gbps);
    } catch (const std::exception& e) {
      r.error = e.what();
    }
    rows.push_back(r);
  };
  auto mem_row = [&](const std::string& name, double bytes, const std::function<void()>& f) { add_row(name, bytes, 0, f); };
  auto flop_row = [&](const std::string& name, double flops, const std::function<void()>& f) { add_row(name, 0, flops, f); };

  // ---- encoder ----
  mem_row("encoder_forward", double(N) * 4 + double(NC) * E * 2 + double(T) * C * E,
          [&] { zt::cuda::encoder_forward<bf16>(x.get(), d_tok.get(), wte.get(), wpe.get(), B, T, C, stream); });
  mem_row("encoder_backward",
          double(NC) * E + double(N) * 4 + 2.0 * double(unique_tokens) * C * E + 2.0 * double(T) * C * E, [&] {
            zt::cuda::encoder_backward<bf16>(dwte.get(), dwpe.get(), dx.get(), d_tok.get(), B, T, C, scratch.get(), stream);
          });

  // ---- layernorm, residual ----
  const double stats = 2.0 * N * sizeof(float);
  mem_row("layernorm_forward", 2.0 * NC * E + stats + 2.0 * C * E, [&] {
    zt::cuda::layernorm_forward<bf16>(ln.get(), mean.get(), rstd.get(), x.get(), lnw.get(), lnb.get(), N, C, stream);
  });
  mem_row("residual_layernorm_forward", 4.0 * NC * E + stats + 2.0 * C * E, [&] {
    zt::cuda::residual_layernorm_forward<bf16>(res.get(), ln.get(), mean.get(), rstd.get(), x.get(), x2.get(), lnw.get(),
                                               lnb.get(), N, C, stream);
  });
  mem_row("layernorm_backward", 4.0 * NC * E + stats + C * E + 4.0 * C * E, [&] {
    zt::cuda::layernorm_backward<bf16>(dx.get(), dlnw.get(), dlnb.get(), dln.get(), x.get(), lnw.get(), mean.get(),
                                       rstd.get(), N, C, scratch.get(), stream);
  });
  mem_row("residual_forward", 3.0 * NC * E,
          [&] { zt::cuda::residual_forward<bf16>(res.get(), x.get(), x2.get(), NC, stream); });

  // ---- matmuls: forward and backward of the five GPT-2 linear layers ----
  struct Lin {
    const char* name;
    int C, OC;
    bool bias, gelu;
    const bf16* in;
  };
  const Lin lins[] = {{"qkv", C, 3 * C, true, false, ln.get()},
                      {"attn_proj", C, C, true, false, atty.get()},
                      {"fc+gelu", C, 4 * C, true, true, ln.get()},
                      {"fc_proj", 4 * C, C, true, false, fchg.get()},
                      {"lm_head", C, Vp, false, false, ln.get()}};
  for (const Lin& l : lins) {
    const bool head = l.OC == Vp;
    const bf16* weight = head ? wte.get() : w.get();
    bf16* out = head ? logits.get() : (l.gelu ? fchg.get() : (l.OC == 3 * C ? qkv.get() : (l.OC == 4 * C ? fch.get() : res.get())));
    flop_row(std::string("matmul_forward ") + l.name, 2.0 * N * l.C * l.OC, [&] {
      zt::cuda::matmul_forward<bf16>(out, l.gelu ? fch.get() : nullptr, l.in, weight, l.bias ? bias.get() : nullptr, N, l.C,
                                     l.OC, blas);
    });
  }
  for (const Lin& l : lins) {
    const bool head = l.OC == Vp;
    bf16* dw_ = head ? dwte.get() : dw.get();
    const bf16* weight = head ? wte.get() : w.get();
    const bf16* dout = head ? logits.get() : (l.OC == 3 * C ? dqkv.get() : (l.OC == 4 * C ? dfch.get() : dx.get()));
    bf16* dinp = l.C == 4 * C ? dfchg.get() : dln.get();
    flop_row(std::string("matmul_backward ") + l.name, 4.0 * N * l.C * l.OC, [&] {
      zt::cuda::matmul_backward<bf16>(dinp, dw_, l.bias ? dbias.get() : nullptr, dout, l.in, weight, N, l.C, l.OC,
                                      scratch.get(), blas);
    });
  }

  // ---- attention ----
  const double attn_fwd_flops = 4.0 * B * NH * double(T) * T * hs / 2.0;
  // The default variant under the plain names, then each way of dividing the work (attention.h:
  // AttentionTcVariant; bit-identical results) under its own, so one run shows which is fastest.
  flop_row("attention_forward",
           attn_fwd_flops, [&] { zt::cuda::attention_forward<bf16>(atty.get(), lse.get(), qkv.get(), B, T, C, NH, stream); });
  flop_row("attention_backward", 2.5 * attn_fwd_flops, [&] {
    zt::cuda::attention_backward<bf16>(dqkv.get(), datty.get(), qkv.get(), atty.get(), lse.get(), B, T, C, NH,
                                       scratch.get(), stream);
  });
  for (const int warp_rows : {16, 32})
    for (const bool heads_fastest : {true, false}) {
      const zt::cuda::AttentionTcVariant v{warp_rows, heads_fastest};
      const std::string tag = " [warp_rows " + std::to_string(warp_rows) +
                              (heads_fastest ? ", heads fastest]" : ", head's rows together]");
      flop_row("attention_forward" + tag, attn_fwd_flops, [&, v] {
        zt::cuda::attention_forward<bf16>(atty.get(), lse.get(), qkv.get(), B, T, C, NH, stream, v);
      });
      flop_row("attention_backward" + tag, 2.5 * attn_fwd_flops, [&, v] {
        zt::cuda::attention_backward<bf16>(dqkv.get(), datty.get(), qkv.get(), atty.get(), lse.get(), B, T, C, NH,
                                           scratch.get(), stream, v);
      });
    }

  // ---- the MLP's input gradient through the GELU: the block's way before (each buffer zeroed, the
  // product accumulated onto it with beta 1, the GELU's backward a kernel of its own) beside its way
  // now (gpt_block.cpp: the product overwrites, the GELU's backward in its DGELU epilogue) ----
  const size_t n4 = NC * 4;
  flop_row("mlp dfch [zeroed, += product, gelu_backward]", 2.0 * N * 4.0 * C * C, [&] {
    ZT_CHECK_CUDA(cudaMemsetAsync(dfchg.get(), 0, n4 * sizeof(bf16), stream));
    zt::cuda::matmul_backward<bf16>(dfchg.get(), nullptr, nullptr, dx.get(), nullptr, w.get(), N, 4 * C, C, scratch.get(),
                                    blas);
    ZT_CHECK_CUDA(cudaMemsetAsync(dfch.get(), 0, n4 * sizeof(bf16), stream));
    zt::cuda::gelu_backward<bf16>(dfch.get(), fch.get(), dfchg.get(), n4, stream);
  });
  flop_row("mlp dfch [overwritten, DGELU epilogue]", 2.0 * N * 4.0 * C * C, [&] {
    zt::cuda::matmul_backward<bf16>(dfch.get(), nullptr, nullptr, dx.get(), nullptr, w.get(), N, 4 * C, C, scratch.get(),
                                    blas, -1, zt::Dinp::overwrite, fch.get());
  });

  // ---- GELU ----
  mem_row("gelu_forward", 2.0 * n4 * E, [&] { zt::cuda::gelu_forward<bf16>(fchg.get(), fch.get(), n4, stream); });
  mem_row("gelu_backward", 4.0 * n4 * E,
          [&] { zt::cuda::gelu_backward<bf16>(dfch.get(), fch.get(), dfchg.get(), n4, stream); });

  // ---- classifier (the logits become dlogits after the first run; the work is the same) ----
  mem_row("softmax_xent (dlogits)", 2.0 * N * double(Vp) * E + 2.0 * N * 4, [&] {
    zt::cuda::softmax_xent_forward_backward<bf16>(logits.get(), losses.get(), d_tgt.get(), 1.0f / float(N), N, V, Vp, true,
                                                  stream);
  });

  // ---- optimizer and gradient norm over all GPT-2 124M parameters ----
  {
    const size_t P = size_t(Vp) * C + size_t(maxT) * C + size_t(L) * (12 * size_t(C) * C + 13 * size_t(C)) + 2 * size_t(C);
    Dev<bf16> param(P), grad(P);
    Dev<float> master(P), m(P), v(P);
    fill(param, -0.1f, 0.1f, 21);
    fill(grad, -0.01f, 0.01f, 22);
    fill(master, -0.1f, 0.1f, 23);
    fill(m, -1e-3f, 1e-3f, 24);
    fill(v, 1e-6f, 1e-4f, 25);
    Dev<float> acc(1);
    ZT_CHECK_CUDA(cudaMemset(acc.get(), 0, sizeof(float)));
    // lr, beta1, beta2, eps, weight_decay, grad_scale, step
    const zt::cpu::AdamWArgs args{6e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 1.0f, 10};
    uint32_t seed = 0;
    // per parameter: grad (bf16) read, master / m / v (fp32) read + written, bf16 param written
    mem_row("adamw (bf16 + fp32 master, 124M)", double(P) * (E + 3 * 8 + E), [&] {
      zt::cuda::adamw_update<bf16>(param.get(), master.get(), grad.get(), m.get(), v.get(), P, args, seed++, 0, stream);
    });
    mem_row("sum_squares (bf16 grads, 124M)", double(P) * E,
            [&] { zt::cuda::sum_squares_accumulate<bf16>(acc.get(), grad.get(), P, scratch.get(), stream); });
  }

  // ---- report ----
  std::printf("device: %s (%d SMs)\n", prop.name, prop.multiProcessorCount);
  std::printf("shapes: B=%d T=%d (N=%d) C=%d NH=%d hs=%d V=%d Vp=%d, bf16, median of %d runs\n", B, T, N, C, NH, hs, V, Vp,
              a.reps);
  std::printf("ceilings: memcpy D2D 1 GiB %.0f GB/s (read + write); bf16 GEMM 8192^3 (cuBLASLt) %.1f TFLOP/s\n\n", bw_gbps,
              gemm_tflops);
  std::printf("%-38s %10s %12s %11s\n", "kernel", "time ms", "rate", "% ceiling");
  std::printf("%-38s %10s %12s %11s\n", std::string(38, '-').c_str(), "----------", "------------", "-----------");
  for (const Row& r : rows) {
    if (!r.error.empty()) {
      std::printf("%-38s %10s  failed: %s\n", r.kernel.c_str(), "-", r.error.c_str());
      continue;
    }
    char rate[32];
    if (r.flops > 0)
      std::snprintf(rate, sizeof rate, "%.1f TFLOP/s", r.rate);
    else
      std::snprintf(rate, sizeof rate, "%.0f GB/s", r.rate);
    std::printf("%-38s %10.4f %12s %10.1f%%\n", r.kernel.c_str(), r.ms, rate, r.pct);
  }

  if (!a.json.empty()) {
    std::ofstream f(a.json);
    if (!f) {
      std::fprintf(stderr, "cannot write %s\n", a.json.c_str());
      return 1;
    }
    f << "{\n  \"device\": \"" << json_escape(prop.name) << "\",\n  \"sms\": " << prop.multiProcessorCount
      << ",\n  \"dtype\": \"bf16\",\n  \"B\": " << B << ", \"T\": " << T << ", \"C\": " << C << ", \"NH\": " << NH
      << ", \"V\": " << V << ", \"Vp\": " << Vp << ", \"reps\": " << a.reps << ",\n  \"ceilings\": {\"memcpy_gbps\": "
      << json_num(bw_gbps) << ", \"gemm_tflops\": " << json_num(gemm_tflops) << "},\n  \"rows\": [\n";
    for (size_t i = 0; i < rows.size(); i++) {
      const Row& r = rows[i];
      const bool fl = r.flops > 0;
      f << "    {\"kernel\": \"" << json_escape(r.kernel) << "\", \"ms\": " << json_num(r.ms)
        << ", \"bytes\": " << (fl ? "null" : json_num(r.bytes)) << ", \"flops\": " << (fl ? json_num(r.flops) : "null")
        << ", \"gbps\": " << (fl ? "null" : json_num(r.rate)) << ", \"tflops\": " << (fl ? json_num(r.rate) : "null")
        << ", \"pct_ceiling\": " << json_num(r.pct);
      if (!r.error.empty()) f << ", \"error\": \"" << json_escape(r.error) << "\"";
      f << "}" << (i + 1 < rows.size() ? "," : "") << "\n";
    }
    f << "  ]\n}\n";
    std::printf("\nwrote %s\n", a.json.c_str());
  }

  (void)cublasLtDestroy(lt);
  (void)cudaStreamDestroy(stream);
  size_t failed = 0;
  for (const Row& r : rows) failed += !r.error.empty();
  return failed ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  if (!parse(argc, argv, a)) {
    usage(argv[0]);
    return 2;
  }
  if (!have_gpu()) {
    std::printf("no CUDA device: skipped\n");
    return 77;
  }
  try {
    return run(a);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "zt_bench_kernels: %s\n", e.what());
    return 1;
  }
}
