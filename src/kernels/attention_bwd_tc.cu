// Causal flash attention, backward on tensor cores (bf16): the dK/dV pass and the dQ pass, and their
// launch (called by attention_bwd.cu after D = rowsum(dO * O)). Algorithm and layouts:
// attention_common.cuh.
#include "kernels/attention_common.cuh"

namespace zt::cuda {
namespace {

// Register budget with MT = 2 (two m-tiles per warp): the dK/dV and dQ accumulators double, so the
// tile of S / dP held at once shrinks to 32 columns and the dK/dV pass re-reads its K/V fragments
// from shared memory. The order in which every accumulator sums its contributions is unchanged
// (query chunks, then channel chunks, ascending), so the results are bit-identical to MT = 1.
template <int HS, int MT> struct TcBwd {
  static constexpr int kSub = MT == 1 ? TcGeom<HS>::kSub : 32;
  static constexpr bool kKvFragsInRegs = MT == 1 && TcGeom<HS>::kRowFragsInRegs;  // dK/dV pass
  static constexpr bool kQoFragsInRegs = TcGeom<HS>::kRowFragsInRegs;             // dQ pass
};

// ---- backward: dK, dV (one block per 64 keys) ----------------------------------------------------
template <int HS, int MT>
__global__ void __launch_bounds__(tc_threads(MT))
    attention_backward_dkdv_tc(bf16* __restrict__ dqkv, const bf16* __restrict__ dout, const bf16* __restrict__ qkv,
                               const float* __restrict__ lse, const float* __restrict__ D, int Tn, int C, int NH,
                               bool heads_fastest) {
  using G = TcGeom<HS>;
  constexpr int kSub = TcBwd<HS, MT>::kSub, S = G::kStride, kThreads = tc_threads(MT), kWarpRows = 16 * MT;
  constexpr bool kFragsInRegs = TcBwd<HS, MT>::kKvFragsInRegs;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  bf16* sK = reinterpret_cast<bf16*>(smem_raw);  // (64, HS) this block's keys
  bf16* sV = sK + G::kTile;                      // (64, HS) this block's values
  bf16* sQ = sV + G::kTile;                      // 2 buffers
  bf16* sO = sQ + 2 * G::kTile;                  // dO, 2 buffers
  float* sL = reinterpret_cast<float*>(sO + 2 * G::kTile);  // lse, 2 x 64
  float* sD = sL + 2 * kTcCols;                             // D, 2 x 64

  const int nqt = (Tn + kTcRows - 1) / kTcRows;
  const TcBlock blk = tc_block(NH, nqt, heads_fastest);
  const int b = blk.b, h = blk.h;
  const int kb = nqt - 1 - blk.last_first;  // key block 0 sees every query tile: start it first
  const int k0 = kb * kTcRows;
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp, g = lane / 4, tq = lane % 4;
  const int wrow = warp * kWarpRows;
  int key[MT][2];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) key[mt][0] = k0 + wrow + 16 * mt + g, key[mt][1] = key[mt][0] + 8;
  const int a_off = a_order_offset<HS>(lane), b_off = b_order_offset<HS>(lane);
  const size_t ld = 3 * size_t(C);
  const bf16* q = qkv + size_t(b) * Tn * ld + h * HS;
  const bf16* k = q + C;
  const bf16* v = q + 2 * C;
  const bf16* dO = dout + size_t(b) * Tn * C + h * HS;
  const float* lse_bh = lse + (size_t(b) * NH + h) * Tn;
  const float* D_bh = D + (size_t(b) * NH + h) * Tn;
  const float scale = 1.0f / sqrtf(float(HS)), sl2 = scale * kLog2e;

  auto load_query_tile = [&](int qt, int buf) {
    const int t0 = qt * kTcCols;
    tc_load_tile<HS, kThreads>(sQ + buf * G::kTile, q, ld, t0, Tn);
    tc_load_tile<HS, kThreads>(sO + buf * G::kTile, dO, C, t0, Tn);
    for (int i = threadIdx.x; i < 2 * kTcCols; i += kThreads) {  // lse then D, one float each
      const int j = i % kTcCols, t = t0 + j;
      const bool valid = t < Tn;
      if (i < kTcCols) cp_async4(sL + buf * kTcCols + j, lse_bh + (valid ? t : 0), valid);
      else             cp_async4(sD + buf * kTcCols + j, D_bh + (valid ? t : 0), valid);
    }
  };

  tc_load_tile<HS, kThreads>(sK, k, ld, k0, Tn);
  tc_load_tile<HS, kThreads>(sV, v, ld, k0, Tn);
  cp_async_commit();
  load_query_tile(kb, 0);
  cp_async_commit();

  uint32_t kf[kFragsInRegs ? MT : 1][kFragsInRegs ? HS / 16 : 1][4];  // this warp's keys / values
  uint32_t vf[kFragsInRegs ? MT : 1][kFragsInRegs ? HS / 16 : 1][4];  // as A fragments
  float dk[MT][HS / 8][4] = {}, dv[MT][HS / 8][4] = {};

  for (int qt = kb; qt < nqt; ++qt) {
    const int buf = (qt - kb) & 1;
    if (qt + 1 < nqt) load_query_tile(qt + 1, buf ^ 1);
    cp_async_commit();
    cp_async_wait_all_but_newest();
    __syncthreads();
    if constexpr (kFragsInRegs) {
      if (qt == kb) {
#pragma unroll
        for (int kc = 0; kc < HS / 16; ++kc) {
          ldmatrix_x4(kf[0][kc], sK + wrow * S + kc * 16 + a_off);
          ldmatrix_x4(vf[0][kc], sV + wrow * S + kc * 16 + a_off);
        }
      }
    }
    const bf16* qbuf = sQ + buf * G::kTile;
    const bf16* obuf = sO + buf * G::kTile;
    const float* Lb = sL + buf * kTcCols;
    const float* Db = sD + buf * kTcCols;
    const int q0 = qt * kTcCols;
    const bool diag = qt == kb;             // q0 == k0
    const bool tail = q0 + kTcCols > Tn;    // the last tile: queries past Tn must not count

#pragma unroll
    for (int c0 = 0; c0 < kTcCols; c0 += kSub) {
      // On the diagonal, 16-query chunks entirely before this warp's first key see none of its
      // keys: chunks n < (wrow - c0) / 16 are skipped (warp-uniform).
      const int first = diag ? max(0, (wrow - c0) / 16) : 0;
      if (first >= kSub / 16) continue;

      float s[MT][kSub / 8][4] = {};   // S^T  = K Q^T   (16 keys x kSub queries per m-tile)
      float dp[MT][kSub / 8][4] = {};  // dP^T = V dO^T
#pragma unroll
      for (int kc = 0; kc < HS / 16; ++kc) {
        uint32_t ka[MT][4], va[MT][4];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          if constexpr (kFragsInRegs) {
#pragma unroll
            for (int r = 0; r < 4; ++r) ka[mt][r] = kf[0][kc][r], va[mt][r] = vf[0][kc][r];
          } else {
            ldmatrix_x4(ka[mt], sK + (wrow + 16 * mt) * S + kc * 16 + a_off);
            ldmatrix_x4(va[mt], sV + (wrow + 16 * mt) * S + kc * 16 + a_off);
          }
        }
#pragma unroll
        for (int n = 0; n < kSub / 16; ++n) {
          if (n >= first) {
            uint32_t bq[4], bo[4];  // Q and dO are stored [query][channel] = [n][k]: plain, b-order
            ldmatrix_x4(bq, qbuf + (c0 + n * 16) * S + kc * 16 + b_off);
            ldmatrix_x4(bo, obuf + (c0 + n * 16) * S + kc * 16 + b_off);
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) {
              mma_16816(s[mt][2 * n], ka[mt], bq[0], bq[1]);
              mma_16816(s[mt][2 * n + 1], ka[mt], bq[2], bq[3]);
              mma_16816(dp[mt][2 * n], va[mt], bo[0], bo[1]);
              mma_16816(dp[mt][2 * n + 1], va[mt], bo[2], bo[3]);
            }
          }
        }
      }
      // P^T = exp(S^T * scale - lse[query]) and dS^T = P^T * (dP^T - D[query]), masked causally
      // (query < key) and past the end (query >= Tn). Skipped chunks hold zeros that the mask
      // (diagonal) removes; they are skipped below too.
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int nt = 0; nt < kSub / 8; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int qi = c0 + nt * 8 + 2 * tq + (e & 1), query = q0 + qi;
            float p = exp2f(fmaf(s[mt][nt][e], sl2, -Lb[qi] * kLog2e));
            if ((diag || tail) && (query < key[mt][e >> 1] || query >= Tn)) p = 0.0f;
            s[mt][nt][e] = p;
            dp[mt][nt][e] = p * (dp[mt][nt][e] - Db[qi]);
          }
      // dV += P^T dO and dK += dS^T Q: k runs over queries; dO and Q are stored [k][n]: transposed.
#pragma unroll
      for (int kc = 0; kc < kSub / 16; ++kc) {
        if (kc >= first) {
          uint32_t pa[MT][4], dsa[MT][4];
#pragma unroll
          for (int mt = 0; mt < MT; ++mt) {
            acc_to_a(pa[mt], s[mt][2 * kc], s[mt][2 * kc + 1]);
            acc_to_a(dsa[mt], dp[mt][2 * kc], dp[mt][2 * kc + 1]);
          }
#pragma unroll
          for (int dc = 0; dc < HS / 16; ++dc) {
            uint32_t bo[4], bq[4];
            ldmatrix_x4_trans(bo, obuf + (c0 + kc * 16) * S + dc * 16 + a_off);
            ldmatrix_x4_trans(bq, qbuf + (c0 + kc * 16) * S + dc * 16 + a_off);
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) {
              mma_16816(dv[mt][2 * dc], pa[mt], bo[0], bo[1]);
              mma_16816(dv[mt][2 * dc + 1], pa[mt], bo[2], bo[3]);
              mma_16816(dk[mt][2 * dc], dsa[mt], bq[0], bq[1]);
              mma_16816(dk[mt][2 * dc + 1], dsa[mt], bq[2], bq[3]);
            }
          }
        }
      }
    }
    __syncthreads();  // everyone is done with `buf` before the next iteration refills it
  }

  // dk, dv = (one owner per element: every key row of the head is some block's, written once).
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int dt = 0; dt < HS / 8; ++dt)
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        if (key[mt][i] >= Tn) continue;
        bf16* dst = dqkv + (size_t(b) * Tn + key[mt][i]) * ld + C + h * HS + dt * 8 + 2 * tq;
        *reinterpret_cast<__nv_bfloat162*>(dst) =
            __floats2bfloat162_rn(dk[mt][dt][2 * i] * scale, dk[mt][dt][2 * i + 1] * scale);
        *reinterpret_cast<__nv_bfloat162*>(dst + C) = __floats2bfloat162_rn(dv[mt][dt][2 * i], dv[mt][dt][2 * i + 1]);
      }
}

// ---- backward: dQ (one block per 64 queries; the forward's loop with lse known) ------------------
template <int HS, int MT>
__global__ void __launch_bounds__(tc_threads(MT))
    attention_backward_dq_tc(bf16* __restrict__ dqkv, const bf16* __restrict__ dout, const bf16* __restrict__ qkv,
                             const float* __restrict__ lse, const float* __restrict__ D, int Tn, int C, int NH,
                             bool heads_fastest) {
  using G = TcGeom<HS>;
  constexpr int kSub = TcBwd<HS, MT>::kSub, S = G::kStride, kThreads = tc_threads(MT), kWarpRows = 16 * MT;
  constexpr bool kFragsInRegs = TcBwd<HS, MT>::kQoFragsInRegs;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  bf16* sQ = reinterpret_cast<bf16*>(smem_raw);  // (64, HS)
  bf16* sO = sQ + G::kTile;                      // dO (64, HS)
  bf16* sK = sO + G::kTile;                      // 2 buffers
  bf16* sV = sK + 2 * G::kTile;                  // 2 buffers

  const TcBlock blk = tc_block(NH, (Tn + kTcRows - 1) / kTcRows, heads_fastest);
  const int b = blk.b, h = blk.h;
  const int qb = blk.last_first;
  const int q0 = qb * kTcRows;
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp, g = lane / 4, tq = lane % 4;
  const int wrow = warp * kWarpRows;
  int row[MT][2];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) row[mt][0] = q0 + wrow + 16 * mt + g, row[mt][1] = row[mt][0] + 8;
  const int a_off = a_order_offset<HS>(lane), b_off = b_order_offset<HS>(lane);
  const size_t ld = 3 * size_t(C);
  const bf16* q = qkv + size_t(b) * Tn * ld + h * HS;
  const bf16* k = q + C;
  const bf16* v = q + 2 * C;
  const float scale = 1.0f / sqrtf(float(HS)), sl2 = scale * kLog2e;

  float lse2[MT][2], Dr[MT][2];  // per row: lse in base-2 units, D
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const size_t idx = (size_t(b) * NH + h) * Tn + row[mt][i];
      lse2[mt][i] = row[mt][i] < Tn ? lse[idx] * kLog2e : 0.0f;
      Dr[mt][i] = row[mt][i] < Tn ? D[idx] : 0.0f;
    }

  tc_load_tile<HS, kThreads>(sQ, q, ld, q0, Tn);
  tc_load_tile<HS, kThreads>(sO, dout + size_t(b) * Tn * C + h * HS, C, q0, Tn);
  cp_async_commit();
  tc_load_tile<HS, kThreads>(sK, k, ld, 0, Tn);
  tc_load_tile<HS, kThreads>(sV, v, ld, 0, Tn);
  cp_async_commit();

  uint32_t qf[kFragsInRegs ? MT : 1][kFragsInRegs ? HS / 16 : 1][4];  // this warp's Q and dO rows
  uint32_t of[kFragsInRegs ? MT : 1][kFragsInRegs ? HS / 16 : 1][4];  // as A fragments
  float dq[MT][HS / 8][4] = {};

  const int nkt = qb + 1;
  for (int kt = 0; kt < nkt; ++kt) {
    if (kt + 1 < nkt) {
      tc_load_tile<HS, kThreads>(sK + ((kt + 1) & 1) * G::kTile, k, ld, (kt + 1) * kTcCols, Tn);
      tc_load_tile<HS, kThreads>(sV + ((kt + 1) & 1) * G::kTile, v, ld, (kt + 1) * kTcCols, Tn);
    }
    cp_async_commit();
    cp_async_wait_all_but_newest();
    __syncthreads();
    if constexpr (kFragsInRegs) {
      if (kt == 0) {
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
          for (int kc = 0; kc < HS / 16; ++kc) {
            ldmatrix_x4(qf[mt][kc], sQ + (wrow + 16 * mt) * S + kc * 16 + a_off);
            ldmatrix_x4(of[mt][kc], sO + (wrow + 16 * mt) * S + kc * 16 + a_off);
          }
      }
    }
    const bf16* kb = sK + (kt & 1) * G::kTile;
    const bf16* vb = sV + (kt & 1) * G::kTile;
    const int k0 = kt * kTcCols;
    const bool diag = kt == qb;

#pragma unroll
    for (int c0 = 0; c0 < kTcCols; c0 += kSub) {
      const int nch = diag ? min(kSub / 16, (wrow + kWarpRows - c0) / 16) : kSub / 16;  // as in the forward
      if (nch <= 0) break;

      float s[MT][kSub / 8][4] = {};   // S  = Q K^T   (16 queries x kSub keys per m-tile)
      float dp[MT][kSub / 8][4] = {};  // dP = dO V^T
#pragma unroll
      for (int kc = 0; kc < HS / 16; ++kc) {
        uint32_t qa[MT][4], oa[MT][4];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          if constexpr (kFragsInRegs) {
#pragma unroll
            for (int r = 0; r < 4; ++r) qa[mt][r] = qf[mt][kc][r], oa[mt][r] = of[mt][kc][r];
          } else {
            ldmatrix_x4(qa[mt], sQ + (wrow + 16 * mt) * S + kc * 16 + a_off);
            ldmatrix_x4(oa[mt], sO + (wrow + 16 * mt) * S + kc * 16 + a_off);
          }
        }
#pragma unroll
        for (int n = 0; n < kSub / 16; ++n) {
          if (n < nch) {
            uint32_t bk[4], bv[4];
            ldmatrix_x4(bk, kb + (c0 + n * 16) * S + kc * 16 + b_off);
            ldmatrix_x4(bv, vb + (c0 + n * 16) * S + kc * 16 + b_off);
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) {
              mma_16816(s[mt][2 * n], qa[mt], bk[0], bk[1]);
              mma_16816(s[mt][2 * n + 1], qa[mt], bk[2], bk[3]);
              mma_16816(dp[mt][2 * n], oa[mt], bv[0], bv[1]);
              mma_16816(dp[mt][2 * n + 1], oa[mt], bv[2], bv[3]);
            }
          }
        }
      }
      // dS = P * (dP - D), P recomputed from lse; causal mask on the diagonal (which also removes
      // keys past Tn for every real row). dS overwrites dp.
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int nt = 0; nt < kSub / 8; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            float p = exp2f(fmaf(s[mt][nt][e], sl2, -lse2[mt][e >> 1]));
            if (diag && k0 + c0 + nt * 8 + 2 * tq + (e & 1) > row[mt][e >> 1]) p = 0.0f;
            dp[mt][nt][e] = p * (dp[mt][nt][e] - Dr[mt][e >> 1]);
          }
      // dQ += dS K. K is stored [key][channel] = [k][n]: transposed, a-order.
#pragma unroll
      for (int kc = 0; kc < kSub / 16; ++kc) {
        if (kc < nch) {
          uint32_t dsa[MT][4];
#pragma unroll
          for (int mt = 0; mt < MT; ++mt) acc_to_a(dsa[mt], dp[mt][2 * kc], dp[mt][2 * kc + 1]);
#pragma unroll
          for (int dc = 0; dc < HS / 16; ++dc) {
            uint32_t bk[4];
            ldmatrix_x4_trans(bk, kb + (c0 + kc * 16) * S + dc * 16 + a_off);
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) {
              mma_16816(dq[mt][2 * dc], dsa[mt], bk[0], bk[1]);
              mma_16816(dq[mt][2 * dc + 1], dsa[mt], bk[2], bk[3]);
            }
          }
        }
      }
    }
    __syncthreads();
  }

#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int dt = 0; dt < HS / 8; ++dt)
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        if (row[mt][i] >= Tn) continue;
        __nv_bfloat162* p = reinterpret_cast<__nv_bfloat162*>(dqkv + (size_t(b) * Tn + row[mt][i]) * ld + h * HS +
                                                              dt * 8 + 2 * tq);
        *p = __floats2bfloat162_rn(dq[mt][dt][2 * i] * scale, dq[mt][dt][2 * i + 1] * scale);
      }
}

template <int HS, int MT>
void launch_backward_tc(bf16* dqkv, const bf16* dout, const bf16* qkv, const float* lse, const float* D, int B,
                        int Tn, int C, int NH, bool heads_fastest, cudaStream_t stream) {
  const int nblocks = tc_grid_blocks(B, NH, Tn);
  const size_t smem_dkdv = sizeof(bf16) * 6 * TcGeom<HS>::kTile + sizeof(float) * 4 * kTcCols;
  auto dkdv = attention_backward_dkdv_tc<HS, MT>;
  allow_smem(dkdv, smem_dkdv);
  dkdv<<<nblocks, tc_threads(MT), smem_dkdv, stream>>>(dqkv, dout, qkv, lse, D, Tn, C, NH, heads_fastest);
  ZT_CHECK_LAUNCH();
  const size_t smem_dq = sizeof(bf16) * 6 * TcGeom<HS>::kTile;
  auto dq = attention_backward_dq_tc<HS, MT>;
  allow_smem(dq, smem_dq);
  dq<<<nblocks, tc_threads(MT), smem_dq, stream>>>(dqkv, dout, qkv, lse, D, Tn, C, NH, heads_fastest);
  ZT_CHECK_LAUNCH();
}

}  // namespace

namespace attention_detail {

template <int HS>
void backward_tc(bf16* dqkv, const bf16* dout, const bf16* qkv, const float* lse, const float* D, int B, int Tn,
                 int C, int NH, AttentionTcVariant variant, cudaStream_t stream) {
  if constexpr (tc_has_warp_rows_32(HS)) {
    if (variant.warp_rows == 32)
      return launch_backward_tc<HS, 2>(dqkv, dout, qkv, lse, D, B, Tn, C, NH, variant.heads_fastest, stream);
  }
  launch_backward_tc<HS, 1>(dqkv, dout, qkv, lse, D, B, Tn, C, NH, variant.heads_fastest, stream);
}

#define ZT_BACKWARD_TC(HS)                                                                                        \
  template void backward_tc<HS>(bf16*, const bf16*, const bf16*, const float*, const float*, int, int, int, int, \
                                AttentionTcVariant, cudaStream_t);
ZT_BACKWARD_TC(16)
ZT_BACKWARD_TC(32)
ZT_BACKWARD_TC(64)
ZT_BACKWARD_TC(128)
#undef ZT_BACKWARD_TC

}  // namespace attention_detail

}  // namespace zt::cuda
