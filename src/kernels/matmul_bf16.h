// The CPU backend's bf16 linear layer (backend "cpu-bf16", docs/design.md §3.15): the same products
// as matmul.h's fp32 ones, with every operand rounded to bf16 (round to nearest even) and the
// products accumulated in fp32 by oneDNN's bf16 matmul (AVX512-BF16 or AMX kernels). Outputs,
// parameters, gradients, master weights and every other op stay fp32: the numerics of the CUDA
// bf16 backend's GEMMs (bf16 operands, fp32 accumulation) without its bf16 activation storage.
//
// The operands' bf16 copies live in one workspace, allocated before the first step through the
// memory tracker (Trainer) and counted by the estimate, both from one sizing (model/config.h:
// cpu_bf16_workspace_bytes): nothing is allocated inside a step but oneDNN's own primitives (created
// on each shape's first call).
#pragma once
#include <cstddef>
#include <cstdint>

#include "kernels/matmul.h"

namespace zt::cpu::bf16 {

// This binary was linked with oneDNN (CMake found it: Debian's libdnnl-dev).
bool built();
// This CPU multiplies bf16 in hardware (AVX512-BF16 or AMX-BF16), as oneDNN's kernels need.
bool cpu_supported();
// What cpu_supported() looked for, for messages: "AVX512-BF16 or AMX-BF16".
const char* required_isa();

// Binds the workspace the products below use (nullptr unbinds): three slots of bf16 elements, the
// row operand (x forward, dout backward: N x max(C, OC)), the weight (OC x C) and x again in
// backward (N x C); a product that does not fit is an internal error. While bound, CpuOps<float>
// routes its matmuls here. Process-wide: one run per process.
void bind_workspace(void* p, size_t bytes);
bool active();

// As cpu::matmul_forward / matmul_backward (matmul.h), fp32 in and out, bf16 products.
void matmul_forward(float* out, const float* inp, const float* weight, const float* bias, int N, int C, int OC,
                    int ld = -1);
void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                     const float* weight, int N, int C, int OC, int ld = -1, Dinp dinp_write = Dinp::accumulate);

// fp32 -> bf16 bits, round to nearest even (NaN stays NaN): what the products see of each operand.
inline uint16_t round_to_bf16(float f) {
  uint32_t u;
  __builtin_memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40u);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}
inline float bf16_to_float(uint16_t h) {
  const uint32_t u = uint32_t(h) << 16;
  float f;
  __builtin_memcpy(&f, &u, 4);
  return f;
}

}  // namespace zt::cpu::bf16
