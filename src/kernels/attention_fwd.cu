// Causal flash attention, forward: the tensor-core (bf16) and SIMT (fp32) kernels and their launch.
// The algorithm and the layouts: attention_common.cuh.
#include "kernels/attention_common.cuh"

namespace zt::cuda {
namespace {

// ============================== tensor-core (bf16) ===============================================

// ---- forward ----------------------------------------------------------------------------------
// MT: 16-row m-tiles per warp (attention_common.cuh, "Warp rows"). blockIdx.x: tc_block().
template <int HS, int MT>
__global__ void __launch_bounds__(tc_threads(MT))
    attention_forward_tc(bf16* __restrict__ out, float* __restrict__ lse, const bf16* __restrict__ qkv, int Tn, int C,
                         int NH, bool heads_fastest) {
  using G = TcGeom<HS>;
  constexpr int kSub = G::kSub, S = G::kStride, kThreads = tc_threads(MT), kWarpRows = 16 * MT;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  bf16* sQ = reinterpret_cast<bf16*>(smem_raw);  // (64, HS); reused to stage the output
  bf16* sK = sQ + G::kTile;                      // 2 buffers
  bf16* sV = sK + 2 * G::kTile;                  // 2 buffers

  const TcBlock blk = tc_block(NH, (Tn + kTcRows - 1) / kTcRows, heads_fastest);
  const int b = blk.b, h = blk.h;
  const int qb = blk.last_first;  // the last query blocks see the most keys: start them first
  const int q0 = qb * kTcRows;
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp, g = lane / 4, tq = lane % 4;
  const int wrow = warp * kWarpRows;  // this warp's first row within the block
  int row[MT][2];                     // rows g and g + 8 of each of the warp's m-tiles
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) row[mt][0] = q0 + wrow + 16 * mt + g, row[mt][1] = row[mt][0] + 8;
  const int a_off = a_order_offset<HS>(lane), b_off = b_order_offset<HS>(lane);
  const size_t ld = 3 * size_t(C);
  const bf16* q = qkv + size_t(b) * Tn * ld + h * HS;
  const bf16* k = q + C;
  const bf16* v = q + 2 * C;
  const float sl2 = kLog2e / sqrtf(float(HS));  // scores in base-2 units

  tc_load_tile<HS, kThreads>(sQ, q, ld, q0, Tn);
  cp_async_commit();
  tc_load_tile<HS, kThreads>(sK, k, ld, 0, Tn);
  tc_load_tile<HS, kThreads>(sV, v, ld, 0, Tn);
  cp_async_commit();

  uint32_t qf[MT][HS / 16][4];  // this warp's query rows as A fragments, one per 16 channels
  float o[MT][HS / 8][4] = {};  // output accumulator: 16 rows x HS per m-tile, unnormalised
  float m[MT][2], l[MT][2];     // running max (base-2 units) of rows g and g + 8; running sum, this
                                // thread's columns only (reduced at the end)
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) m[mt][0] = m[mt][1] = -INFINITY, l[mt][0] = l[mt][1] = 0.0f;

  const int nkt = qb + 1;
  for (int kt = 0; kt < nkt; ++kt) {
    // Prefetch the next K/V tile into the other buffer (last read in iteration kt-1, which ended
    // with __syncthreads), then wait for this one. Always commit, so "all but the newest" is exact.
    if (kt + 1 < nkt) {
      tc_load_tile<HS, kThreads>(sK + ((kt + 1) & 1) * G::kTile, k, ld, (kt + 1) * kTcCols, Tn);
      tc_load_tile<HS, kThreads>(sV + ((kt + 1) & 1) * G::kTile, v, ld, (kt + 1) * kTcCols, Tn);
    }
    cp_async_commit();
    cp_async_wait_all_but_newest();
    __syncthreads();
    if (kt == 0) {
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int kc = 0; kc < HS / 16; ++kc) ldmatrix_x4(qf[mt][kc], sQ + (wrow + 16 * mt) * S + kc * 16 + a_off);
    }
    const bf16* kb = sK + (kt & 1) * G::kTile;
    const bf16* vb = sV + (kt & 1) * G::kTile;
    const int k0 = kt * kTcCols;
    const bool diag = kt == qb;  // k0 == q0: the only tile that needs the mask (and the only one past Tn)

#pragma unroll
    for (int c0 = 0; c0 < kTcCols; c0 += kSub) {
      // On the diagonal, 16-column chunks right of this warp's last row are fully masked: skip
      // their products (warp-uniform). Chunk n covers keys k0+c0+16n..+15, the warp's rows end at
      // q0+wrow+kWarpRows-1, so chunks n < (wrow + kWarpRows - c0) / 16 are needed. (With MT = 2 the
      // warp's first m-tile computes one chunk that its mask then removes entirely.)
      const int nch = diag ? min(kSub / 16, (wrow + kWarpRows - c0) / 16) : kSub / 16;
      if (nch <= 0) break;

      float s[MT][kSub / 8][4] = {};  // S = Q K^T for 16 rows x kSub keys per m-tile
#pragma unroll
      for (int kc = 0; kc < HS / 16; ++kc) {
#pragma unroll
        for (int n = 0; n < kSub / 16; ++n) {
          if (n < nch) {
            uint32_t kf[4];  // one read of K feeds MT m-tiles
            ldmatrix_x4(kf, kb + (c0 + n * 16) * S + kc * 16 + b_off);
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) {
              mma_16816(s[mt][2 * n], qf[mt][kc], kf[0], kf[1]);
              mma_16816(s[mt][2 * n + 1], qf[mt][kc], kf[2], kf[3]);
            }
          }
        }
      }
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        if (diag) {
#pragma unroll
          for (int nt = 0; nt < kSub / 8; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e)
              if (k0 + c0 + nt * 8 + 2 * tq + (e & 1) > row[mt][e >> 1]) s[mt][nt][e] = -INFINITY;
        }

        // Online softmax. The 4 threads of a quad (same g) hold all columns of rows g and g + 8.
        float alpha[2], base[2];
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          float mx = -INFINITY;
#pragma unroll
          for (int nt = 0; nt < kSub / 8; ++nt) mx = fmaxf(mx, fmaxf(s[mt][nt][2 * i], s[mt][nt][2 * i + 1]));
          mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
          mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
          const float m_new = fmaxf(m[mt][i], mx * sl2);
          base[i] = m_new == -INFINITY ? 0.0f : m_new;  // a row with nothing visible yet: no inf - inf
          alpha[i] = exp2f(m[mt][i] - base[i]);
          m[mt][i] = m_new;
          l[mt][i] *= alpha[i];
        }
#pragma unroll
        for (int dt = 0; dt < HS / 8; ++dt) {
          o[mt][dt][0] *= alpha[0];
          o[mt][dt][1] *= alpha[0];
          o[mt][dt][2] *= alpha[1];
          o[mt][dt][3] *= alpha[1];
        }
#pragma unroll
        for (int nt = 0; nt < kSub / 8; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            s[mt][nt][e] = exp2f(fmaf(s[mt][nt][e], sl2, -base[e >> 1]));
            l[mt][e >> 1] += s[mt][nt][e];
          }
      }

      // O += P V. V is stored [key][channel] = [k][n]: transposed ldmatrix, a-order.
#pragma unroll
      for (int kc = 0; kc < kSub / 16; ++kc) {
        if (kc < nch) {
          uint32_t pa[MT][4];
#pragma unroll
          for (int mt = 0; mt < MT; ++mt) acc_to_a(pa[mt], s[mt][2 * kc], s[mt][2 * kc + 1]);
#pragma unroll
          for (int dp = 0; dp < HS / 16; ++dp) {
            uint32_t vf[4];
            ldmatrix_x4_trans(vf, vb + (c0 + kc * 16) * S + dp * 16 + a_off);
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) {
              mma_16816(o[mt][2 * dp], pa[mt], vf[0], vf[1]);
              mma_16816(o[mt][2 * dp + 1], pa[mt], vf[2], vf[3]);
            }
          }
        }
      }
    }
    __syncthreads();  // everyone is done with buffer kt & 1 before iteration kt + 1 refills it
  }

  // Finish: full row sums, lse, normalised output. Stage the warp's output rows in its own rows of
  // sQ (only this warp ever read them, and its Q fragments are in registers) so that the global
  // stores are whole 16-byte packets.
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
    float inv[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      float sum = l[mt][i];
      sum += __shfl_xor_sync(0xffffffffu, sum, 1);
      sum += __shfl_xor_sync(0xffffffffu, sum, 2);
      inv[i] = 1.0f / sum;
      // An explicit FMA: left to the compiler, contraction differed between the MT = 1 and MT = 2
      // instantiations on an H100 (lse off by an ulp; the variants must agree bit for bit).
      if (tq == 0 && row[mt][i] < Tn) lse[(size_t(b) * NH + h) * Tn + row[mt][i]] = fmaf(m[mt][i], kLn2, logf(sum));
    }
#pragma unroll
    for (int dt = 0; dt < HS / 8; ++dt)
#pragma unroll
      for (int i = 0; i < 2; ++i)
        *reinterpret_cast<__nv_bfloat162*>(sQ + (wrow + 16 * mt + g + 8 * i) * S + dt * 8 + 2 * tq) =
            __floats2bfloat162_rn(o[mt][dt][2 * i] * inv[i], o[mt][dt][2 * i + 1] * inv[i]);
  }
  __syncwarp();
  constexpr int kChunks = HS / 8;
  for (int i = lane; i < kWarpRows * kChunks; i += kWarp) {
    const int r = i / kChunks, c = i % kChunks, t = q0 + wrow + r;
    if (t < Tn)
      store128(out + (size_t(b) * Tn + t) * C + h * HS + c * 8, load128(sQ + (wrow + r) * S + c * 8));
  }
}

// ================================ fp32 SIMT =======================================================

template <int HS>
__global__ void __launch_bounds__(kFThreads, 1)
    attention_forward_f32(float* __restrict__ out, float* __restrict__ lse, const float* __restrict__ qkv, int Tn,
                          int C, int NH) {
  using G = F32Geom<HS>;
  constexpr int kD = G::kD, P = G::kPad, R = kFRowsPerWarp;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  float* sQ = reinterpret_cast<float*>(smem_raw);  // (32, HS)      rows read as broadcasts
  float* sK = sQ + kFRows * HS;                     // (32, HS + 1)  row = lane
  float* sV = sK + kFRows * P;                      // (32, HS)      channel = lane

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
  float acc[R][kD] = {};
  float m[R], l[R];  // running max (scaled scores) and this lane's share of the running sum
#pragma unroll
  for (int r = 0; r < R; ++r) m[r] = -INFINITY, l[r] = 0.0f;

  for (int kt = 0; kt <= qb; ++kt) {
    const int k0 = kt * kFRows;
    __syncthreads();  // the previous tile is fully consumed
    f32_load_tile<HS>(sK, P, k, ld, k0, Tn);
    f32_load_tile<HS>(sV, HS, v, ld, k0, Tn);
    __syncthreads();

    float s[R] = {};
#pragma unroll 16
    for (int d = 0; d < HS; ++d) {
      const float kd = sK[lane * P + d];
#pragma unroll
      for (int r = 0; r < R; ++r) s[r] += sQ[(wrow + r) * HS + d] * kd;
    }
    const int key = k0 + lane;
    float p[R];
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const float x = key <= q0 + wrow + r ? s[r] * scale : -INFINITY;
      const float m_new = fmaxf(m[r], warp_max(x));
      const float base = m_new == -INFINITY ? 0.0f : m_new;
      const float alpha = expf(m[r] - base);
      p[r] = expf(x - base);
      l[r] = l[r] * alpha + p[r];
      m[r] = m_new;
#pragma unroll
      for (int i = 0; i < kD; ++i) acc[r][i] *= alpha;
    }
#pragma unroll 8
    for (int j = 0; j < kFRows; ++j) {
      float pj[R];
#pragma unroll
      for (int r = 0; r < R; ++r) pj[r] = __shfl_sync(0xffffffffu, p[r], j);
#pragma unroll
      for (int i = 0; i < kD; ++i) {
        const float vd = sV[j * HS + G::chan(lane, i)];
#pragma unroll
        for (int r = 0; r < R; ++r) acc[r][i] += pj[r] * vd;
      }
    }
  }

#pragma unroll
  for (int r = 0; r < R; ++r) {
    const int t = q0 + wrow + r;
    const float sum = warp_sum(l[r]);
    if (t >= Tn) continue;
#pragma unroll
    for (int i = 0; i < kD; ++i)
      if (G::owns(lane, i)) out[(size_t(b) * Tn + t) * C + h * HS + lane + kWarp * i] = acc[r][i] / sum;
    if (lane == 0) lse[(size_t(b) * NH + h) * Tn + t] = m[r] + logf(sum);
  }
}

// ================================ host side =======================================================

template <class T, int HS>
void forward_hs(T* out, float* lse, const T* qkv, int B, int Tn, int C, int NH, AttentionTcVariant variant,
                cudaStream_t stream) {
  if constexpr (std::is_same_v<T, float>) {
    const size_t smem = sizeof(float) * (2 * kFRows * HS + kFRows * (HS + 1));
    auto kernel = attention_forward_f32<HS>;
    allow_smem(kernel, smem);
    kernel<<<dim3(B * NH, ceil_div(Tn, kFRows)), kFThreads, smem, stream>>>(out, lse, qkv, Tn, C, NH);
  } else {
    const size_t smem = sizeof(bf16) * 5 * TcGeom<HS>::kTile;
    const int nblocks = tc_grid_blocks(B, NH, Tn);
    if constexpr (tc_has_warp_rows_32(HS)) {
      if (variant.warp_rows == 32) {
        auto kernel = attention_forward_tc<HS, 2>;
        allow_smem(kernel, smem);
        kernel<<<nblocks, tc_threads(2), smem, stream>>>(out, lse, qkv, Tn, C, NH, variant.heads_fastest);
        ZT_CHECK_LAUNCH();
        return;
      }
    }
    auto kernel = attention_forward_tc<HS, 1>;
    allow_smem(kernel, smem);
    kernel<<<nblocks, tc_threads(1), smem, stream>>>(out, lse, qkv, Tn, C, NH, variant.heads_fastest);
  }
  ZT_CHECK_LAUNCH();
}

}  // namespace

template <class T>
void attention_forward(T* out, float* lse, const T* qkv, int B, int Tn, int C, int NH, cudaStream_t stream,
                       AttentionTcVariant variant) {
  const int hs = check_shape(B, Tn, C, NH);
  if (variant.warp_rows == 0) variant.warp_rows = kAttentionForwardWarpRows;
  ZT_REQUIRE(variant.warp_rows == 16 || variant.warp_rows == 32,
             "attention: warp_rows " << variant.warp_rows << " (supported: 16, 32)");
  ZT_REQUIRE(aligned16(out) && aligned16(qkv), "attention: out and qkv must be 16-byte aligned");
  switch (hs) {
    case 16: forward_hs<T, 16>(out, lse, qkv, B, Tn, C, NH, variant, stream); break;
    case 32: forward_hs<T, 32>(out, lse, qkv, B, Tn, C, NH, variant, stream); break;
    case 64: forward_hs<T, 64>(out, lse, qkv, B, Tn, C, NH, variant, stream); break;
    case 128: forward_hs<T, 128>(out, lse, qkv, B, Tn, C, NH, variant, stream); break;
  }
}

template void attention_forward<float>(float*, float*, const float*, int, int, int, int, cudaStream_t,
                                        AttentionTcVariant);
template void attention_forward<__nv_bfloat16>(__nv_bfloat16*, float*, const __nv_bfloat16*, int, int, int, int,
                                               cudaStream_t, AttentionTcVariant);

}  // namespace zt::cuda
