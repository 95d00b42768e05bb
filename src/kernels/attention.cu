// Causal flash attention, CUDA version (see attention.cpp for the reference and the formulas).
//
// Nothing of size (T,T) ever reaches global memory: forward keeps a running (max, sum) per query
// row (online softmax) and stores only lse; backward recomputes P = exp(S * scale - lse) tile by
// tile. One thread block works on one (batch b, head h) and one block of rows; blockIdx.x is
// (b, h), blockIdx.y the row block, ordered so that the blocks with the most work start first.
//
//   Forward, and backward's dQ pass (rows = queries, they walk the key tiles left of the diagonal):
//
//              keys ->  tile 0   tile 1   tile 2   tile 3
//   query block 0     [ diag ]                                  a block loads its query rows once,
//   query block 1     [      ] [ diag ]                         then streams K/V tiles 0..diag
//   query block 2     [      ] [      ] [ diag ]                through shared memory (double
//   query block 3     [      ] [      ] [      ] [ diag ]       buffered); only the diagonal tile
//                                                               needs the causal mask.
//   Backward's dK/dV pass (rows = keys, they walk the query tiles below the diagonal):
//
//              keys ->  blk 0    blk 1    blk 2    blk 3
//   query tile 0      [ diag ]    |        |        |           key block j loads its K, V rows
//   query tile 1      [      ] [ diag ]    |        |           once, then streams Q/dO tiles
//   query tile 2      [      ] [      ] [ diag ]    |           j..end (with their lse and D).
//   query tile 3      [      ] [      ] [      ] [ diag ]
//
// Inside a block every warp owns 16 (tensor-core kernels) or 4 (fp32 kernels) of the block's rows
// and the whole width of the streamed tile, so a warp's row statistics (max, sum, lse, D) never
// leave the warp and the only block-wide synchronisation is around the shared-memory tiles.
//
// Backward is deterministic, with no atomics: every element of dq, dk, dv has one owner thread
// that sums its contributions in a fixed order. The price is that dQ's pass recomputes S and dP
// (the dK/dV pass computes them too): 7 tile products instead of FlashAttention-2's 5 plus atomics.
//   kernel 1  D = rowsum(dO * O) for every (b, h, t) into scratch (fp32, B*NH*T floats)
//   kernel 2  dK, dV   (parallel over key blocks)
//   kernel 3  dQ       (parallel over query blocks)
// Kernels 2 and 3 write disjoint columns of dqkv, each with +=.
//
// Two implementations, picked by the element type:
//   bf16  tensor cores: mma.sync.m16n8k16 (bf16 in, fp32 accumulate) fed by ldmatrix from
//         shared memory, FlashAttention-2 style. 64 rows per block, 4 warps x 16 rows, tiles of
//         64 columns loaded with cp.async (double buffered). S, P, dP and dS stay in registers:
//         the fp32 accumulator layout of one m16n8 product, taken two at a time, is exactly the
//         bf16 A-operand layout of the next product, so P goes from softmax to P.V without shared
//         memory. Softmax runs in base 2 (exp2f(s * scale * log2e - m)), one FMA per element.
//   fp32  plain SIMT (the parity mode: no TF32, must match the CPU to ~1e-5). 32 rows per block,
//         8 warps x 4 rows, tiles of 32 columns: lane j handles column j for the scores, then
//         lane d handles output channel d (and d+32, ...) for the products with V, K, Q or dO.
// Head sizes 16, 32, 64 and 128 are compiled (a template parameter, so every loop over the head
// dimension unrolls and every fragment array is sized at compile time).
#include <cstdint>
#include <type_traits>

#include "kernels/attention.h"
#include "kernels/cuda_common.cuh"

namespace zt::cuda {
namespace {

using bf16 = __nv_bfloat16;
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;
constexpr size_t kDefaultSmem = 48 * 1024;  // above this a kernel must opt in to more shared memory

// ================================ PTX wrappers (sm_80+) ==========================================

#if ZT_EMU
// Emulation build (test/emu, never nvcc): the same instructions, implemented on the CPU from the
// PTX ISA semantics (warp-collective through the emulator's warp exchange; cp.async deferred until
// the wait, so a read before the wait sees stale shared memory as on the GPU).
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool valid) {
  zt_emu::cp_async(dst, src, 16, valid);
}
__device__ __forceinline__ void cp_async4(void* dst, const void* src, bool valid) {
  zt_emu::cp_async(dst, src, 4, valid);
}
__device__ __forceinline__ void cp_async_commit() { zt_emu::cp_async_commit(); }
__device__ __forceinline__ void cp_async_wait_all_but_newest() { zt_emu::cp_async_wait_group(1); }
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const bf16* p) { zt_emu::ldmatrix_x4(r, p, false); }
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const bf16* p) { zt_emu::ldmatrix_x4(r, p, true); }
__device__ __forceinline__ void mma_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  zt_emu::mma_m16n8k16_bf16_f32(d, a, b0, b1);
}
#else
__device__ __forceinline__ uint32_t smem_addr(const void* p) { return uint32_t(__cvta_generic_to_shared(p)); }

// 16-byte global -> shared copy that bypasses registers; valid == false writes 16 zero bytes
// (src-size 0), which is how rows past the end of the sequence become zeros.
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src),
               "r"(valid ? 16 : 0)
               : "memory");
}
__device__ __forceinline__ void cp_async4(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem_addr(dst)), "l"(src), "r"(valid ? 4 : 0)
               : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
// Waits until at most one committed group (the newest) is still in flight.
__device__ __forceinline__ void cp_async_wait_all_but_newest() { asm volatile("cp.async.wait_group 1;\n" ::: "memory"); }

// Four 8x8 bf16 matrices; lane l supplies the address of row (l % 8) of matrix (l / 8) and gets
// register i = elements (l / 4, 2 * (l % 4) + {0, 1}) of matrix i (transposed with .trans).
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const bf16* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p))
               : "memory");
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const bf16* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p))
               : "memory");
}

// d (16x8, fp32) += a (16x16, bf16, row-major) * b (16x8, bf16, "col": b0/b1 hold k = 0..7 / 8..15).
// Fragment layouts, with g = lane / 4 and q = lane % 4:
//   a[0] = A[g][2q..2q+1]   a[1] = A[g+8][2q..]   a[2] = A[g][2q+8..]   a[3] = A[g+8][2q+8..]
//   b0   = B[2q..2q+1][g]   b1   = B[2q+8..][g]
//   d[0..1] = D[g][2q..2q+1]   d[2..3] = D[g+8][2q..2q+1]
__device__ __forceinline__ void mma_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
#endif  // ZT_EMU

// Two fp32 values as one bf16x2 register; lo is the lower column (lower 16 bits), as in mma operands.
__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}

// The accumulators of two adjacent n8 tiles (columns 16c..16c+15 of a 16-row result) as the A
// operand of a product whose k runs over those 16 columns (see the layouts above mma_16816).
__device__ __forceinline__ void acc_to_a(uint32_t (&a)[4], const float (&lo)[4], const float (&hi)[4]) {
  a[0] = pack_bf16x2(lo[0], lo[1]);
  a[1] = pack_bf16x2(lo[2], lo[3]);
  a[2] = pack_bf16x2(hi[0], hi[1]);
  a[3] = pack_bf16x2(hi[2], hi[3]);
}

// ============================== tensor-core (bf16) kernels =======================================

constexpr int kTcRows = 64;     // rows per block (queries, or keys in the dK/dV pass)
constexpr int kTcCols = 64;     // columns per streamed tile (equal to kTcRows: tiles line up with the diagonal)
constexpr int kTcThreads = 128; // 4 warps x 16 rows
static_assert(kTcRows == kTcCols, "the diagonal tile must start where the block's rows start (k0 == q0)");

template <int HS>
struct TcGeom {
  // +8 elements (16 bytes) per row: the 8 row addresses of one ldmatrix fall in 8 different
  // 4-bank groups for every HS here, so shared-memory reads are conflict-free.
  static constexpr int kStride = HS + 8;
  static constexpr int kTile = kTcRows * kStride;  // elements of one (64, HS) tile
  // Columns of S / dP held in registers at once. 64 would need 2 x 32 fp32 registers for S and
  // dP on top of HS/2-register accumulators; at HS = 128 the tile is done in two halves instead.
  static constexpr int kSub = HS <= 64 ? 64 : 32;
  // Whether the row operands (Q, dO in the dQ pass; K, V in the dK/dV pass) live in registers for
  // the whole kernel or are re-read from shared memory (HS = 128: registers are too scarce).
  static constexpr bool kRowFragsInRegs = HS <= 64;
};

// Rows r0..r0+63 of a (Tn, HS) slice with row stride ld (elements) into a padded shared tile;
// rows >= Tn become zeros. All threads of the block take part; completion via cp.async groups.
template <int HS>
__device__ __forceinline__ void tc_load_tile(bf16* dst, const bf16* src, size_t ld, int r0, int Tn) {
  constexpr int kChunks = HS / 8;  // 16-byte chunks per row
  for (int i = threadIdx.x; i < kTcRows * kChunks; i += kTcThreads) {
    const int r = i / kChunks, c = i % kChunks, row = r0 + r;
    const bool valid = row < Tn;
    cp_async16(dst + r * TcGeom<HS>::kStride + c * 8, src + size_t(valid ? row : 0) * ld + c * 8, valid);
  }
}

// ldmatrix lane offsets inside a 16x16 block of a padded tile (see ldmatrix_x4):
//   a-order: matrices (rows 0-7, cols 0-7), (8-15, 0-7), (0-7, 8-15), (8-15, 8-15).
//            Plain: the A fragment of a row-major operand. Transposed, on a tile stored [k][n]:
//            the B fragments (b0, b1) of n8 tiles 0 and 1 as registers {0, 1} and {2, 3}.
//   b-order: matrices (0-7, 0-7), (0-7, 8-15), (8-15, 0-7), (8-15, 8-15).
//            Plain, on a tile stored [n][k]: B fragments of n8 tiles 0 and 1 as {0, 1} and {2, 3}.
template <int HS> __device__ __forceinline__ int a_order_offset(int lane) {
  return (lane & 15) * TcGeom<HS>::kStride + (lane >> 4) * 8;
}
template <int HS> __device__ __forceinline__ int b_order_offset(int lane) {
  return ((lane & 7) + ((lane >> 4) << 3)) * TcGeom<HS>::kStride + ((lane >> 3) & 1) * 8;
}

// ---- forward -----------------------------------------------------------------------------------
template <int HS>
__global__ void __launch_bounds__(kTcThreads)
    attention_forward_tc(bf16* __restrict__ out, float* __restrict__ lse, const bf16* __restrict__ qkv, int Tn, int C,
                         int NH) {
  using G = TcGeom<HS>;
  constexpr int kSub = G::kSub, S = G::kStride;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  bf16* sQ = reinterpret_cast<bf16*>(smem_raw);  // (64, HS); reused to stage the output
  bf16* sK = sQ + G::kTile;                      // 2 buffers
  bf16* sV = sK + 2 * G::kTile;                  // 2 buffers

  const int b = blockIdx.x / NH, h = blockIdx.x % NH;
  const int qb = gridDim.y - 1 - blockIdx.y;  // the last query blocks see the most keys: start them first
  const int q0 = qb * kTcRows;
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp, g = lane / 4, tq = lane % 4;
  const int wrow = warp * 16;  // this warp's rows within the block
  const int row[2] = {q0 + wrow + g, q0 + wrow + g + 8};
  const int a_off = a_order_offset<HS>(lane), b_off = b_order_offset<HS>(lane);
  const size_t ld = 3 * size_t(C);
  const bf16* q = qkv + size_t(b) * Tn * ld + h * HS;
  const bf16* k = q + C;
  const bf16* v = q + 2 * C;
  const float sl2 = kLog2e / sqrtf(float(HS));  // scores in base-2 units

  tc_load_tile<HS>(sQ, q, ld, q0, Tn);
  cp_async_commit();
  tc_load_tile<HS>(sK, k, ld, 0, Tn);
  tc_load_tile<HS>(sV, v, ld, 0, Tn);
  cp_async_commit();

  uint32_t qf[HS / 16][4];  // this warp's 16 query rows as A fragments, one per 16 channels
  float o[HS / 8][4] = {};  // output accumulator: 16 rows x HS, unnormalised
  float m[2] = {-INFINITY, -INFINITY};  // running max (base-2 units) of rows g and g + 8
  float l[2] = {0.0f, 0.0f};            // running sum, this thread's columns only (reduced at the end)

  const int nkt = qb + 1;
  for (int kt = 0; kt < nkt; ++kt) {
    // Prefetch the next K/V tile into the other buffer (last read in iteration kt-1, which ended
    // with __syncthreads), then wait for this one. Always commit, so "all but the newest" is exact.
    if (kt + 1 < nkt) {
      tc_load_tile<HS>(sK + ((kt + 1) & 1) * G::kTile, k, ld, (kt + 1) * kTcCols, Tn);
      tc_load_tile<HS>(sV + ((kt + 1) & 1) * G::kTile, v, ld, (kt + 1) * kTcCols, Tn);
    }
    cp_async_commit();
    cp_async_wait_all_but_newest();
    __syncthreads();
    if (kt == 0) {
#pragma unroll
      for (int kc = 0; kc < HS / 16; ++kc) ldmatrix_x4(qf[kc], sQ + wrow * S + kc * 16 + a_off);
    }
    const bf16* kb = sK + (kt & 1) * G::kTile;
    const bf16* vb = sV + (kt & 1) * G::kTile;
    const int k0 = kt * kTcCols;
    const bool diag = kt == qb;  // k0 == q0: the only tile that needs the mask (and the only one past Tn)

#pragma unroll
    for (int c0 = 0; c0 < kTcCols; c0 += kSub) {
      // On the diagonal, 16-column chunks right of this warp's last row are fully masked: skip
      // their products (warp-uniform). Chunk n covers keys k0+c0+16n..+15, the warp's rows end at
      // q0+wrow+15, so chunks n < (wrow + 16 - c0) / 16 are needed.
      const int nch = diag ? min(kSub / 16, (wrow + 16 - c0) / 16) : kSub / 16;
      if (nch <= 0) break;

      float s[kSub / 8][4] = {};  // S = Q K^T for 16 rows x kSub keys
#pragma unroll
      for (int kc = 0; kc < HS / 16; ++kc) {
#pragma unroll
        for (int n = 0; n < kSub / 16; ++n) {
          if (n < nch) {
            uint32_t kf[4];
            ldmatrix_x4(kf, kb + (c0 + n * 16) * S + kc * 16 + b_off);
            mma_16816(s[2 * n], qf[kc], kf[0], kf[1]);
            mma_16816(s[2 * n + 1], qf[kc], kf[2], kf[3]);
          }
        }
      }
      if (diag) {
#pragma unroll
        for (int nt = 0; nt < kSub / 8; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e)
            if (k0 + c0 + nt * 8 + 2 * tq + (e & 1) > row[e >> 1]) s[nt][e] = -INFINITY;
      }

      // Online softmax. The 4 threads of a quad (same g) hold all columns of rows g and g + 8.
      float alpha[2], base[2];
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        float mx = -INFINITY;
#pragma unroll
        for (int nt = 0; nt < kSub / 8; ++nt) mx = fmaxf(mx, fmaxf(s[nt][2 * i], s[nt][2 * i + 1]));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        const float m_new = fmaxf(m[i], mx * sl2);
        base[i] = m_new == -INFINITY ? 0.0f : m_new;  // a row with nothing visible yet: no inf - inf
        alpha[i] = exp2f(m[i] - base[i]);
        m[i] = m_new;
        l[i] *= alpha[i];
      }
#pragma unroll
      for (int dt = 0; dt < HS / 8; ++dt) {
        o[dt][0] *= alpha[0];
        o[dt][1] *= alpha[0];
        o[dt][2] *= alpha[1];
        o[dt][3] *= alpha[1];
      }
#pragma unroll
      for (int nt = 0; nt < kSub / 8; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          s[nt][e] = exp2f(fmaf(s[nt][e], sl2, -base[e >> 1]));
          l[e >> 1] += s[nt][e];
        }

      // O += P V. V is stored [key][channel] = [k][n]: transposed ldmatrix, a-order.
#pragma unroll
      for (int kc = 0; kc < kSub / 16; ++kc) {
        if (kc < nch) {
          uint32_t pa[4];
          acc_to_a(pa, s[2 * kc], s[2 * kc + 1]);
#pragma unroll
          for (int dp = 0; dp < HS / 16; ++dp) {
            uint32_t vf[4];
            ldmatrix_x4_trans(vf, vb + (c0 + kc * 16) * S + dp * 16 + a_off);
            mma_16816(o[2 * dp], pa, vf[0], vf[1]);
            mma_16816(o[2 * dp + 1], pa, vf[2], vf[3]);
          }
        }
      }
    }
    __syncthreads();  // everyone is done with buffer kt & 1 before iteration kt + 1 refills it
  }

  // Finish: full row sums, lse, normalised output. Stage the warp's 16 output rows in its own rows
  // of sQ (only this warp ever read them, and its Q fragments are in registers) so that the global
  // stores are whole 16-byte packets.
  float inv[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    l[i] += __shfl_xor_sync(0xffffffffu, l[i], 1);
    l[i] += __shfl_xor_sync(0xffffffffu, l[i], 2);
    inv[i] = 1.0f / l[i];
    if (tq == 0 && row[i] < Tn) lse[(size_t(b) * NH + h) * Tn + row[i]] = m[i] * kLn2 + logf(l[i]);
  }
#pragma unroll
  for (int dt = 0; dt < HS / 8; ++dt)
#pragma unroll
    for (int i = 0; i < 2; ++i)
      *reinterpret_cast<__nv_bfloat162*>(sQ + (wrow + g + 8 * i) * S + dt * 8 + 2 * tq) =
          __floats2bfloat162_rn(o[dt][2 * i] * inv[i], o[dt][2 * i + 1] * inv[i]);
  __syncwarp();
  constexpr int kChunks = HS / 8;
  for (int i = lane; i < 16 * kChunks; i += kWarp) {
    const int r = i / kChunks, c = i % kChunks, t = q0 + wrow + r;
    if (t < Tn)
      store128(out + (size_t(b) * Tn + t) * C + h * HS + c * 8, load128(sQ + (wrow + r) * S + c * 8));
  }
}

// ---- backward: dK, dV (one block per 64 keys) ----------------------------------------------------
template <int HS>
__global__ void __launch_bounds__(kTcThreads)
    attention_backward_dkdv_tc(bf16* __restrict__ dqkv, const bf16* __restrict__ dout, const bf16* __restrict__ qkv,
                               const float* __restrict__ lse, const float* __restrict__ D, int Tn, int C, int NH) {
  using G = TcGeom<HS>;
  constexpr int kSub = G::kSub, S = G::kStride;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  bf16* sK = reinterpret_cast<bf16*>(smem_raw);  // (64, HS) this block's keys
  bf16* sV = sK + G::kTile;                      // (64, HS) this block's values
  bf16* sQ = sV + G::kTile;                      // 2 buffers
  bf16* sO = sQ + 2 * G::kTile;                  // dO, 2 buffers
  float* sL = reinterpret_cast<float*>(sO + 2 * G::kTile);  // lse, 2 x 64
  float* sD = sL + 2 * kTcCols;                             // D, 2 x 64

  const int b = blockIdx.x / NH, h = blockIdx.x % NH;
  const int kb = blockIdx.y;  // key block 0 sees every query tile: start it first
  const int k0 = kb * kTcRows, nqt = gridDim.y;
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp, g = lane / 4, tq = lane % 4;
  const int wrow = warp * 16;
  const int key[2] = {k0 + wrow + g, k0 + wrow + g + 8};
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
    tc_load_tile<HS>(sQ + buf * G::kTile, q, ld, t0, Tn);
    tc_load_tile<HS>(sO + buf * G::kTile, dO, C, t0, Tn);
    const int i = threadIdx.x % kTcCols, t = t0 + i;
    const bool valid = t < Tn;
    if (threadIdx.x < kTcCols) cp_async4(sL + buf * kTcCols + i, lse_bh + (valid ? t : 0), valid);
    else                       cp_async4(sD + buf * kTcCols + i, D_bh + (valid ? t : 0), valid);
  };

  tc_load_tile<HS>(sK, k, ld, k0, Tn);
  tc_load_tile<HS>(sV, v, ld, k0, Tn);
  cp_async_commit();
  load_query_tile(kb, 0);
  cp_async_commit();

  uint32_t kf[G::kRowFragsInRegs ? HS / 16 : 1][4];  // this warp's 16 keys / values as A fragments
  uint32_t vf[G::kRowFragsInRegs ? HS / 16 : 1][4];
  float dk[HS / 8][4] = {}, dv[HS / 8][4] = {};

  for (int qt = kb; qt < nqt; ++qt) {
    const int buf = (qt - kb) & 1;
    if (qt + 1 < nqt) load_query_tile(qt + 1, buf ^ 1);
    cp_async_commit();
    cp_async_wait_all_but_newest();
    __syncthreads();
    if constexpr (G::kRowFragsInRegs) {
      if (qt == kb) {
#pragma unroll
        for (int kc = 0; kc < HS / 16; ++kc) {
          ldmatrix_x4(kf[kc], sK + wrow * S + kc * 16 + a_off);
          ldmatrix_x4(vf[kc], sV + wrow * S + kc * 16 + a_off);
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

      float s[kSub / 8][4] = {};   // S^T  = K Q^T   (16 keys x kSub queries)
      float dp[kSub / 8][4] = {};  // dP^T = V dO^T
#pragma unroll
      for (int kc = 0; kc < HS / 16; ++kc) {
        uint32_t ka[4], va[4];
        if constexpr (G::kRowFragsInRegs) {
#pragma unroll
          for (int r = 0; r < 4; ++r) ka[r] = kf[kc][r], va[r] = vf[kc][r];
        } else {
          ldmatrix_x4(ka, sK + wrow * S + kc * 16 + a_off);
          ldmatrix_x4(va, sV + wrow * S + kc * 16 + a_off);
        }
#pragma unroll
        for (int n = 0; n < kSub / 16; ++n) {
          if (n >= first) {
            uint32_t bq[4], bo[4];  // Q and dO are stored [query][channel] = [n][k]: plain, b-order
            ldmatrix_x4(bq, qbuf + (c0 + n * 16) * S + kc * 16 + b_off);
            ldmatrix_x4(bo, obuf + (c0 + n * 16) * S + kc * 16 + b_off);
            mma_16816(s[2 * n], ka, bq[0], bq[1]);
            mma_16816(s[2 * n + 1], ka, bq[2], bq[3]);
            mma_16816(dp[2 * n], va, bo[0], bo[1]);
            mma_16816(dp[2 * n + 1], va, bo[2], bo[3]);
          }
        }
      }
      // P^T = exp(S^T * scale - lse[query]) and dS^T = P^T * (dP^T - D[query]), masked causally
      // (query < key) and past the end (query >= Tn). Skipped chunks hold zeros that the mask
      // (diagonal) removes; they are skipped below too.
#pragma unroll
      for (int nt = 0; nt < kSub / 8; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int qi = c0 + nt * 8 + 2 * tq + (e & 1), query = q0 + qi;
          float p = exp2f(fmaf(s[nt][e], sl2, -Lb[qi] * kLog2e));
          if ((diag || tail) && (query < key[e >> 1] || query >= Tn)) p = 0.0f;
          s[nt][e] = p;
          dp[nt][e] = p * (dp[nt][e] - Db[qi]);
        }
      // dV += P^T dO and dK += dS^T Q: k runs over queries; dO and Q are stored [k][n]: transposed.
#pragma unroll
      for (int kc = 0; kc < kSub / 16; ++kc) {
        if (kc >= first) {
          uint32_t pa[4], dsa[4];
          acc_to_a(pa, s[2 * kc], s[2 * kc + 1]);
          acc_to_a(dsa, dp[2 * kc], dp[2 * kc + 1]);
#pragma unroll
          for (int dc = 0; dc < HS / 16; ++dc) {
            uint32_t bo[4], bq[4];
            ldmatrix_x4_trans(bo, obuf + (c0 + kc * 16) * S + dc * 16 + a_off);
            ldmatrix_x4_trans(bq, qbuf + (c0 + kc * 16) * S + dc * 16 + a_off);
            mma_16816(dv[2 * dc], pa, bo[0], bo[1]);
            mma_16816(dv[2 * dc + 1], pa, bo[2], bo[3]);
            mma_16816(dk[2 * dc], dsa, bq[0], bq[1]);
            mma_16816(dk[2 * dc + 1], dsa, bq[2], bq[3]);
          }
        }
      }
    }
    __syncthreads();  // everyone is done with `buf` before the next iteration refills it
  }

  // dk, dv += (one owner per element, so plain read-modify-write is race-free).
#pragma unroll
  for (int dt = 0; dt < HS / 8; ++dt)
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      if (key[i] >= Tn) continue;
      bf16* dst = dqkv + (size_t(b) * Tn + key[i]) * ld + C + h * HS + dt * 8 + 2 * tq;
      __nv_bfloat162* pk = reinterpret_cast<__nv_bfloat162*>(dst);
      __nv_bfloat162* pv = reinterpret_cast<__nv_bfloat162*>(dst + C);
      const float2 ok = __bfloat1622float2(*pk), ov = __bfloat1622float2(*pv);
      *pk = __floats2bfloat162_rn(ok.x + dk[dt][2 * i] * scale, ok.y + dk[dt][2 * i + 1] * scale);
      *pv = __floats2bfloat162_rn(ov.x + dv[dt][2 * i], ov.y + dv[dt][2 * i + 1]);
    }
}

// ---- backward: dQ (one block per 64 queries; the forward's loop with lse known) ------------------
template <int HS>
__global__ void __launch_bounds__(kTcThreads)
    attention_backward_dq_tc(bf16* __restrict__ dqkv, const bf16* __restrict__ dout, const bf16* __restrict__ qkv,
                             const float* __restrict__ lse, const float* __restrict__ D, int Tn, int C, int NH) {
  using G = TcGeom<HS>;
  constexpr int kSub = G::kSub, S = G::kStride;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  bf16* sQ = reinterpret_cast<bf16*>(smem_raw);  // (64, HS)
  bf16* sO = sQ + G::kTile;                      // dO (64, HS)
  bf16* sK = sO + G::kTile;                      // 2 buffers
  bf16* sV = sK + 2 * G::kTile;                  // 2 buffers

  const int b = blockIdx.x / NH, h = blockIdx.x % NH;
  const int qb = gridDim.y - 1 - blockIdx.y;
  const int q0 = qb * kTcRows;
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp, g = lane / 4, tq = lane % 4;
  const int wrow = warp * 16;
  const int row[2] = {q0 + wrow + g, q0 + wrow + g + 8};
  const int a_off = a_order_offset<HS>(lane), b_off = b_order_offset<HS>(lane);
  const size_t ld = 3 * size_t(C);
  const bf16* q = qkv + size_t(b) * Tn * ld + h * HS;
  const bf16* k = q + C;
  const bf16* v = q + 2 * C;
  const float scale = 1.0f / sqrtf(float(HS)), sl2 = scale * kLog2e;

  float lse2[2], Dr[2];  // per row: lse in base-2 units, D
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const size_t idx = (size_t(b) * NH + h) * Tn + row[i];
    lse2[i] = row[i] < Tn ? lse[idx] * kLog2e : 0.0f;
    Dr[i] = row[i] < Tn ? D[idx] : 0.0f;
  }

  tc_load_tile<HS>(sQ, q, ld, q0, Tn);
  tc_load_tile<HS>(sO, dout + size_t(b) * Tn * C + h * HS, C, q0, Tn);
  cp_async_commit();
  tc_load_tile<HS>(sK, k, ld, 0, Tn);
  tc_load_tile<HS>(sV, v, ld, 0, Tn);
  cp_async_commit();

  uint32_t qf[G::kRowFragsInRegs ? HS / 16 : 1][4];  // this warp's Q and dO rows as A fragments
  uint32_t of[G::kRowFragsInRegs ? HS / 16 : 1][4];
  float dq[HS / 8][4] = {};

  const int nkt = qb + 1;
  for (int kt = 0; kt < nkt; ++kt) {
    if (kt + 1 < nkt) {
      tc_load_tile<HS>(sK + ((kt + 1) & 1) * G::kTile, k, ld, (kt + 1) * kTcCols, Tn);
      tc_load_tile<HS>(sV + ((kt + 1) & 1) * G::kTile, v, ld, (kt + 1) * kTcCols, Tn);
    }
    cp_async_commit();
    cp_async_wait_all_but_newest();
    __syncthreads();
    if constexpr (G::kRowFragsInRegs) {
      if (kt == 0) {
#pragma unroll
        for (int kc = 0; kc < HS / 16; ++kc) {
          ldmatrix_x4(qf[kc], sQ + wrow * S + kc * 16 + a_off);
          ldmatrix_x4(of[kc], sO + wrow * S + kc * 16 + a_off);
        }
      }
    }
    const bf16* kb = sK + (kt & 1) * G::kTile;
    const bf16* vb = sV + (kt & 1) * G::kTile;
    const int k0 = kt * kTcCols;
    const bool diag = kt == qb;

#pragma unroll
    for (int c0 = 0; c0 < kTcCols; c0 += kSub) {
      const int nch = diag ? min(kSub / 16, (wrow + 16 - c0) / 16) : kSub / 16;  // as in the forward
      if (nch <= 0) break;

      float s[kSub / 8][4] = {};   // S  = Q K^T   (16 queries x kSub keys)
      float dp[kSub / 8][4] = {};  // dP = dO V^T
#pragma unroll
      for (int kc = 0; kc < HS / 16; ++kc) {
        uint32_t qa[4], oa[4];
        if constexpr (G::kRowFragsInRegs) {
#pragma unroll
          for (int r = 0; r < 4; ++r) qa[r] = qf[kc][r], oa[r] = of[kc][r];
        } else {
          ldmatrix_x4(qa, sQ + wrow * S + kc * 16 + a_off);
          ldmatrix_x4(oa, sO + wrow * S + kc * 16 + a_off);
        }
#pragma unroll
        for (int n = 0; n < kSub / 16; ++n) {
          if (n < nch) {
            uint32_t bk[4], bv[4];
            ldmatrix_x4(bk, kb + (c0 + n * 16) * S + kc * 16 + b_off);
            ldmatrix_x4(bv, vb + (c0 + n * 16) * S + kc * 16 + b_off);
            mma_16816(s[2 * n], qa, bk[0], bk[1]);
            mma_16816(s[2 * n + 1], qa, bk[2], bk[3]);
            mma_16816(dp[2 * n], oa, bv[0], bv[1]);
            mma_16816(dp[2 * n + 1], oa, bv[2], bv[3]);
          }
        }
      }
      // dS = P * (dP - D), P recomputed from lse; causal mask on the diagonal (which also removes
      // keys past Tn for every real row). dS overwrites dp.
#pragma unroll
      for (int nt = 0; nt < kSub / 8; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          float p = exp2f(fmaf(s[nt][e], sl2, -lse2[e >> 1]));
          if (diag && k0 + c0 + nt * 8 + 2 * tq + (e & 1) > row[e >> 1]) p = 0.0f;
          dp[nt][e] = p * (dp[nt][e] - Dr[e >> 1]);
        }
      // dQ += dS K. K is stored [key][channel] = [k][n]: transposed, a-order.
#pragma unroll
      for (int kc = 0; kc < kSub / 16; ++kc) {
        if (kc < nch) {
          uint32_t dsa[4];
          acc_to_a(dsa, dp[2 * kc], dp[2 * kc + 1]);
#pragma unroll
          for (int dc = 0; dc < HS / 16; ++dc) {
            uint32_t bk[4];
            ldmatrix_x4_trans(bk, kb + (c0 + kc * 16) * S + dc * 16 + a_off);
            mma_16816(dq[2 * dc], dsa, bk[0], bk[1]);
            mma_16816(dq[2 * dc + 1], dsa, bk[2], bk[3]);
          }
        }
      }
    }
    __syncthreads();
  }

#pragma unroll
  for (int dt = 0; dt < HS / 8; ++dt)
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      if (row[i] >= Tn) continue;
      __nv_bfloat162* p =
          reinterpret_cast<__nv_bfloat162*>(dqkv + (size_t(b) * Tn + row[i]) * ld + h * HS + dt * 8 + 2 * tq);
      const float2 old = __bfloat1622float2(*p);
      *p = __floats2bfloat162_rn(old.x + dq[dt][2 * i] * scale, old.y + dq[dt][2 * i + 1] * scale);
    }
}

// ================================ fp32 SIMT kernels ==============================================

constexpr int kFRows = 32;     // rows per block; also the streamed tile width (one column per lane)
constexpr int kFThreads = 256; // 8 warps. Launch bounds (256, 1): without the explicit minimum of one
                               // block per SM, ptxas picked 48-64 registers and spilled.
constexpr int kFRowsPerWarp = kFRows / (kFThreads / kWarp);  // 4

// Rows r0..r0+31 of a (Tn, HS) fp32 slice (row stride ld) into shared memory with row stride
// `stride`; rows >= Tn become zeros. Callers synchronise.
template <int HS>
__device__ __forceinline__ void f32_load_tile(float* dst, int stride, const float* src, size_t ld, int r0, int Tn) {
  constexpr int kVec = HS / 4;
  for (int i = threadIdx.x; i < kFRows * kVec; i += kFThreads) {
    const int r = i / kVec, c = (i % kVec) * 4, row = r0 + r;
    float4 x = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (row < Tn) x = *reinterpret_cast<const float4*>(src + size_t(row) * ld + c);
    float* d = dst + r * stride + c;
    d[0] = x.x, d[1] = x.y, d[2] = x.z, d[3] = x.w;
  }
}

// A tile read "row = lane" (scores: lane j takes column j) is stored with stride HS + 1, so the 32
// lanes hit 32 different banks; one read "channel = lane" (products with V, K, Q, dO) reads
// consecutive words of one row: stride HS is conflict-free, and HS + 1 is too.
// Lane `lane` owns channels lane, lane + 32, ...: kD of them (HS = 16: lanes 16..31 own none and
// read channel 0 harmlessly, their results are never stored).
template <int HS> struct F32Geom {
  static constexpr int kPad = HS + 1;
  static constexpr int kD = (HS + kWarp - 1) / kWarp;
  __device__ static __forceinline__ int chan(int lane, int i) { return lane + kWarp * i < HS ? lane + kWarp * i : 0; }
  __device__ static __forceinline__ bool owns(int lane, int i) { return lane + kWarp * i < HS; }
};

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
      dst[lane + kWarp * i] += dk[r][i] * scale;
      dst[C + lane + kWarp * i] += dv[r][i];
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
      if (G::owns(lane, i)) dst[lane + kWarp * i] += dq[r][i] * scale;
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

template <class Kernel>
void allow_smem(Kernel kernel, size_t bytes) {
  if (bytes > kDefaultSmem)
    ZT_CHECK_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)));
}

// Validates the shape and returns the head size.
int check_shape(int B, int Tn, int C, int NH) {
  ZT_REQUIRE(B >= 1 && Tn >= 1 && C >= 1 && NH >= 1,
             "attention: bad shape B=" << B << " T=" << Tn << " C=" << C << " NH=" << NH);
  ZT_REQUIRE(C % NH == 0, "attention: C=" << C << " is not divisible by NH=" << NH);
  const int hs = C / NH;
  ZT_REQUIRE(hs == 16 || hs == 32 || hs == 64 || hs == 128,
             "attention: head size " << hs << " not supported by the CUDA kernels (supported: 16, 32, 64, 128)");
  ZT_REQUIRE(size_t(B) * NH < (size_t(1) << 31) && ceil_div(Tn, kFRows) <= 65535,
             "attention: B*NH=" << size_t(B) * NH << " or T=" << Tn << " too large for the launch grid");
  return hs;
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

template <class T, int HS>
void forward_hs(T* out, float* lse, const T* qkv, int B, int Tn, int C, int NH, cudaStream_t stream) {
  if constexpr (std::is_same_v<T, float>) {
    const size_t smem = sizeof(float) * (2 * kFRows * HS + kFRows * (HS + 1));
    auto kernel = attention_forward_f32<HS>;
    allow_smem(kernel, smem);
    kernel<<<dim3(B * NH, ceil_div(Tn, kFRows)), kFThreads, smem, stream>>>(out, lse, qkv, Tn, C, NH);
  } else {
    const size_t smem = sizeof(bf16) * 5 * TcGeom<HS>::kTile;
    auto kernel = attention_forward_tc<HS>;
    allow_smem(kernel, smem);
    kernel<<<dim3(B * NH, ceil_div(Tn, kTcRows)), kTcThreads, smem, stream>>>(out, lse, qkv, Tn, C, NH);
  }
  ZT_CHECK_LAUNCH();
}

template <class T, int HS>
void backward_hs(T* dqkv, const T* dout, const T* qkv, const T* out, const float* lse, float* D, int B, int Tn, int C,
                 int NH, cudaStream_t stream) {
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
    const dim3 grid(B * NH, ceil_div(Tn, kTcRows));
    const size_t smem_dkdv = sizeof(bf16) * 6 * TcGeom<HS>::kTile + sizeof(float) * 4 * kTcCols;
    auto dkdv = attention_backward_dkdv_tc<HS>;
    allow_smem(dkdv, smem_dkdv);
    dkdv<<<grid, kTcThreads, smem_dkdv, stream>>>(dqkv, dout, qkv, lse, D, Tn, C, NH);
    ZT_CHECK_LAUNCH();
    const size_t smem_dq = sizeof(bf16) * 6 * TcGeom<HS>::kTile;
    auto dq = attention_backward_dq_tc<HS>;
    allow_smem(dq, smem_dq);
    dq<<<grid, kTcThreads, smem_dq, stream>>>(dqkv, dout, qkv, lse, D, Tn, C, NH);
    ZT_CHECK_LAUNCH();
  }
}

size_t align_up(size_t n, size_t a) { return (n + a - 1) / a * a; }

}  // namespace

template <class T>
void attention_forward(T* out, float* lse, const T* qkv, int B, int Tn, int C, int NH, cudaStream_t stream) {
  const int hs = check_shape(B, Tn, C, NH);
  ZT_REQUIRE(aligned16(out) && aligned16(qkv), "attention: out and qkv must be 16-byte aligned");
  switch (hs) {
    case 16: forward_hs<T, 16>(out, lse, qkv, B, Tn, C, NH, stream); break;
    case 32: forward_hs<T, 32>(out, lse, qkv, B, Tn, C, NH, stream); break;
    case 64: forward_hs<T, 64>(out, lse, qkv, B, Tn, C, NH, stream); break;
    case 128: forward_hs<T, 128>(out, lse, qkv, B, Tn, C, NH, stream); break;
  }
}

// Scratch holds only D (B, NH, T) fp32: dQ is computed by its own pass, not accumulated.
size_t attention_backward_scratch_bytes(int B, int Tn, int C, int NH) {
  (void)C;
  return align_up(sizeof(float) * size_t(B) * NH * Tn, 256);
}

template <class T>
void attention_backward(T* dqkv, const T* dout, const T* qkv, const T* out, const float* lse, int B, int Tn, int C,
                        int NH, void* scratch, cudaStream_t stream) {
  const int hs = check_shape(B, Tn, C, NH);
  ZT_REQUIRE(aligned16(dqkv) && aligned16(dout) && aligned16(qkv) && aligned16(out) && aligned16(scratch),
             "attention: dqkv, dout, qkv, out and scratch must be 16-byte aligned");
  float* D = static_cast<float*>(scratch);
  switch (hs) {
    case 16: backward_hs<T, 16>(dqkv, dout, qkv, out, lse, D, B, Tn, C, NH, stream); break;
    case 32: backward_hs<T, 32>(dqkv, dout, qkv, out, lse, D, B, Tn, C, NH, stream); break;
    case 64: backward_hs<T, 64>(dqkv, dout, qkv, out, lse, D, B, Tn, C, NH, stream); break;
    case 128: backward_hs<T, 128>(dqkv, dout, qkv, out, lse, D, B, Tn, C, NH, stream); break;
  }
}

template void attention_forward<float>(float*, float*, const float*, int, int, int, int, cudaStream_t);
template void attention_forward<__nv_bfloat16>(__nv_bfloat16*, float*, const __nv_bfloat16*, int, int, int, int,
                                               cudaStream_t);
template void attention_backward<float>(float*, const float*, const float*, const float*, const float*, int, int, int,
                                        int, void*, cudaStream_t);
template void attention_backward<__nv_bfloat16>(__nv_bfloat16*, const __nv_bfloat16*, const __nv_bfloat16*,
                                                const __nv_bfloat16*, const float*, int, int, int, int, void*,
                                                cudaStream_t);

}  // namespace zt::cuda
