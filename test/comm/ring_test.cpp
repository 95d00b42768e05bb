// The ring collectives' schedule (src/comm/ring.h) as arithmetic, without MPI: the rounds of every
// rank played together, message by message, for N = 1..9. What the ring promises, and what the
// code relies on:
//   - a message's chunk is the chunk its receiver expects (rank r's send = rank r+1's receive);
//   - reduce-scatter: round s sends the chunk summed in round s-1 (Ring sends partial_ whatever its
//     index), and after N-1 rounds rank r holds chunk r summed over every rank exactly once;
//   - all-gather: a rank sends only chunks it holds, receives each chunk it lacks exactly once, and
//     ends with all N;
//   - per round the N messages carry N different chunks, and per phase a rank sends every chunk
//     but one: (N-1)/N of the buffer, the byte model of comm.h;
//   - a round's segments tile every chunk, at most one segment long each, in a count every rank
//     computes alike (otherwise a sender and its receiver post different numbers of messages);
//   - an all-gather's progress (gather_arrived) counts exactly the elements received so far, in the
//     arrival order Comm::all_gather_arrived promises (gather_arrival_position): what the LM head
//     reads of the embedding before its all-gather completes.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <vector>

#include "comm/comm.h"
#include "comm/ring.h"

namespace zt {
namespace {

using mpi_thread::Ring;

TEST(RingChunks, TileTheBufferInSizesThatDifferByAtMostOne) {
  for (size_t total : {size_t(0), size_t(1), size_t(7), size_t(128), size_t(1000003)})
    for (int N = 1; N <= 9; ++N) {
      EXPECT_EQ(Ring::chunk_begin(0, total, N), 0u);
      EXPECT_EQ(Ring::chunk_begin(N, total, N), total);
      size_t lo = total, hi = 0;
      for (int c = 0; c < N; ++c) {
        const size_t n = Ring::chunk_begin(c + 1, total, N) - Ring::chunk_begin(c, total, N);
        lo = std::min(lo, n), hi = std::max(hi, n);
        EXPECT_LE(Ring::chunk_begin(c, total, N), Ring::chunk_begin(c + 1, total, N));
      }
      EXPECT_LE(hi - lo, 1u) << "total " << total << " N " << N;
    }
}

TEST(RingSchedule, EachMessageIsTheChunkItsReceiverExpects) {
  for (int N = 1; N <= 9; ++N)
    for (auto round : {&Ring::reduce_round, &Ring::gather_round})
      for (int s = 0; s + 1 < N; ++s) {
        std::set<int> chunks;  // one message per rank and round: N different chunks on the ring
        for (int r = 0; r < N; ++r) {
          chunks.insert(round(r, s, N).send);
          EXPECT_EQ(round(r, s, N).send, round((r + 1) % N, s, N).recv) << "N " << N << " round " << s << " rank " << r;
        }
        EXPECT_EQ(int(chunks.size()), N) << "N " << N << " round " << s;
      }
}

TEST(RingSchedule, ReduceScatterSumsEveryRankOnceIntoItsOwnChunk) {
  for (int N = 2; N <= 9; ++N) {
    // partial[r]: the ranks whose contributions rank r's last summed chunk holds (a multiset).
    std::vector<std::multiset<int>> partial(static_cast<size_t>(N));
    for (int s = 0; s + 1 < N; ++s) {
      std::vector<std::multiset<int>> next(static_cast<size_t>(N));
      for (int r = 0; r < N; ++r) {
        if (s > 0) EXPECT_EQ(Ring::reduce_round(r, s, N).send, Ring::reduce_round(r, s - 1, N).recv)
            << "N " << N << " round " << s << " rank " << r << " sends what it summed last round";
        // What goes out: my own contribution in round 0, my running sum after that; the receiver
        // adds its own contribution.
        std::multiset<int> msg = s == 0 ? std::multiset<int>{r} : partial[size_t(r)];
        msg.insert((r + 1) % N);
        next[size_t((r + 1) % N)] = msg;
      }
      partial = next;
    }
    std::multiset<int> everyone;
    for (int r = 0; r < N; ++r) everyone.insert(r);
    for (int r = 0; r < N; ++r) {
      EXPECT_EQ(Ring::reduce_round(r, N - 2, N).recv, r) << "N " << N << ": rank " << r << " ends on its own chunk";
      EXPECT_EQ(partial[size_t(r)], everyone) << "N " << N << " rank " << r;
    }
  }
}

TEST(RingSchedule, AllGatherDeliversEveryChunkOnceToEveryRank) {
  for (int N = 1; N <= 9; ++N) {
    std::vector<std::set<int>> have(static_cast<size_t>(N));
    for (int r = 0; r < N; ++r) have[size_t(r)] = {r};
    for (int s = 0; s + 1 < N; ++s) {
      std::vector<std::set<int>> after = have;
      for (int r = 0; r < N; ++r) {
        const int c = Ring::gather_round(r, s, N).send, to = (r + 1) % N;
        EXPECT_TRUE(have[size_t(r)].count(c)) << "N " << N << " round " << s << ": rank " << r << " sends chunk "
                                              << c << " it does not hold";
        EXPECT_TRUE(after[size_t(to)].insert(c).second)
            << "N " << N << " round " << s << ": rank " << to << " receives chunk " << c << " again";
      }
      have = after;
    }
    for (int r = 0; r < N; ++r) EXPECT_EQ(int(have[size_t(r)].size()), N) << "N " << N << " rank " << r;
  }
}

TEST(RingSchedule, EachPhaseSendsEveryChunkButOne) {
  const size_t total = 1000003;
  for (int N = 1; N <= 9; ++N)
    for (int r = 0; r < N; ++r)
      for (auto round : {&Ring::reduce_round, &Ring::gather_round}) {
        std::set<int> sent;
        size_t bytes = 0;
        for (int s = 0; s + 1 < N; ++s) {
          const int c = round(r, s, N).send;
          EXPECT_TRUE(sent.insert(c).second) << "N " << N << " rank " << r << " sends chunk " << c << " twice";
          bytes += Ring::chunk_begin(c + 1, total, N) - Ring::chunk_begin(c, total, N);
        }
        EXPECT_EQ(int(sent.size()), N - 1);
        // (N-1)/N of the buffer, to within one element per chunk.
        EXPECT_NEAR(double(bytes), double(total) * (N - 1) / N, double(N)) << "N " << N << " rank " << r;
      }
}

TEST(RingSegments, TileEveryChunkInACountEveryRankShares) {
  for (size_t seg : {size_t(1), size_t(7), size_t(64)})
    for (size_t total : {size_t(0), size_t(1), size_t(7), size_t(128), size_t(1000003)})
      for (int N = 1; N <= 9; ++N) {
        const size_t k_n = Ring::segments(total, N, seg);
        EXPECT_GE(k_n, 1u);
        size_t largest = 0;
        for (int c = 0; c < N; ++c) {
          const size_t n = Ring::chunk_begin(c + 1, total, N) - Ring::chunk_begin(c, total, N);
          largest = std::max(largest, n);
          size_t covered = 0;  // the segments in order, each starting where the last ended
          for (size_t k = 0; k < k_n; ++k) {
            const Ring::Span sp = Ring::segment(k, n, seg);
            EXPECT_EQ(sp.begin, covered) << "seg " << seg << " total " << total << " N " << N << " chunk " << c;
            EXPECT_LE(sp.end - sp.begin, seg);
            covered = sp.end;
          }
          EXPECT_EQ(covered, n) << "seg " << seg << " total " << total << " N " << N << " chunk " << c;
        }
        // No segment past the largest chunk's last (each one is a message on every rank).
        if (largest > 0) EXPECT_GT(Ring::segment(k_n - 1, largest, seg).end, Ring::segment(k_n - 1, largest, seg).begin);
      }
  EXPECT_EQ(Ring::segments(size_t(3) << 20, 2), 6u);  // 1.5 Mi floats per chunk, 1 MiB segments
}

// The segments an all-gather has completed (marked as the schedule receives them) are exactly the
// elements whose arrival position is below gather_arrived(), after every segment, at every rank.
TEST(RingProgress, AnAllGatherCountsWhatHasArrivedInTheOrderCommPromises) {
  const size_t S = Ring::kSegmentElems;
  for (int N : {2, 3, 5})
    for (size_t n : {size_t(1), S, 2 * S + 77})
      for (int r = 0; r < N; ++r) {
        std::vector<float> buf(n * size_t(N));
        Ring g = Ring::all_gather(buf.data() + size_t(r) * n, buf.data(), n, r, N, MPI_COMM_NULL);
        std::vector<char> have(buf.size(), 0);
        std::fill(have.begin() + long(size_t(r) * n), have.begin() + long(size_t(r + 1) * n), 1);
        // Every element near a segment's edge, and a stride through the rest.
        std::vector<size_t> probe;
        for (size_t i = 0; i < buf.size(); i += 4099) probe.push_back(i);
        for (int c = 0; c < N; ++c)
          for (size_t b = 0; b <= n; b += std::min(S, n))
            for (size_t d : {b, b + 1})
              if (d >= 1 && d - 1 < n) probe.push_back(size_t(c) * n + d - 1), probe.push_back(std::min(size_t(c) * n + d, buf.size() - 1));
        EXPECT_EQ(g.gather_arrived(), 0u);
        bool done = false;
        const size_t segs = Ring::segments(buf.size(), N);
        for (int s = 0; s < N - 1; ++s)
          for (size_t k = 0; k < segs; ++k) {
            ASSERT_FALSE(done);
            const int c = Ring::gather_round(r, s, N).recv;
            const Ring::Span sp = Ring::segment(k, n);
            std::fill(have.begin() + long(size_t(c) * n + sp.begin), have.begin() + long(size_t(c) * n + sp.end), 1);
            done = g.complete_segment();
            if (done) break;
            const long long a = (long long)g.gather_arrived();
            for (size_t i : probe)
              ASSERT_EQ(have[i] != 0, gather_arrival_position(r, N, n, i) < a)
                  << "N " << N << " n " << n << " rank " << r << " round " << s << " segment " << k << " element " << i;
          }
        EXPECT_TRUE(done);
      }
}

}  // namespace
}  // namespace zt
