// The CUDA backend as an op table: same member names and argument order as CpuOps (ops_cpu.h), so
// src/model drives either. T = bf16 is the fast path (bf16 storage, fp32 accumulation, fp32
// statistics, fp32 master weights and AdamW state); T = float is the parity mode the tests compare
// with the CPU backend. Everything runs on the stream of cuda::Context; host <-> device copies
// synchronise it, nothing else does (except sum_squares, which returns a number to the host).
#pragma once
#if !ZT_HAVE_CUDA
#error "ops_cuda.h needs the CUDA backend (ZT_HAVE_CUDA)"
#endif
#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "kernels/adamw.h"
#include "kernels/attention.h"
#include "kernels/cast.h"
#include "kernels/encoder.h"
#include "kernels/gelu.h"
#include "kernels/global_norm.h"
#include "kernels/layernorm.h"
#include "kernels/matmul.h"
#include "kernels/residual.h"
#include "kernels/softmax_xent.h"
#include "runtime/cuda_check.h"
#include "runtime/cuda_context.h"
#include "runtime/device.h"
#include "runtime/memory.h"

namespace zt {

template <class TT>
struct CudaOps {
  static_assert(std::is_same_v<TT, float> || std::is_same_v<TT, bf16>, "CudaOps<float> or CudaOps<bf16>");
  using T = TT;
  using S = float;
  using M = float;
  static constexpr Tier tier = Tier::device;
  static constexpr const char* name = std::is_same_v<TT, float> ? "cuda-fp32" : "cuda-bf16";

  static cudaStream_t stream() { return cuda::Context::get().stream; }
  static const cuda::Blas& blas() { return cuda::Context::get().blas; }

  static void zero(T* p, size_t n) { ZT_CHECK_CUDA(cudaMemsetAsync(p, 0, n * sizeof(T), stream())); }
  static void copy(T* dst, const T* src, size_t n) {
    ZT_CHECK_CUDA(cudaMemcpyAsync(dst, src, n * sizeof(T), cudaMemcpyDeviceToDevice, stream()));
  }
  static void h2d(void* dst, const void* src, size_t bytes) { device::copy_to_device(dst, src, bytes); }
  static void d2h(void* dst, const void* src, size_t bytes) { device::copy_to_host(dst, src, bytes); }
  // fp32 copy of T values (master weights from the initial parameters).
  static void widen(M* dst, const T* src, size_t n) { cuda::cast(dst, src, n, stream()); }

  // Working memory shared by the ops below (one op runs at a time on the stream).
  static size_t scratch_bytes(int B, int Tn, int C, int NH, int Vp) {
    const int N = B * Tn;
    size_t s = cuda::encoder_backward_scratch_bytes(B, Tn);
    s = std::max(s, cuda::layernorm_backward_scratch_bytes(N, C));
    s = std::max(s, cuda::matmul_backward_scratch_bytes(N, 4 * C));  // widest bias: fc (4C); qkv 3C, head none
    s = std::max(s, cuda::attention_backward_scratch_bytes(B, Tn, C, NH));
    return s;
  }

  static void encoder_forward(T* out, const int* tok, const T* wte, const T* wpe, int B, int Tn, int C, int row0,
                              int rows) {
    cuda::encoder_forward(out, tok, wte, wpe, B, Tn, C, stream(), row0, rows);
  }
  static void encoder_backward(T* dwte, T* dwpe, const T* dout, const int* tok, int B, int Tn, int C, int row0, int rows,
                               void* scratch) {
    cuda::encoder_backward(dwte, dwpe, dout, tok, B, Tn, C, scratch, stream(), row0, rows);
  }
  static void layernorm_forward(T* out, S* mean, S* rstd, const T* inp, const T* w, const T* b, int N, int C) {
    cuda::layernorm_forward(out, mean, rstd, inp, w, b, N, C, stream());
  }
  static void residual_layernorm_forward(T* residual, T* out, S* mean, S* rstd, const T* a, const T* b, const T* w,
                                         const T* bias, int N, int C) {
    cuda::residual_layernorm_forward(residual, out, mean, rstd, a, b, w, bias, N, C, stream());
  }
  static void layernorm_backward(T* dinp, T* dw, T* db, const T* dout, const T* inp, const T* w, const S* mean,
                                 const S* rstd, int N, int C, void* scratch) {
    cuda::layernorm_backward(dinp, dw, db, dout, inp, w, mean, rstd, N, C, scratch, stream());
  }
  static void matmul_forward(T* out, const T* inp, const T* w, const T* b, int N, int C, int OC, int ld = -1) {
    cuda::matmul_forward<T>(out, nullptr, inp, w, b, N, C, OC, blas(), ld);
  }
  static void matmul_gelu_forward(T* out, T* pre_gelu, const T* inp, const T* w, const T* b, int N, int C, int OC) {
    cuda::matmul_forward<T>(out, pre_gelu, inp, w, b, N, C, OC, blas());
  }
  static void matmul_backward(T* dinp, T* dw, T* db, const T* dout, const T* inp, const T* w, int N, int C, int OC,
                              void* scratch, int ld = -1, Dinp dinp_write = Dinp::accumulate) {
    cuda::matmul_backward(dinp, dw, db, dout, inp, w, N, C, OC, scratch, blas(), ld, dinp_write);
  }
  // inp = gelu(pre_gelu): dinp = gelu'(pre_gelu) * (dout @ w), overwritten; the GELU's backward in
  // the product's epilogue.
  static void matmul_backward_through_gelu(T* dinp, T* dw, T* db, const T* dout, const T* inp, const T* pre_gelu,
                                           const T* w, int N, int C, int OC, void* scratch) {
    cuda::matmul_backward(dinp, dw, db, dout, inp, w, N, C, OC, scratch, blas(), -1, Dinp::overwrite, pre_gelu);
  }
  static void attention_forward(T* out, S* lse, const T* qkv, int B, int Tn, int C, int NH) {
    cuda::attention_forward(out, lse, qkv, B, Tn, C, NH, stream());
  }
  static void attention_backward(T* dqkv, const T* dout, const T* qkv, const T* out, const S* lse, int B, int Tn, int C,
                                 int NH, void* scratch) {
    cuda::attention_backward(dqkv, dout, qkv, out, lse, B, Tn, C, NH, scratch, stream());
  }
  static void gelu_forward(T* out, const T* inp, size_t n) { cuda::gelu_forward(out, inp, n, stream()); }
  static void gelu_backward(T* dinp, const T* inp, const T* dout, size_t n) {
    cuda::gelu_backward(dinp, inp, dout, n, stream());
  }
  static void residual_forward(T* out, const T* a, const T* b, size_t n) { cuda::residual_forward(out, a, b, n, stream()); }
  static void softmax_xent(T* logits, S* losses, const int* targets, S dloss, int N, int V, int Vp, bool write_dlogits) {
    cuda::softmax_xent_forward_backward(logits, losses, targets, dloss, N, V, Vp, write_dlogits, stream());
  }
  static void xent_chunk_partial(const T* logits, int ld, int N, int col0, int cols, int V, const int* targets,
                                 S* run_max, S* run_sum, S* x_target, bool first) {
    cuda::xent_chunk_partial(logits, ld, N, col0, cols, V, targets, run_max, run_sum, x_target, first, stream());
  }
  static void xent_chunk_finish(S* losses, S* run_max, const S* run_sum, const S* x_target, int N) {
    cuda::xent_chunk_finish(losses, run_max, run_sum, x_target, N, stream());
  }
  static void xent_chunk_grad(T* logits, int ld, int N, int col0, int cols, int V, const int* targets, const S* lse,
                              S dloss) {
    cuda::xent_chunk_grad(logits, ld, N, col0, cols, V, targets, lse, dloss, stream());
  }
  static void adamw(T* p, M* master, T* g, M* m, M* v, size_t n, const cpu::AdamWArgs& a, uint32_t seed,
                    uint64_t first) {
    cuda::adamw_update(p, master, g, m, v, n, a, seed, first, stream());
  }
  // Returns to the host: synchronises the stream.
  static double sum_squares(const T* x, size_t n) {
    cuda::Context& ctx = cuda::Context::get();
    ZT_REQUIRE(cuda::global_norm_scratch_bytes() <= cuda::Context::kReduceScratchBytes,
               "CudaOps::sum_squares: the context's reduction scratch is smaller than the kernel needs");
    ZT_CHECK_CUDA(cudaMemsetAsync(ctx.reduce_out, 0, sizeof(float), ctx.stream));
    cuda::sum_squares_accumulate(ctx.reduce_out, x, n, ctx.reduce_scratch, ctx.stream);
    float host = 0.0f;
    device::copy_to_host(&host, ctx.reduce_out, sizeof(float));
    return double(host);
  }
};

}  // namespace zt
