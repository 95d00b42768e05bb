// Causal flash attention, backward: D = rowsum(dO * O), the fp32 SIMT dK/dV and dQ kernels, and the
// entry point (the bf16 passes are in attention_bwd_tc.cu). Algorithm and layouts: attention_common.cuh.
#include "kernels/attention_common.cuh"

namespace zt::cuda {
namespace {

// ================================ fp32 SIMT =======================================================

template <int HS>
__global__ void __launch_bounds__(kFThreads, 1)
    attention_backward_dkdv_f32(float* __restrict__ dqkv, const float* __restrict__ dout,
                                const float* __restrict__ qkv, const float* __restrict__ lse,
                                const float* __restrict__ D, int Tn, int C, int NH) {
  using G = F32Geom<HS>;
  constexpr int kD = G::kD, P = G::kPad, R = kFRowsPerWarp;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  float* sK = reinterpret_cast<float*>(smem_raw);  // (32, HS)      this block's keys, broadcasts
  float* sV = sK + kFRows * HS;                     // (32, HS)
  float* sQ = sV + kFRows * HS;                     // (32, HS + 1)  row = lane, then channel = lane
  float* sO = sQ + kFRows * P;                      // dO, (32, HS + 1)
  float* sL = sO + kFRows * P;                      // lse (32)
  float* sD = sL + kFRows;                          // D (32)

  const int b = blockIdx.x / NH, h = blockIdx.x % NH;
  const int kb = blockIdx.y, k0 = kb * kFRows, nqt = gridDim.y;
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const int wrow = warp * R;
  const size_t ld = 3 * size_t(C);
  const float* q = qkv + size_t(b) * Tn * ld + h * HS;
  const float* dO = dout + size_t(b) * Tn * C + h * HS;
  const float* lse_bh = lse + (size_t(b) * NH + h) * Tn;
  const float* D_bh = D + (size_t(b) * NH + h) * Tn;
  const float scale = 1.0f / sqrtf(float(HS));

  f32_load_tile<HS>(sK, HS, q + C, ld, k0, Tn);
  f32_load_tile<HS>(sV, HS, q + 2 * C, ld, k0, Tn);
  float dk[R][kD] = {}, dv[R][kD] = {};

  for (int qt = kb; qt < nqt; ++qt) {
    const int q0 = qt * kFRows;
    __syncthreads();
    f32_load_tile<HS>(sQ, P, q, ld, q0, Tn);
    f32_load_tile<HS>(sO, P, dO, C, q0, Tn);
    if (threadIdx.x < kFRows) {
      const int t = q0 + threadIdx.x;
      sL[threadIdx.x] = t < Tn ? lse_bh[t] : 0.0f;
      sD[threadIdx.x] = t < Tn ? D_bh[t] : 0.0f;
    }
    __syncthreads();

    float s[R] = {}, dp[R] = {};  // lane = query
#pragma unroll 16
    for (int d = 0; d < HS; ++d) {
      const float qd = sQ[lane * P + d], od = sO[lane * P + d];
#pragma unroll
      for (int r = 0; r < R; ++r) {
        s[r] += sK[(wrow + r) * HS + d] * qd;
        dp[r] += sV[(wrow + r) * HS + d] * od;
      }
    }
    const int query = q0 + lane;
    float p[R], ds[R];
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const bool visible = query >= k0 + wrow + r && query < Tn;
      p[r] = visible ? expf(s[r] * scale - sL[lane]) : 0.0f;
      ds[r] = p[r] * (dp[r] - sD[lane]);
    }
#pragma unroll 8
    for (int j = 0; j < kFRows; ++j) {
      float pj[R], dsj[R];
#pragma unroll
      for (int r = 0; r < R; ++r) {
        pj[r] = __shfl_sync(0xffffffffu, p[r], j);
        dsj[r] = __shfl_sync(0xffffffffu, ds[r], j);
      }
#pragma unroll
      for (int i = 0; i < kD; ++i) {
        const int c = G::chan(lane, i);
        const float qd = sQ[j * P + c], od = sO[j * P + c];
#pragma unroll
        for (int r = 0; r < R; ++r) {
          dv[r][i] += pj[r] * od;
          dk[r][i] += dsj[r] * qd;
        }
      }
    }
  }

#pragma unroll
  for (int r = 0; r < R; ++r) {
    const int t = k0 + wrow + r;
    if (t >= Tn) continue;
    float* dst = dqkv + (size_t(b) * Tn + t) * ld + C + h * HS;
#pragma unroll
    for (int i = 0; i < kD; ++i) {
      if (!G::owns(lane, i)) continue;
      dst[lane + kWarp * i] = dk[r][i] * scale;
      dst[C + lane + kWarp * i] = dv[r][i];
    }
  }
}

template <int HS>
__global__ void __launch_bounds__(kFThreads, 1)
    attention_backward_dq_f32(float* __restrict__ dqkv, const float* __restrict__ dout, const float* __restrict__ qkv,
                              const float* __restrict__ lse, const float* __restrict__ D, int Tn, int C, int NH) {
  using G = F32Geom<HS>;
  constexpr int kD = G::kD, P = G::kPad, R = kFRowsPerWarp;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  float* sQ = reinterpret_cast<float*>(smem_raw);  // (32, HS)      broadcasts
  float* sO = sQ + kFRows * HS;                     // dO, (32, HS)
  float* sK = sO + kFRows * HS;                     // (32, HS + 1)  row = lane, then channel = lane
  float* sV = sK + kFRows * P;                      // (32, HS + 1)  row = lane

  const int b = blockIdx.x / NH, h = blockIdx.x % NH;
  const int qb = gridDim.y - 1 - blockIdx.y;
  const int q0 = qb * kFRows;
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const int wrow = warp * R;
  const size_t ld = 3 * size_t(C);
  const float* q = qkv + size_t(b) * Tn * ld + h * HS;
  const float* k = q + C;
  const float* v = q + 2 * C;
  const float scale = 1.0f / sqrtf(float(HS));

  f32_load_tile<HS>(sQ, HS, q, ld, q0, Tn);
  f32_load_tile<HS>(sO, HS, dout + size_t(b) * Tn * C + h * HS, C, q0, Tn);
  float L[R], Dr[R], dq[R][kD] = {};
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const int t = q0 + wrow + r;
    L[r] = t < Tn ? lse[(size_t(b) * NH + h) * Tn + t] : 0.0f;
    Dr[r] = t < Tn ? D[(size_t(b) * NH + h) * Tn + t] : 0.0f;
  }

  for (int kt = 0; kt <= qb; ++kt) {
    const int k0 = kt * kFRows;
    __syncthreads();
    f32_load_tile<HS>(sK, P, k, ld, k0, Tn);
    f32_load_tile<HS>(sV, P, v, ld, k0, Tn);
    __syncthreads();

    float s[R] = {}, dp[R] = {};  // lane = key
#pragma unroll 16
    for (int d = 0; d < HS; ++d) {
      const float kd = sK[lane * P + d], vd = sV[lane * P + d];
#pragma unroll
      for (int r = 0; r < R; ++r) {
        s[r] += sQ[(wrow + r) * HS + d] * kd;
        dp[r] += sO[(wrow + r) * HS + d] * vd;
      }
    }
    const int key = k0 + lane;
    float ds[R];
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const float p = key <= q0 + wrow + r ? expf(s[r] * scale - L[r]) : 0.0f;
      ds[r] = p * (dp[r] - Dr[r]);
    }
#pragma unroll 8
    for (int j = 0; j < kFRows; ++j) {
      float dsj[R];
#pragma unroll
      for (int r = 0; r < R; ++r) dsj[r] = __shfl_sync(0xffffffffu, ds[r], j);
#pragma unroll
      for (int i = 0; i < kD; ++i) {
        const float kd = sK[j * P + G::chan(lane, i)];
#pragma unroll
        for (int r = 0; r < R; ++r) dq[r][i] += dsj[r] * kd;
      }
    }
  }

#pragma unroll
  for (int r = 0; r < R; ++r) {
    const int t = q0 + wrow + r;
    if (t >= Tn) continue;
    float* dst = dqkv + (size_t(b) * Tn + t) * ld + h * HS;
#pragma unroll
    for (int i = 0; i < kD; ++i)
      if (G::owns(lane, i)) dst[lane + kWarp * i] = dq[r][i] * scale;
  }
}

// ================================ shared by both ==================================================

// D[b, h, t] = dout_t . out_t over head h's channels. A group of HS / P lanes (P = elements per
// 16-byte packet) takes one row and reduces with xor shuffles, which never leave the group.
template <class T, int HS>
__global__ void attention_backward_rowdot(float* __restrict__ D, const T* __restrict__ dout, const T* __restrict__ out,
                                          int B, int Tn, int NH) {
  constexpr int P = Packed128<T>::size, kLanes = HS / P;
  static_assert(kLanes >= 1 && kLanes <= kWarp, "row must fit in one warp");
  const size_t gid = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const size_t row = gid / kLanes, rows = size_t(B) * Tn * NH;  // row = (b * Tn + t) * NH + h
  const int part = int(gid % kLanes);
  float acc = 0.0f;
  if (row < rows) {
    const size_t off = row * HS + part * P;  // (b, t, h*HS + ...) of a (B, T, NH*HS) tensor
    const Packed128<T> a = load128(dout + off), o = load128(out + off);
#pragma unroll
    for (int i = 0; i < P; ++i) acc += to_float(a[i]) * to_float(o[i]);
  }
#pragma unroll
  for (int s = kLanes / 2; s > 0; s >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, s);
  if (row < rows && part == 0) {
    const size_t bt = row / NH, h = row % NH, b = bt / Tn, t = bt % Tn;
    D[(b * NH + h) * Tn + t] = acc;
  }
}

// ================================ host side =======================================================

template <class T, int HS>
void backward_hs(T* dqkv, const T* dout, const T* qkv, const T* out, const float* lse, float* D, int B, int Tn, int C,
                 int NH, AttentionTcVariant variant, cudaStream_t stream) {
  constexpr int kRowdotThreads = 256;
  const size_t threads = size_t(B) * Tn * NH * (HS / Packed128<T>::size);
  attention_backward_rowdot<T, HS><<<ceil_div(threads, kRowdotThreads), kRowdotThreads, 0, stream>>>(D, dout, out, B,
                                                                                                     Tn, NH);
  ZT_CHECK_LAUNCH();
  if constexpr (std::is_same_v<T, float>) {
    const dim3 grid(B * NH, ceil_div(Tn, kFRows));
    const size_t smem_dkdv = sizeof(float) * (2 * kFRows * HS + 2 * kFRows * (HS + 1) + 2 * kFRows);
    auto dkdv = attention_backward_dkdv_f32<HS>;
    allow_smem(dkdv, smem_dkdv);
    dkdv<<<grid, kFThreads, smem_dkdv, stream>>>(dqkv, dout, qkv, lse, D, Tn, C, NH);
    ZT_CHECK_LAUNCH();
    const size_t smem_dq = sizeof(float) * (2 * kFRows * HS + 2 * kFRows * (HS + 1));
    auto dq = attention_backward_dq_f32<HS>;
    allow_smem(dq, smem_dq);
    dq<<<grid, kFThreads, smem_dq, stream>>>(dqkv, dout, qkv, lse, D, Tn, C, NH);
    ZT_CHECK_LAUNCH();
  } else {
    attention_detail::backward_tc<HS>(dqkv, dout, qkv, lse, D, B, Tn, C, NH, variant, stream);
  }
}

size_t align_up(size_t n, size_t a) { return (n + a - 1) / a * a; }

}  // namespace

// Scratch holds only D (B, NH, T) fp32: dQ is computed by its own pass, not accumulated.
size_t attention_backward_scratch_bytes(int B, int Tn, int C, int NH) {
  (void)C;
  return align_up(sizeof(float) * size_t(B) * NH * Tn, 256);
}

template <class T>
void attention_backward(T* dqkv, const T* dout, const T* qkv, const T* out, const float* lse, int B, int Tn, int C,
                        int NH, void* scratch, cudaStream_t stream, AttentionTcVariant variant) {
  const int hs = check_shape(B, Tn, C, NH);
  if (variant.warp_rows == 0) variant.warp_rows = kAttentionBackwardWarpRows;
  ZT_REQUIRE(variant.warp_rows == 16 || variant.warp_rows == 32,
             "attention: warp_rows " << variant.warp_rows << " (supported: 16, 32)");
  ZT_REQUIRE(aligned16(dqkv) && aligned16(dout) && aligned16(qkv) && aligned16(out) && aligned16(scratch),
             "attention: dqkv, dout, qkv, out and scratch must be 16-byte aligned");
  float* D = static_cast<float*>(scratch);
  switch (hs) {
    case 16: backward_hs<T, 16>(dqkv, dout, qkv, out, lse, D, B, Tn, C, NH, variant, stream); break;
    case 32: backward_hs<T, 32>(dqkv, dout, qkv, out, lse, D, B, Tn, C, NH, variant, stream); break;
    case 64: backward_hs<T, 64>(dqkv, dout, qkv, out, lse, D, B, Tn, C, NH, variant, stream); break;
    case 128: backward_hs<T, 128>(dqkv, dout, qkv, out, lse, D, B, Tn, C, NH, variant, stream); break;
  }
}

template void attention_backward<float>(float*, const float*, const float*, const float*, const float*, int, int, int,
                                        int, void*, cudaStream_t, AttentionTcVariant);
template void attention_backward<__nv_bfloat16>(__nv_bfloat16*, const __nv_bfloat16*, const __nv_bfloat16*,
                                                const __nv_bfloat16*, const float*, int, int, int, int, void*,
                                                cudaStream_t, AttentionTcVariant);

}  // namespace zt::cuda
