// The CPU backend as an op table. The model (gpt.h) is written once against this interface; a
// CUDA table with the same member names and shapes (CudaOps<bf16>, CudaOps<float>) sits beside it.
// T = float is the CPU trainer; T = double exists so tests can check gradients of the whole model
// against finite differences.
#pragma once
#include <cstring>

#include "kernels/adamw.h"
#include "kernels/attention.h"
#include "kernels/encoder.h"
#include "kernels/gelu.h"
#include "kernels/global_norm.h"
#include "kernels/layernorm.h"
#include "kernels/matmul.h"
#include "kernels/residual.h"
#include "kernels/softmax_xent.h"
#include "runtime/memory.h"

namespace zt {

template <class TT>
struct CpuOps {
  using T = TT;
  static constexpr Tier tier = Tier::host;
  static constexpr const char* name = sizeof(TT) == 4 ? "cpu-fp32" : "cpu-fp64";

  static void zero(T* p, size_t n) { std::memset(p, 0, n * sizeof(T)); }
  static void copy(T* dst, const T* src, size_t n) { std::memcpy(dst, src, n * sizeof(T)); }

  static void encoder_forward(T* out, const int* tok, const T* wte, const T* wpe, int B, int Tn, int C) {
    cpu::encoder_forward(out, tok, wte, wpe, B, Tn, C);
  }
  static void encoder_backward(T* dwte, T* dwpe, const T* dout, const int* tok, int B, int Tn, int C) {
    cpu::encoder_backward(dwte, dwpe, dout, tok, B, Tn, C);
  }
  static void layernorm_forward(T* out, T* mean, T* rstd, const T* inp, const T* w, const T* b, int N, int C) {
    cpu::layernorm_forward(out, mean, rstd, inp, w, b, N, C);
  }
  static void layernorm_backward(T* dinp, T* dw, T* db, const T* dout, const T* inp, const T* w, const T* mean,
                                 const T* rstd, int N, int C) {
    cpu::layernorm_backward(dinp, dw, db, dout, inp, w, mean, rstd, N, C);
  }
  static void matmul_forward(T* out, const T* inp, const T* w, const T* b, int N, int C, int OC) {
    cpu::matmul_forward(out, inp, w, b, N, C, OC);
  }
  static void matmul_backward(T* dinp, T* dw, T* db, const T* dout, const T* inp, const T* w, int N, int C, int OC) {
    cpu::matmul_backward(dinp, dw, db, dout, inp, w, N, C, OC);
  }
  static void attention_forward(T* out, T* lse, const T* qkv, int B, int Tn, int C, int NH) {
    cpu::attention_forward(out, lse, qkv, B, Tn, C, NH);
  }
  static void attention_backward(T* dqkv, const T* dout, const T* qkv, const T* out, const T* lse, int B, int Tn, int C,
                                 int NH) {
    cpu::attention_backward(dqkv, dout, qkv, out, lse, B, Tn, C, NH);
  }
  static void gelu_forward(T* out, const T* inp, size_t n) { cpu::gelu_forward(out, inp, n); }
  static void gelu_backward(T* dinp, const T* inp, const T* dout, size_t n) { cpu::gelu_backward(dinp, inp, dout, n); }
  static void residual_forward(T* out, const T* a, const T* b, size_t n) { cpu::residual_forward(out, a, b, n); }
  static void softmax_xent(T* logits, T* losses, const int* targets, T dloss, int N, int V, int Vp, bool write_dlogits) {
    cpu::softmax_xent_forward_backward(logits, losses, targets, dloss, N, V, Vp, write_dlogits);
  }
  static void adamw(T* p, const T* g, T* m, T* v, size_t n, const cpu::AdamWArgs& a) { cpu::adamw_update(p, g, m, v, n, a); }
  static double sum_squares(const T* x, size_t n) { return cpu::sum_squares(x, n); }
};

}  // namespace zt
