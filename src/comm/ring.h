// Ring collectives over point-to-point messages, driven by the comm thread (mpi_thread.h;
// docs/design.md §3.4). Included by mpi_thread.h (and test/comm/ring_test.cpp).
//
// Why not MPI's own non-blocking collectives: Open MPI 4.1 runs MPI_I* collectives through libnbc,
// whose algorithms for large buffers are not bandwidth-optimal. Measured between two hosts on a
// 1 Gbit/s link (scripts/cluster, 40 MB of floats, the ring time being 320 ms for all_reduce and
// 160 ms for the other two): MPI_Ireduce_scatter_block 481 ms (it reduces to rank 0 and scatters:
// 3x), MPI_Iallgather 355 ms, MPI_Iallreduce 681 ms (binomial reduce + broadcast: 2x). The ring
// sends exactly the bytes of comm.h's ring model ((N-1)/N of the buffer per rank per phase), every
// rank sending and receiving at once, which is what docs/zero.md's theory counts.
//
// The ring, N ranks, chunk c of the full buffer = [c*total/N, (c+1)*total/N), rank r:
//   reduce-scatter round s = 0..N-2: send chunk (r-s-1) to r+1, receive chunk (r-s-2) from r-1 and
//                    add it to my own copy of that chunk; after the last round chunk r holds the sum
//                    (in the order r+1, r+2, ..., r: every rank's chunk sums in a fixed order).
//   all-gather     round s = 0..N-2: send chunk (r-s) to r+1, receive chunk (r-s-1) from r-1 into
//                    place.
//   all-reduce     = reduce-scatter then all-gather on one buffer: every rank ends with the same bits.
// A round moves its chunks in segments of at most kSegmentElems elements, one segment (two
// requests, Irecv and Isend) in flight at a time; the thread adds each received segment before
// posting the next. Why: a message posted to MPI's TCP transport is queued whole on the socket,
// so a small collective the training thread waits for (the lookup gradients, a stage-3 unit)
// would queue behind a whole round of a bulk one (18 MiB at stages 1-2 on the `ovl` model: about
// 150 ms at 1 Gbit/s); segmented, it queues behind at most one segment per bulk collective in
// flight (docs/multihost.md). Every rank counts the same segments per round (from the largest
// chunk), so the messages match; the sums are elementwise, so segmenting changes no bit.
// Messages run on the collective's own channel communicator (mpi_comm.cpp), so rounds of different
// collectives in flight never match each other, and MPI's non-overtaking rule orders the rounds.
// The schedule and the chunks are plain arithmetic (reduce_round, gather_round, chunk_begin), which
// test/comm/ring_test.cpp checks without MPI.
#pragma once
#include "comm/mpi_check.h"  // first: includes <mpi.h> without the C++ bindings

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <vector>

namespace zt::mpi_thread {

class Ring {
 public:
  enum class Kind { reduce_scatter, all_gather, all_reduce };

  // reduce_scatter: send (N*n) -> recv (n); in place when recv == send + r*n (send is then written).
  static Ring reduce_scatter(const float* send, float* recv, size_t n, int rank, int world, MPI_Comm c) {
    Ring g(Kind::reduce_scatter, n * size_t(world), rank, world, c);
    g.in_place_ = recv == send + size_t(rank) * n;
    g.full_ = const_cast<float*>(send);  // written only in place, where recv points into it
    g.send_ = send, g.out_ = recv;
    return g;
  }
  // all_gather: send (n) -> recv (N*n); in place when send == recv + r*n.
  static Ring all_gather(const float* send, float* recv, size_t n, int rank, int world, MPI_Comm c) {
    Ring g(Kind::all_gather, n * size_t(world), rank, world, c);
    g.in_place_ = send == recv + size_t(rank) * n;
    g.full_ = recv, g.send_ = send;
    return g;
  }
  // all_reduce: buf (total) in place.
  static Ring all_reduce(float* buf, size_t total, int rank, int world, MPI_Comm c) {
    Ring g(Kind::all_reduce, total, rank, world, c);
    g.in_place_ = true;
    g.full_ = buf, g.send_ = buf;
    return g;
  }

  // Round s of a phase, rank r of N: the chunk sent to r+1 and the chunk received from r-1.
  struct Round {
    int send, recv;
  };
  static Round reduce_round(int r, int s, int N) { return {mod(r - s - 1, N), mod(r - s - 2, N)}; }
  static Round gather_round(int r, int s, int N) { return {mod(r - s, N), mod(r - s - 1, N)}; }
  // Chunk c of a full buffer of `total` elements is [chunk_begin(c), chunk_begin(c + 1)).
  static size_t chunk_begin(int c, size_t total, int N) { return size_t(c) * total / size_t(N); }
  // Elements per segment: 1 MiB of floats, about 8 ms at 1 Gbit/s.
  static constexpr size_t kSegmentElems = size_t(1) << 18;
  // Segments per round, the same on every rank: the largest chunk's (at least one, so that a round
  // of empty chunks still exchanges its two empty messages).
  static size_t segments(size_t total, int N, size_t seg = kSegmentElems) {
    const size_t largest = (total + size_t(N) - 1) / size_t(N);
    return std::max<size_t>(1, (largest + seg - 1) / seg);
  }
  // Segment k of a chunk of n elements: [begin, end) within the chunk (empty past its end).
  struct Span {
    size_t begin, end;
  };
  static Span segment(size_t k, size_t n, size_t seg = kSegmentElems) {
    return {std::min(n, k * seg), std::min(n, (k + 1) * seg)};
  }

  // Posts the current segment's receive and send into req[0], req[1]. Returns an MPI error code.
  int post(MPI_Request req[2]) {
    if (round_ == 0 && seg_ == 0) prepare();
    const int N = world_, r = rank_;
    const int next = (r + 1) % N, prev = (r + N - 1) % N;
    const Round rd = in_reduce_phase() ? reduce_round(r, round_, N) : gather_round(r, round_ - reduce_rounds(), N);
    send_chunk_ = rd.send, recv_chunk_ = rd.recv;
    const Span out = segment(seg_, size(send_chunk_)), in = segment(seg_, size(recv_chunk_));
    const int n_out = int(out.end - out.begin), n_in = int(in.end - in.begin);
    if (in_reduce_phase()) {
      // Round 0 sends my own contribution; later rounds the partial sum of the round before.
      const float* src = (round_ == 0 || in_place_) ? send_ + off(send_chunk_) : partial_.data();
      int rc = MPI_Irecv(recv_tmp_.data(), n_in, MPI_FLOAT, prev, kTag, comm_, &req[0]);
      if (rc != MPI_SUCCESS) return rc;
      return MPI_Isend(src + out.begin, n_out, MPI_FLOAT, next, kTag, comm_, &req[1]);
    }
    int rc = MPI_Irecv(full_ + off(recv_chunk_) + in.begin, n_in, MPI_FLOAT, prev, kTag, comm_, &req[0]);
    if (rc != MPI_SUCCESS) return rc;
    return MPI_Isend(full_ + off(send_chunk_) + out.begin, n_out, MPI_FLOAT, next, kTag, comm_, &req[1]);
  }

  // Elements of an all-gather's received chunks that are final, in the order they arrive (round 0's
  // chunk, then round 1's, ..., each segment by segment; Comm::all_gather_arrived). 0 in a
  // reduce-scatter phase, so an all-reduce says nothing until it completes.
  size_t gather_arrived() const {
    const int gr = round_ - reduce_rounds();
    if (gr < 0 || kind_ != Kind::all_gather) return 0;
    size_t a = 0;
    for (int s = 0; s < gr && s < gather_rounds(); ++s) a += size(gather_round(rank_, s, world_).recv);
    if (gr < gather_rounds()) a += std::min(size(gather_round(rank_, gr, world_).recv), seg_ * kSegmentElems);
    return a;
  }

  // The current segment's two requests have completed: add what came in. True when the collective
  // is done.
  bool complete_segment() {
    if (in_reduce_phase()) {
      const Span in = segment(seg_, size(recv_chunk_));
      const float* own = send_ + off(recv_chunk_) + in.begin;
      const bool last = round_ == reduce_rounds() - 1;
      // The partial sum is written segment by segment over the one this round sends from: the
      // segment written was sent already, the ones still to send are not touched.
      float* dst = (in_place_ ? full_ + off(recv_chunk_) : last ? out_ : partial_.data()) + in.begin;
      const float* add = recv_tmp_.data();
      for (size_t i = 0; i < in.end - in.begin; ++i) dst[i] = own[i] + add[i];
    }
    if (++seg_ < segments(total_, world_)) return false;
    seg_ = 0;
    ++round_;
    if (round_ < reduce_rounds() + gather_rounds()) return false;
    recv_tmp_ = {};
    partial_ = {};
    return true;
  }

 private:
  static constexpr int kTag = 0x7a;
  Ring(Kind k, size_t total, int rank, int world, MPI_Comm c)
      : kind_(k), total_(total), rank_(rank), world_(world), comm_(c) {}

  int reduce_rounds() const { return kind_ == Kind::all_gather ? 0 : world_ - 1; }
  int gather_rounds() const { return kind_ == Kind::reduce_scatter ? 0 : world_ - 1; }
  bool in_reduce_phase() const { return round_ < reduce_rounds(); }
  static int mod(int c, int N) { return ((c % N) + N) % N; }
  size_t off(int c) const { return chunk_begin(c, total_, world_); }
  size_t size(int c) const { return off(c + 1) - off(c); }

  // Scratch, allocated when the collective starts (not while queued): the received chunk, and for a
  // reduce-scatter out of place the running partial sum (the send buffer is not ours to write).
  void prepare() {
    const size_t chunk = size_t((total_ + size_t(world_) - 1) / size_t(world_));
    if (reduce_rounds()) recv_tmp_.resize(std::min(chunk, kSegmentElems));
    if (kind_ == Kind::reduce_scatter && !in_place_) partial_.resize(chunk);
    if (kind_ == Kind::all_gather && !in_place_) std::memcpy(full_ + off(rank_), send_, 4 * size(rank_));
  }

  Kind kind_;
  size_t total_;  // elements of the full buffer
  int rank_, world_;
  MPI_Comm comm_;
  bool in_place_ = false;
  float* full_ = nullptr;         // reduce-scatter in place / all-reduce: accumulated here; all-gather: the output
  const float* send_ = nullptr;   // my contribution (reduce) or my chunk (all-gather)
  float* out_ = nullptr;          // reduce-scatter out of place: my chunk's sum
  int round_ = 0, send_chunk_ = 0, recv_chunk_ = 0;
  size_t seg_ = 0;                // segment of the current round
  std::vector<float> recv_tmp_;   // (segment) the segment received last
  std::vector<float> partial_;    // (chunk) reduce-scatter out of place: the partial sum sent next round
};

}  // namespace zt::mpi_thread
