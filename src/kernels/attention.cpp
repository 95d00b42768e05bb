// Causal multi-head self-attention, flash style, CPU reference.
//
// For one (batch b, head h) and query row t, with q_t, k_j, v_j the head's slices of qkv:
//   s_j   = q_t . k_j / sqrt(hs)                 j = 0..t (causal)
//   lse_t = log sum_j exp(s_j)                   (computed as m + log sum_j exp(s_j - m), m = max_j s_j)
//   p_j   = exp(s_j - lse_t)                     (softmax; never stored, recomputed in backward)
//   out_t = sum_j p_j v_j
// Backward, given dout_t (=: do_t):
//   dv_j += p_j do_t
//   dp_j  = do_t . v_j,   D_t = do_t . out_t  (= sum_j p_j dp_j)
//   ds_j  = p_j (dp_j - D_t)
//   dq_t += sum_j ds_j k_j / sqrt(hs),   dk_j += ds_j q_t / sqrt(hs)
//
// Organisation (as FlashAttention, adapted to a CPU): query rows are taken in blocks of kBlock.
// For one block the scores against all keys it can see form a (kBlock x n) matrix, kept in
// per-thread scratch (O(kBlock * T), never O(T^2)), and every product above is a small matrix
// multiply over that block, done by the register-tiled gemm() below. Nothing of size T x T is
// kept between forward and backward: backward recomputes the probabilities from q, k and lse.
#include "kernels/attention.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <vector>

#include "kernels/cpu_math.h"

namespace zt::cpu {
namespace {

constexpr int kBlock = 48;  // query rows per block (a multiple of both tiles' RB below)

// ---- a small matrix multiply, written so that the compiler vectorises it well ------------------
//   C (M x N)  =  or +=  A (M x K) * B (K x N)
//   A(i, k) = A[i * a_row + k * a_col]   any layout: A is read one element at a time and broadcast
//   B(k, j) = B[k * ldb + j]             rows of B are read as vectors
//   C(i, j) = C[i * ldc + j]
// The work is cut into RB x JB tiles of C. For a full tile RB and JB are compile-time constants,
// so GCC unrolls it completely and keeps the RB x JB accumulators in vector registers through the
// whole k loop: two vector loads of B and RB broadcasts of A feed 2*RB fused multiply-adds.
// That is roughly 3-5x the speed of row-by-row dot products (which also need a horizontal sum each).
// Two tile shapes (AttentionTile, attention.h): 6 x 16 floats = 12 AVX2 registers of accumulators,
// which leaves room for the operands in AVX2's 16 vector registers; 8 x 32 = 16 AVX-512 registers
// of AVX-512's 32, with two loads of B per k for 16 FMAs instead of one per 6 (the wider tile on
// AVX2 would spill). Every output element sums its k terms in the same order whatever the tile,
// so the two give bit-identical results (kernels_test checks it); only the speed differs.
// (Why not cblas_sgemm: these products are small, e.g. 48 x n x 64, and run on every thread at once
// inside an OpenMP region; OpenBLAS would add its own threads or a per-call overhead to each.)
template <class T, int RB, int JB>
void tile_full(int K, const T* A, size_t a_row, size_t a_col, const T* B, size_t ldb, T* C, size_t ldc,
               bool accumulate) {
  T acc[RB][JB] = {};
  for (int k = 0; k < K; k++) {
    const T* __restrict b = B + k * ldb;
    for (int r = 0; r < RB; r++) {
      const T a = A[r * a_row + k * a_col];
#pragma omp simd
      for (int j = 0; j < JB; j++) acc[r][j] += a * b[j];
    }
  }
  for (int r = 0; r < RB; r++) {
    T* __restrict c = C + r * ldc;
    if (accumulate) {
#pragma omp simd
      for (int j = 0; j < JB; j++) c[j] += acc[r][j];
    } else {
#pragma omp simd
      for (int j = 0; j < JB; j++) c[j] = acc[r][j];
    }
  }
}

// The same for a partial tile at the edge of C (rb <= RB rows, jb <= JB columns).
template <class T, int RB, int JB>
void tile_edge(int rb, int jb, int K, const T* A, size_t a_row, size_t a_col, const T* B, size_t ldb, T* C, size_t ldc,
               bool accumulate) {
  T acc[RB][JB] = {};
  for (int k = 0; k < K; k++) {
    const T* __restrict b = B + k * ldb;
    for (int r = 0; r < rb; r++) {
      const T a = A[r * a_row + k * a_col];
      for (int j = 0; j < jb; j++) acc[r][j] += a * b[j];
    }
  }
  for (int r = 0; r < rb; r++)
    for (int j = 0; j < jb; j++) C[r * ldc + j] = accumulate ? C[r * ldc + j] + acc[r][j] : acc[r][j];
}

template <class T, int RB, int JB>
void gemm(int M, int N, int K, const T* A, size_t a_row, size_t a_col, const T* B, size_t ldb, T* C, size_t ldc,
          bool accumulate) {
  // Column panels outside, so that the K x JB panel of B stays in L1 while all row tiles use it.
  for (int j = 0; j < N; j += JB) {
    const int jb = std::min(JB, N - j);
    for (int i = 0; i < M; i += RB) {
      const int rb = std::min(RB, M - i);
      const T* Ai = A + i * a_row;
      T* Cij = C + i * ldc + j;
      if (rb == RB && jb == JB)
        tile_full<T, RB, JB>(K, Ai, a_row, a_col, B + j, ldb, Cij, ldc, accumulate);
      else
        tile_edge<T, RB, JB>(rb, jb, K, Ai, a_row, a_col, B + j, ldb, Cij, ldc, accumulate);
    }
  }
}

// dst[d * ld + j] = src[j * stride + d]  for j < n, d < hs: one head's keys (or values) as columns.
template <class T>
void transpose(T* __restrict dst, size_t ld, const T* __restrict src, size_t stride, int n, int hs) {
  for (int j = 0; j < n; j++)
    for (int d = 0; d < hs; d++) dst[d * ld + j] = src[j * stride + d];
}

template <class T, int RB, int JB>
void forward(T* out, T* lse, const T* qkv, int B, int Tn, int C, int NH) {
  static_assert(kBlock % RB == 0);
  const int hs = C / NH;
  const size_t C3 = 3 * (size_t)C;
  const T scale = T(1) / std::sqrt(T(hs));
  const int nblocks = (Tn + kBlock - 1) / kBlock;
#pragma omp parallel
  {
    std::vector<T> Kt((size_t)hs * Tn);     // keys of one head, transposed: (hs, n)
    std::vector<T> S((size_t)kBlock * Tn);  // scores, then probabilities, of one query block: (rows, n)
    T inv_sum[kBlock];
    // Blocks are independent in forward. Later blocks see more keys (causal), so hand them out
    // dynamically.
#pragma omp for collapse(3) schedule(dynamic)
    for (int b = 0; b < B; b++) {
      for (int h = 0; h < NH; h++) {
        for (int blk = 0; blk < nblocks; blk++) {
          const int t0 = blk * kBlock, rows = std::min(kBlock, Tn - t0);
          const int n = t0 + rows;  // keys 0..n-1 are visible to some row of this block
          const T* q = qkv + ((size_t)b * Tn + t0) * C3 + h * hs;  // query row r at q + r * C3
          const T* k = qkv + (size_t)b * Tn * C3 + C + h * hs;     // key j at k + j * C3
          const T* v = k + C;                                      // value j at v + j * C3
          T* o = out + ((size_t)b * Tn + t0) * C + h * hs;         // output row r at o + r * C

          // S = Q K^T   (rows x n)
          transpose(Kt.data(), n, k, C3, n, hs);
          gemm<T, RB, JB>(rows, n, hs, q, C3, 1, Kt.data(), n, S.data(), n, false);

          // Row softmax, causal: row r (t = t0 + r) sees keys 0..t.
          for (int r = 0; r < rows; r++) {
            const int t = t0 + r;
            T* s = S.data() + (size_t)r * n;
            T m = s[0];
#pragma omp simd reduction(max : m)
            for (int j = 0; j <= t; j++) m = s[j] > m ? s[j] : m;
            T sum = 0;
#pragma omp simd reduction(+ : sum)
            for (int j = 0; j <= t; j++) {
              s[j] = detail::vexp(scale * (s[j] - m));
              sum += s[j];
            }
            for (int j = t + 1; j < n; j++) s[j] = 0;
            inv_sum[r] = T(1) / sum;
            lse[((size_t)b * NH + h) * Tn + t] = scale * m + std::log(sum);
          }

          // O = softmax(S) V = (exp(S - m) V) / sum   (rows x hs)
          gemm<T, RB, JB>(rows, hs, n, S.data(), n, 1, v, C3, o, C, false);
          for (int r = 0; r < rows; r++) {
            T* orow = o + (size_t)r * C;
#pragma omp simd
            for (int d = 0; d < hs; d++) orow[d] *= inv_sum[r];
          }
        }
      }
    }
  }
}

template <class T, int RB, int JB>
void backward(T* dqkv, const T* dout, const T* qkv, const T* out, const T* lse, int B, int Tn, int C, int NH) {
  const int hs = C / NH;
  const size_t C3 = 3 * (size_t)C;
  const T scale = T(1) / std::sqrt(T(hs));
  const int nblocks = (Tn + kBlock - 1) / kBlock;
#pragma omp parallel
  {
    std::vector<T> Kt((size_t)hs * Tn), Vt((size_t)hs * Tn);          // (hs, T) each
    std::vector<T> P((size_t)kBlock * Tn), dS((size_t)kBlock * Tn);    // (rows, n) each
    // dk_j and dv_j collect contributions from every query block of the same (b, h): one thread
    // owns a whole (b, h), so there are no races and the summation order never changes.
#pragma omp for collapse(2) schedule(dynamic)
    for (int b = 0; b < B; b++) {
      for (int h = 0; h < NH; h++) {
        const T* k = qkv + (size_t)b * Tn * C3 + C + h * hs;
        const T* v = k + C;
        T* dk = dqkv + (size_t)b * Tn * C3 + C + h * hs;
        T* dv = dk + C;
        // dqkv is overwritten: this (b, h)'s q, k and v columns start at zero, then collect the blocks.
        for (int t = 0; t < Tn; t++)
          for (int part = 0; part < 3; part++) std::fill_n(dqkv + ((size_t)b * Tn + t) * C3 + part * C + h * hs, hs, T(0));
        transpose(Kt.data(), Tn, k, C3, Tn, hs);
        transpose(Vt.data(), Tn, v, C3, Tn, hs);

        for (int blk = 0; blk < nblocks; blk++) {
          const int t0 = blk * kBlock, rows = std::min(kBlock, Tn - t0), n = t0 + rows;
          const size_t row0 = (size_t)b * Tn + t0;
          const T* q = qkv + row0 * C3 + h * hs;
          const T* dy = dout + row0 * C + h * hs;
          const T* o = out + row0 * C + h * hs;
          T* dq = dqkv + row0 * C3 + h * hs;

          gemm<T, RB, JB>(rows, n, hs, q, C3, 1, Kt.data(), Tn, P.data(), n, false);    // S  = Q K^T
          gemm<T, RB, JB>(rows, n, hs, dy, C, 1, Vt.data(), Tn, dS.data(), n, false);   // dP = dO V^T
          for (int r = 0; r < rows; r++) {
            const int t = t0 + r;
            const T L = lse[((size_t)b * NH + h) * Tn + t];
            T D = 0;  // D_t = do_t . out_t
#pragma omp simd reduction(+ : D)
            for (int d = 0; d < hs; d++) D += dy[r * C + d] * o[r * C + d];
            T* p = P.data() + (size_t)r * n;
            T* ds = dS.data() + (size_t)r * n;
#pragma omp simd
            for (int j = 0; j <= t; j++) {
              p[j] = detail::vexp(scale * p[j] - L);  // probabilities, recomputed
              ds[j] = scale * p[j] * (ds[j] - D);     // ds_j / sqrt(hs)
            }
            for (int j = t + 1; j < n; j++) p[j] = ds[j] = 0;  // causal mask
          }
          gemm<T, RB, JB>(rows, hs, n, dS.data(), n, 1, k, C3, dq, C3, true);   // dQ      += dS K
          gemm<T, RB, JB>(n, hs, rows, dS.data(), 1, n, q, C3, dk, C3, true);   // dK[0:n] += dS^T Q
          gemm<T, RB, JB>(n, hs, rows, P.data(), 1, n, dy, C, dv, C3, true);    // dV[0:n] += P^T dO
        }
      }
    }
  }
}

}  // namespace

AttentionTile resolve_attention_tile(AttentionTile tile, int Tn) {
  if (tile != AttentionTile::automatic) return tile;
#if defined(__AVX512F__)
  if (Tn >= 512) return AttentionTile::avx512_8x32;
#endif
  return AttentionTile::avx2_6x16;
}

template <class T>
void attention_forward(T* out, T* lse, const T* qkv, int B, int Tn, int C, int NH, AttentionTile tile) {
  tile = resolve_attention_tile(tile, Tn);
  if (tile == AttentionTile::avx512_8x32) return forward<T, 8, 32>(out, lse, qkv, B, Tn, C, NH);
  forward<T, 6, 16>(out, lse, qkv, B, Tn, C, NH);
}

template <class T>
void attention_backward(T* dqkv, const T* dout, const T* qkv, const T* out, const T* lse, int B, int Tn, int C, int NH,
                        AttentionTile tile) {
  tile = resolve_attention_tile(tile, Tn);
  if (tile == AttentionTile::avx512_8x32) return backward<T, 8, 32>(dqkv, dout, qkv, out, lse, B, Tn, C, NH);
  backward<T, 6, 16>(dqkv, dout, qkv, out, lse, B, Tn, C, NH);
}

template void attention_forward<float>(float*, float*, const float*, int, int, int, int, AttentionTile);
template void attention_forward<double>(double*, double*, const double*, int, int, int, int, AttentionTile);
template void attention_backward<float>(float*, const float*, const float*, const float*, const float*, int, int, int,
                                        int, AttentionTile);
template void attention_backward<double>(double*, const double*, const double*, const double*, const double*, int, int,
                                         int, int, AttentionTile);

}  // namespace zt::cpu
