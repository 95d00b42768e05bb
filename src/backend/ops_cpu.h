// The CPU backend as an op table. The model (gpt.h) is written once against this interface; the
// CUDA table with the same member names and shapes (CudaOps<bf16>, CudaOps<float>, ops_cuda.h)
// sits beside it. T = float is the CPU trainer; T = double exists so tests can check gradients of
// the whole model against finite differences.
//
// Types of an op table:
//   T  storage of parameters, gradients and activations
//   S  per-row statistics kept for backward (layernorm mean/rstd, attention log-sum-exp, losses)
//   M  optimizer state and master weights (and the host type for uploads / downloads)
// Here all three are T. The CUDA table has T = bf16 with S = M = float (mixed precision).
// Fused ops (residual_layernorm_forward, matmul_gelu_forward) are the unfused pair here; CUDA
// fuses them. Ops taking `scratch` get kernel working memory the model sized with scratch_bytes().
// Backend "cpu-bf16" is this table with T = float while a bf16 workspace is bound (the Trainer binds
// it): its linear layers then multiply in bf16 (kernels/matmul_bf16.h), everything else as fp32.
// run.trace draws every op as a span on the ops track (Tracer::kOps; the two halves of a fused op
// and a linear layer's bias gradient apart), so a trace gives the step's time per op
// (scripts/bench_cpu.sh sums them).
#pragma once
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "kernels/adamw.h"
#include "kernels/attention.h"
#include "kernels/encoder.h"
#include "kernels/gelu.h"
#include "kernels/global_norm.h"
#include "kernels/layernorm.h"
#include "kernels/matmul.h"
#include "kernels/matmul_bf16.h"
#include "kernels/residual.h"
#include "kernels/softmax_xent.h"
#include "runtime/memory.h"
#include "runtime/trace.h"

namespace zt {

template <class TT>
struct CpuOps {
  using T = TT;
  using S = TT;
  using M = TT;
  static constexpr Tier tier = Tier::host;
  static constexpr const char* name = sizeof(TT) == 4 ? "cpu-fp32" : "cpu-fp64";

  // Set by the engine from run.trace; null = off (one test per op). Per thread: the engine sets it
  // on the main thread, so ops on another (the optimizer step inside backward) are not traced.
  static inline thread_local Tracer* tracer = nullptr;
  struct Span {
    explicit Span(const char* op) : op(op), t0(tracer ? Tracer::now_us() : 0) {}
    ~Span() {
      if (tracer) tracer->complete(op, Tracer::kOps, t0, Tracer::now_us() - t0);
    }
    const char* op;
    double t0;
  };

  static void zero(T* p, size_t n) {
    Span s("zero");
    std::memset(p, 0, n * sizeof(T));
  }
  static void copy(T* dst, const T* src, size_t n) {
    Span s("copy");
    std::memcpy(dst, src, n * sizeof(T));
  }
  // Between this backend's memory and host memory: plain copies here.
  static void h2d(void* dst, const void* src, size_t bytes) { std::memcpy(dst, src, bytes); }
  static void d2h(void* dst, const void* src, size_t bytes) { std::memcpy(dst, src, bytes); }
  static size_t scratch_bytes(int B, int Tn, int C, int NH, int Vp) { return 0; }

  // Vocabulary rows [row0, row0 + rows) only; wte at row0; wpe / dwpe may be nullptr (encoder.h).
  static void encoder_forward(T* out, const int* tok, const T* wte, const T* wpe, int B, int Tn, int C, int row0,
                              int rows) {
    Span s("encoder_forward");
    cpu::encoder_forward(out, tok, wte, wpe, B, Tn, C, row0, rows);
  }
  static void encoder_backward(T* dwte, T* dwpe, const T* dout, const int* tok, int B, int Tn, int C, int row0, int rows,
                               void* scratch) {
    Span s("encoder_backward");
    cpu::encoder_backward(dwte, dwpe, dout, tok, B, Tn, C, row0, rows);
  }
  static void layernorm_forward(T* out, T* mean, T* rstd, const T* inp, const T* w, const T* b, int N, int C) {
    Span s("layernorm_forward");
    cpu::layernorm_forward(out, mean, rstd, inp, w, b, N, C);
  }
  static void residual_layernorm_forward(T* residual, T* out, T* mean, T* rstd, const T* a, const T* b, const T* w,
                                         const T* bias, int N, int C) {
    residual_forward(residual, a, b, size_t(N) * size_t(C));
    layernorm_forward(out, mean, rstd, residual, w, bias, N, C);
  }
  static void layernorm_backward(T* dinp, T* dw, T* db, const T* dout, const T* inp, const T* w, const T* mean,
                                 const T* rstd, int N, int C, void* scratch) {
    Span s("layernorm_backward");
    cpu::layernorm_backward(dinp, dw, db, dout, inp, w, mean, rstd, N, C);
  }
  // ld: row stride of out / dout (OC when < 0; matmul.h).
  static void matmul_forward(T* out, const T* inp, const T* w, const T* b, int N, int C, int OC, int ld = -1) {
    Span s("matmul_forward");
    if constexpr (std::is_same_v<T, float>)
      if (cpu::bf16::active()) return cpu::bf16::matmul_forward(out, inp, w, b, N, C, OC, ld);
    cpu::matmul_forward(out, inp, w, b, N, C, OC, ld);
  }
  // pre_gelu = inp @ w^T + b, out = gelu(pre_gelu)
  static void matmul_gelu_forward(T* out, T* pre_gelu, const T* inp, const T* w, const T* b, int N, int C, int OC) {
    matmul_forward(pre_gelu, inp, w, b, N, C, OC);
    gelu_forward(out, pre_gelu, size_t(N) * size_t(OC));
  }
  static void matmul_backward(T* dinp, T* dw, T* db, const T* dout, const T* inp, const T* w, int N, int C, int OC,
                              void* scratch, int ld = -1, Dinp dinp_write = Dinp::accumulate) {
    if (dinp || dw) {
      Span s("matmul_backward");
      bool done = false;
      if constexpr (std::is_same_v<T, float>)
        if ((done = cpu::bf16::active())) cpu::bf16::matmul_backward(dinp, dw, nullptr, dout, inp, w, N, C, OC, ld, dinp_write);
      if (!done) cpu::matmul_backward(dinp, dw, (T*)nullptr, dout, inp, w, N, C, OC, ld, dinp_write);
    }
    if (db) {
      Span s("bias_backward");
      cpu::matmul_backward((T*)nullptr, (T*)nullptr, db, dout, inp, w, N, C, OC, ld);
    }
  }
  // inp = gelu(pre_gelu): dinp = gelu'(pre_gelu) * (dout @ w), overwritten. Here the product, then
  // the GELU's backward in place (CUDA fuses it into the product's epilogue).
  static void matmul_backward_through_gelu(T* dinp, T* dw, T* db, const T* dout, const T* inp, const T* pre_gelu,
                                           const T* w, int N, int C, int OC, void* scratch) {
    matmul_backward(dinp, dw, db, dout, inp, w, N, C, OC, scratch, -1, Dinp::overwrite);
    gelu_backward(dinp, pre_gelu, dinp, size_t(N) * size_t(C));
  }
  static void attention_forward(T* out, T* lse, const T* qkv, int B, int Tn, int C, int NH) {
    Span s("attention_forward");
    cpu::attention_forward(out, lse, qkv, B, Tn, C, NH);
  }
  static void attention_backward(T* dqkv, const T* dout, const T* qkv, const T* out, const T* lse, int B, int Tn, int C,
                                 int NH, void* scratch) {
    Span s("attention_backward");
    cpu::attention_backward(dqkv, dout, qkv, out, lse, B, Tn, C, NH);
  }
  static void gelu_forward(T* out, const T* inp, size_t n) {
    Span s("gelu_forward");
    cpu::gelu_forward(out, inp, n);
  }
  static void gelu_backward(T* dinp, const T* inp, const T* dout, size_t n) {
    Span s("gelu_backward");
    cpu::gelu_backward(dinp, inp, dout, n);
  }
  static void residual_forward(T* out, const T* a, const T* b, size_t n) {
    Span s("residual_forward");
    cpu::residual_forward(out, a, b, n);
  }
  static void softmax_xent(T* logits, T* losses, const int* targets, T dloss, int N, int V, int Vp, bool write_dlogits) {
    Span s("softmax_xent");
    cpu::softmax_xent_forward_backward(logits, losses, targets, dloss, N, V, Vp, write_dlogits);
  }
  static void xent_chunk_partial(const T* logits, int ld, int N, int col0, int cols, int V, const int* targets,
                                 S* run_max, S* run_sum, S* x_target, bool first) {
    Span s("xent_chunk_partial");
    cpu::xent_chunk_partial(logits, ld, N, col0, cols, V, targets, run_max, run_sum, x_target, first);
  }
  static void xent_chunk_finish(S* losses, S* run_max, const S* run_sum, const S* x_target, int N) {
    Span s("xent_chunk_finish");
    cpu::xent_chunk_finish(losses, run_max, run_sum, x_target, N);
  }
  static void xent_chunk_grad(T* logits, int ld, int N, int col0, int cols, int V, const int* targets, const S* lse,
                              S dloss) {
    Span s("xent_chunk_grad");
    cpu::xent_chunk_grad(logits, ld, N, col0, cols, V, targets, lse, dloss);
  }
  // master is always nullptr here (the parameters are the master copy); seed and first are for
  // stochastic rounding, which fp32 does not do.
  static void adamw(T* p, M* master, T* g, M* m, M* v, size_t n, const cpu::AdamWArgs& a, uint32_t seed,
                    uint64_t first) {
    Span s("adamw");
    cpu::adamw_update(p, g, m, v, n, a);
  }
  static double sum_squares(const T* x, size_t n) {
    Span s("sum_squares");
    return cpu::sum_squares(x, n);
  }
};

}  // namespace zt
