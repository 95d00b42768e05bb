// bf16 products on the CPU through oneDNN's matmul primitive (matmul_bf16.h). The three products
// of a linear layer, as oneDNN sees them (src (M,K) x weights (K,N) -> dst (M,N), any strides):
//   forward   out   (N,OC)  = x (N,C)      @ W^T (C,OC)     W^T: W (OC,C) read with strides {1, C}
//   backward  dinp  (N,C)  += dout (N,OC)  @ W (OC,C)
//             dW    (OC,C) += dout^T (OC,N) @ x (N,C)        dout^T: strides {1, OC}
// "+=" is oneDNN's sum post-op (dst = product + dst, fp32); the bias is added as on fp32 (the
// rows of out start at the bias; its gradient is fp32 column sums of dout: matmul.cpp).
//
// Workspace slots (bf16 elements): [row operand: x forward, dout backward | weight | x backward].
#include "kernels/matmul_bf16.h"

#include <algorithm>
#include <array>
#include <map>
#include <mutex>
#include <string>

#include "runtime/error.h"

#if ZT_HAVE_DNNL
#include <oneapi/dnnl/dnnl.hpp>
#endif

namespace zt::cpu::bf16 {

namespace {
uint16_t* g_workspace = nullptr;
size_t g_workspace_elems = 0;

// rows x cols of src (row stride ld) into dst, contiguous, rounded to bf16.
void to_bf16(uint16_t* dst, const float* src, size_t rows, size_t cols, size_t ld) {
#pragma omp parallel for schedule(static)
  for (size_t r = 0; r < rows; ++r) {
    const float* __restrict s = src + r * ld;
    uint16_t* __restrict d = dst + r * cols;
#pragma omp simd
    for (size_t c = 0; c < cols; ++c) d[c] = round_to_bf16(s[c]);
  }
}
}  // namespace

const char* required_isa() { return "AVX512-BF16 or AMX-BF16"; }

void bind_workspace(void* p, size_t bytes) {
  g_workspace = static_cast<uint16_t*>(p);
  g_workspace_elems = p ? bytes / sizeof(uint16_t) : 0;
}
bool active() { return g_workspace != nullptr; }

#if ZT_HAVE_DNNL

bool built() { return true; }

bool cpu_supported() {
  // The ISA oneDNN will run (the hardware's, capped by ONEDNN_MAX_CPU_ISA): the values nest as bit masks.
  const unsigned isa = unsigned(dnnl::get_effective_cpu_isa());
  const unsigned bf16 = unsigned(dnnl::cpu_isa::avx512_core_bf16);
  return (isa & bf16) == bf16;
}

namespace {

// One product: dst (M,N) (+)= src (M,K) x weights (K,N), each with its own strides (elements).
struct Product {
  int64_t M, N, K;
  int64_t src_s0, src_s1, wei_s0, wei_s1, dst_ld;
  bool accumulate;
  std::array<int64_t, 10> key() const {
    return {M, N, K, src_s0, src_s1, wei_s0, wei_s1, dst_ld, accumulate ? 1 : 0, 0};
  }
};

struct Library {
  dnnl::engine engine{dnnl::engine::kind::cpu, 0};
  dnnl::stream stream{engine};
  std::map<std::array<int64_t, 10>, dnnl::matmul> primitives;  // by shape: created on first use
  std::mutex mu;
};
Library& library() {
  static Library lib;
  return lib;
}

void run(const char* what, const Product& p, const uint16_t* src, const uint16_t* wei, float* dst) {
  using dt = dnnl::memory::data_type;
  Library& lib = library();
  std::lock_guard<std::mutex> lock(lib.mu);
  try {
    const dnnl::memory::desc sd({p.M, p.K}, dt::bf16, dnnl::memory::dims{p.src_s0, p.src_s1});
    const dnnl::memory::desc wd({p.K, p.N}, dt::bf16, dnnl::memory::dims{p.wei_s0, p.wei_s1});
    const dnnl::memory::desc dd({p.M, p.N}, dt::f32, dnnl::memory::dims{p.dst_ld, 1});
    auto it = lib.primitives.find(p.key());
    if (it == lib.primitives.end()) {
      dnnl::primitive_attr attr;
      if (p.accumulate) {
        dnnl::post_ops ops;
        ops.append_sum(1.0f);
        attr.set_post_ops(ops);
      }
      const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(sd, wd, dd), attr, lib.engine);
      it = lib.primitives.emplace(p.key(), dnnl::matmul(pd)).first;
    }
    dnnl::memory sm(sd, lib.engine, const_cast<uint16_t*>(src)), wm(wd, lib.engine, const_cast<uint16_t*>(wei)),
        dm(dd, lib.engine, dst);
    it->second.execute(lib.stream, {{DNNL_ARG_SRC, sm}, {DNNL_ARG_WEIGHTS, wm}, {DNNL_ARG_DST, dm}});
    lib.stream.wait();
  } catch (const dnnl::error& e) {
    throw Error(std::string("oneDNN bf16 matmul (") + what + ", " + std::to_string(p.M) + "x" + std::to_string(p.K) +
                " @ " + std::to_string(p.K) + "x" + std::to_string(p.N) + "): " + e.what());
  }
}

// The workspace's slots for a product with these sizes; an unbound or short workspace is a bug of
// the sizing (model/config.h: cpu_bf16_workspace_bytes), not of the input.
struct Slots {
  uint16_t *rows, *weight, *inp;
};
Slots slots(size_t N, size_t C, size_t OC) {
  const size_t row_slot = N * std::max(C, OC), weight = OC * C;
  ZT_ASSERT(g_workspace != nullptr && row_slot + weight + N * C <= g_workspace_elems);
  return {g_workspace, g_workspace + row_slot, g_workspace + row_slot + weight};
}

}  // namespace

void matmul_forward(float* out, const float* inp, const float* weight, const float* bias, int N, int C, int OC,
                    int ld) {
  if (ld < 0) ld = OC;
  ZT_ASSERT(ld >= OC && (!bias || ld == OC));
  if (N == 0 || OC == 0 || C == 0) return cpu::matmul_forward(out, inp, weight, bias, N, C, OC, ld);
  if (bias) {
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) std::copy(bias, bias + OC, out + (size_t)n * OC);
  }
  const Slots s = slots(N, C, OC);
  to_bf16(s.rows, inp, N, C, C);
  to_bf16(s.weight, weight, OC, C, C);
  run("forward", {N, OC, C, C, 1, 1, C, ld, bias != nullptr}, s.rows, s.weight, out);
}

void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                     const float* weight, int N, int C, int OC, int ld, Dinp dinp_write) {
  if (ld < 0) ld = OC;
  ZT_ASSERT(ld >= OC && (!dbias || ld == OC));
  if (N == 0 || OC == 0 || C == 0) return cpu::matmul_backward(dinp, dweight, dbias, dout, inp, weight, N, C, OC, ld, dinp_write);
  if (dinp || dweight) {
    const Slots s = slots(N, C, OC);
    to_bf16(s.rows, dout, N, OC, ld);  // (N, OC), contiguous
    if (dinp) {
      to_bf16(s.weight, weight, OC, C, C);
      run("input gradient", {N, C, OC, OC, 1, C, 1, C, dinp_write == Dinp::accumulate}, s.rows, s.weight, dinp);
    }
    if (dweight) {
      to_bf16(s.inp, inp, N, C, C);
      run("weight gradient", {OC, C, N, 1, OC, C, 1, C, true}, s.rows, s.inp, dweight);
    }
  }
  if (dbias) cpu::matmul_backward((float*)nullptr, (float*)nullptr, dbias, dout, inp, weight, N, C, OC, ld);
}

#else  // built without oneDNN: choose_backend refuses "cpu-bf16" (runtime/support.h), nothing calls these

bool built() { return false; }
bool cpu_supported() { return false; }
void matmul_forward(float*, const float*, const float*, const float*, int, int, int, int) {
  fail_at(__FILE__, __LINE__, "internal error: bf16 matmul without oneDNN");
}
void matmul_backward(float*, float*, float*, const float*, const float*, const float*, int, int, int, int, Dinp) {
  fail_at(__FILE__, __LINE__, "internal error: bf16 matmul without oneDNN");
}

#endif

}  // namespace zt::cpu::bf16
