// Causal flash attention, CUDA version (see attention.cpp for the reference and the formulas).
//
// Nothing of size (T,T) ever reaches global memory: forward keeps a running (max, sum) per query
// row (online softmax) and stores only lse; backward recomputes P = exp(S * scale - lse) tile by
// tile. One thread block works on one (batch b, head h) and one block of rows, ordered so that the
// blocks with the most work start first (fp32: blockIdx.x is (b, h), blockIdx.y the row block;
// bf16: a 1-D grid, tc_block below).
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
// Inside a block every warp owns 16 or 32 (tensor-core kernels, "Warp rows" below) or 4 (fp32
// kernels) of the block's rows
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
//         shared memory, FlashAttention-2 style. 64 rows per block, 4 warps x 16 rows (or 2 x 32), tiles of
//         64 columns loaded with cp.async (double buffered). S, P, dP and dS stay in registers:
//         the fp32 accumulator layout of one m16n8 product, taken two at a time, is exactly the
//         bf16 A-operand layout of the next product, so P goes from softmax to P.V without shared
//         memory. Softmax runs in base 2 (exp2f(s * scale * log2e - m)), one FMA per element.
//   fp32  plain SIMT (the parity mode: no TF32, must match the CPU to ~1e-5). 32 rows per block,
//         8 warps x 4 rows, tiles of 32 columns: lane j handles column j for the scores, then
//         lane d handles output channel d (and d+32, ...) for the products with V, K, Q or dO.
// Head sizes 16, 32, 64 and 128 are compiled (a template parameter, so every loop over the head
// dimension unrolls and every fragment array is sized at compile time).
//
// Files: attention_common.cuh (this: PTX wrappers, tile geometry, shape checks), attention_fwd.cu
// (both forward kernels), attention_bwd_tc.cu (the bf16 backward kernels), attention_bwd.cu (the
// fp32 backward kernels, D = rowsum(dO * O), and the backward entry point).
// No kernel launch and no `extern __shared__` here: the emulation build (test/emu/rewrite.cmake)
// rewrites those only in the .cu files it copies.
#pragma once
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
static_assert(kTcRows == kTcCols, "the diagonal tile must start where the block's rows start (k0 == q0)");

// Warp rows. A block always covers kTcRows rows; each warp owns MT m16 tiles of them (16 * MT rows),
// so a block has 4 / MT warps. Every product's B operand (the streamed tile: K, V, Q or dO) is read
// from shared memory once per warp and fed to MT tensor-core products, so MT = 2 halves the
// shared-memory reads per product (one ldmatrix.x4 per 4 mma instead of per 2), at the price of
// twice the accumulator registers per thread and half the warps per block. Every row's arithmetic
// is the same in either case, so the variants give bit-identical results (test/gpu checks it).
__host__ __device__ constexpr int tc_threads(int MT) { return kTcRows / (16 * MT) * kWarp; }

// Which (batch, head) and which row block a tensor-core block works on. The grid is 1-D,
// blocks = B * NH * row blocks, and the hardware starts them in blockIdx order:
//   heads_fastest: consecutive blocks are different heads with the same row block, the heaviest row
//                  blocks of every head first (longest work first: the best load balance);
//   otherwise:     consecutive blocks are the row blocks of one head, heaviest first, so the blocks
//                  running at once share that head's K/V (or Q/dO) tiles in L2 (FlashAttention's order).
// last_first: the row block counted from the end (the one with the most work first).
struct TcBlock {
  int b, h, last_first;
};
__device__ __forceinline__ TcBlock tc_block(int NH, int row_blocks, bool heads_fastest) {
  const int lin = blockIdx.x;
  const int bh = heads_fastest ? lin % (int(gridDim.x) / row_blocks) : lin / row_blocks;
  const int rb = heads_fastest ? lin / (int(gridDim.x) / row_blocks) : lin % row_blocks;
  return {bh / NH, bh % NH, row_blocks - 1 - rb};
}
inline int tc_grid_blocks(int B, int NH, int Tn) { return B * NH * ceil_div(Tn, kTcRows); }

// Whether a head size has the 32-rows-per-warp variant: at HS = 128 the accumulators of two m-tiles
// do not fit in registers (ptxas spills kilobytes), so it always runs 16 rows per warp.
constexpr bool tc_has_warp_rows_32(int HS) { return HS <= 64; }

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
// rows >= Tn become zeros. All kThreads threads of the block take part; completion via cp.async groups.
template <int HS, int kThreads>
__device__ __forceinline__ void tc_load_tile(bf16* dst, const bf16* src, size_t ld, int r0, int Tn) {
  constexpr int kChunks = HS / 8;  // 16-byte chunks per row
  for (int i = threadIdx.x; i < kTcRows * kChunks; i += kThreads) {
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

// ================================ host helpers ====================================================

template <class Kernel>
void allow_smem(Kernel kernel, size_t bytes) {
  if (bytes > kDefaultSmem)
    ZT_CHECK_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)));
}

// Validates the shape and returns the head size.
inline int check_shape(int B, int Tn, int C, int NH) {
  ZT_REQUIRE(B >= 1 && Tn >= 1 && C >= 1 && NH >= 1,
             "attention: bad shape B=" << B << " T=" << Tn << " C=" << C << " NH=" << NH);
  ZT_REQUIRE(C % NH == 0, "attention: C=" << C << " is not divisible by NH=" << NH);
  const int hs = C / NH;
  ZT_REQUIRE(hs == 16 || hs == 32 || hs == 64 || hs == 128,
             "attention: head size " << hs << " not supported by the CUDA kernels (supported: 16, 32, 64, 128)");
  ZT_REQUIRE(size_t(B) * NH < (size_t(1) << 31) && ceil_div(Tn, kFRows) <= 65535 &&
                 size_t(B) * NH * ceil_div(Tn, kTcRows) < (size_t(1) << 31),
             "attention: B*NH=" << size_t(B) * NH << " or T=" << Tn << " too large for the launch grid");
  return hs;
}

inline bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

namespace attention_detail {
// The bf16 backward's dK/dV and dQ passes (attention_bwd_tc.cu), for HS = 16, 32, 64, 128.
template <int HS>
void backward_tc(bf16* dqkv, const bf16* dout, const bf16* qkv, const float* lse, const float* D, int B, int Tn,
                 int C, int NH, AttentionTcVariant variant, cudaStream_t stream);
}  // namespace attention_detail

}  // namespace zt::cuda
