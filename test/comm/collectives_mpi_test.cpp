// Multi-rank tests of the MPI Comm (src/comm/mpi_comm.cpp, src/comm/coll_log.cpp). Run under mpirun:
//   mpirun --oversubscribe -np N ./test_comm      (ctest: N = 1, 2, 3, 4; as root also set
//   OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1). Exit 0 only when every rank passed.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "comm/coll_log.h"
#include "comm/comm.h"

namespace {

zt::Comm* g_comm = nullptr;

// Small integers: float sums over ranks are exact.
float val(int rank, size_t i) { return float((rank + 1) * 3 + int(i % 17)); }
float sum_over_ranks(int world, size_t i) {
  float s = 0;
  for (int r = 0; r < world; ++r) s += val(r, i);
  return s;
}

uint64_t all_reduce_bytes(uint64_t n, int N) { return N == 1 ? 0 : 2 * uint64_t(N - 1) * 4 * n / uint64_t(N); }

zt::CollRecord last_record(zt::Comm& c) {
  const std::vector<zt::CollRecord> recs = c.records();
  EXPECT_FALSE(recs.empty());
  return recs.empty() ? zt::CollRecord{} : recs.back();
}

TEST(Comm, Topology) {
  zt::Comm& c = *g_comm;
  const int N = c.world(), r = c.rank();
  EXPECT_GE(r, 0);
  EXPECT_LT(r, N);
  EXPECT_GE(c.local_rank(), 0);
  EXPECT_LT(c.local_rank(), c.local_world());
  EXPECT_LE(c.local_world(), N);
  std::vector<uint64_t> got = c.all_gather_u64(uint64_t(r) * 1000 + 7);
  ASSERT_EQ(got.size(), size_t(N));
  for (int q = 0; q < N; ++q) EXPECT_EQ(got[q], uint64_t(q) * 1000 + 7);
  std::vector<uint64_t> worlds = c.all_gather_u64(uint64_t(N));
  for (uint64_t w : worlds) EXPECT_EQ(w, uint64_t(N));
}

TEST(Comm, AllReduceSizesAndBytes) {
  zt::Comm& c = *g_comm;
  const int N = c.world();
  const std::vector<size_t> sizes = {0, 1, 2, 3, 5, 7, size_t(N), size_t(5 * N + 1), 1000, 65537, size_t(4096 * N),
                                     size_t(70001 * N + 1),    // a ring (mpi_thread.h), uneven chunks
                                     size_t(600001 * N + 1)};  // rounds of 3 segments (ring.h), uneven
  int64_t step = 100;
  for (size_t n : sizes) {
    SCOPED_TRACE("n=" + std::to_string(n));
    std::vector<float> buf(n);
    for (size_t i = 0; i < n; ++i) buf[i] = val(c.rank(), i);
    c.begin_step(step);
    zt::CommHandle h = c.all_reduce(buf.data(), n);
    EXPECT_TRUE(h.valid());
    c.wait(h);
    for (size_t i = 0; i < n; ++i)
      if (buf[i] != sum_over_ranks(N, i)) {
        ADD_FAILURE() << "element " << i << ": " << buf[i] << " != " << sum_over_ranks(N, i);
        break;
      }
    const zt::CommStepStats& st = c.step_stats();
    EXPECT_EQ(st.bytes, all_reduce_bytes(n, N));
    if (n % N == 0) {
      EXPECT_EQ(st.bytes * uint64_t(N), 2 * uint64_t(N - 1) * 4 * n);  // exact, no rounding
    }
    EXPECT_EQ(st.control_bytes, 0u);
    EXPECT_EQ(st.collectives, 1u);
    const zt::CollRecord rec = last_record(c);
    EXPECT_EQ(rec.seq, h.seq);
    EXPECT_EQ(rec.op, zt::CollOp::all_reduce);
    EXPECT_EQ(rec.bytes, all_reduce_bytes(n, N));
    EXPECT_EQ(rec.step, step);
    EXPECT_EQ(rec.state, zt::CollState::done);
    ++step;
  }
}

TEST(Comm, ReduceScatter) {
  zt::Comm& c = *g_comm;
  const int N = c.world(), r = c.rank();
  for (size_t recv_n : {size_t(1), size_t(2), size_t(3), size_t(1000), size_t(33333), size_t(70001), size_t(600001)}) {
    SCOPED_TRACE("recv_n=" + std::to_string(recv_n));
    std::vector<float> send(N * recv_n), recv(recv_n, -1.0f);
    for (size_t j = 0; j < send.size(); ++j) send[j] = val(r, j);
    c.begin_step(1);
    c.wait(c.reduce_scatter(send.data(), recv.data(), recv_n));
    for (size_t i = 0; i < recv_n; ++i)
      if (recv[i] != sum_over_ranks(N, r * recv_n + i)) {
        ADD_FAILURE() << "element " << i << ": " << recv[i] << " != " << sum_over_ranks(N, r * recv_n + i);
        break;
      }
    EXPECT_EQ(c.step_stats().bytes, uint64_t(N - 1) * 4 * recv_n);
    EXPECT_EQ(last_record(c).op, zt::CollOp::reduce_scatter);
    EXPECT_EQ(last_record(c).bytes, uint64_t(N - 1) * 4 * recv_n);
  }
}

TEST(Comm, ReduceScatterInPlace) {
  zt::Comm& c = *g_comm;
  const int N = c.world(), r = c.rank();
  for (size_t recv_n : {size_t(1), size_t(7), size_t(5000), size_t(70001), size_t(600001)}) {
    SCOPED_TRACE("recv_n=" + std::to_string(recv_n));
    std::vector<float> buf(N * recv_n);
    for (size_t j = 0; j < buf.size(); ++j) buf[j] = val(r, j);
    float* mine = buf.data() + r * recv_n;
    c.wait(c.reduce_scatter(buf.data(), mine, recv_n));
    for (size_t i = 0; i < recv_n; ++i)
      if (mine[i] != sum_over_ranks(N, r * recv_n + i)) {
        ADD_FAILURE() << "element " << i << ": " << mine[i] << " != " << sum_over_ranks(N, r * recv_n + i);
        break;
      }
  }
}

TEST(Comm, AllGather) {
  zt::Comm& c = *g_comm;
  const int N = c.world(), r = c.rank();
  for (size_t send_n : {size_t(1), size_t(5), size_t(1001), size_t(40000), size_t(70001), size_t(600001)}) {
    SCOPED_TRACE("send_n=" + std::to_string(send_n));
    std::vector<float> send(send_n), recv(N * send_n, -1.0f);
    for (size_t i = 0; i < send_n; ++i) send[i] = val(r, i);
    c.begin_step(2);
    c.wait(c.all_gather(send.data(), recv.data(), send_n));
    for (int q = 0; q < N; ++q)
      for (size_t i = 0; i < send_n; ++i)
        if (recv[q * send_n + i] != val(q, i)) {
          ADD_FAILURE() << "from rank " << q << " element " << i << ": " << recv[q * send_n + i];
          q = N;
          break;
        }
    EXPECT_EQ(c.step_stats().bytes, uint64_t(N - 1) * 4 * send_n);
    EXPECT_EQ(last_record(c).op, zt::CollOp::all_gather);
  }
}

TEST(Comm, AllGatherInPlace) {
  zt::Comm& c = *g_comm;
  const int N = c.world(), r = c.rank();
  // Below and above the ring's 256 KiB (mpi_thread.h), and rounds of 3 segments (ring.h).
  for (size_t send_n : {size_t(777), size_t(70001), size_t(600001)}) {
    std::vector<float> buf(N * send_n, -1.0f);
    for (size_t i = 0; i < send_n; ++i) buf[r * send_n + i] = val(r, i);
    c.wait(c.all_gather(buf.data() + r * send_n, buf.data(), send_n));
    for (int q = 0; q < N; ++q)
      for (size_t i = 0; i < send_n; ++i) ASSERT_EQ(buf[q * send_n + i], val(q, i)) << "rank " << q << " i " << i;
  }
}

TEST(Comm, BroadcastFromEveryRoot) {
  zt::Comm& c = *g_comm;
  const int N = c.world(), r = c.rank();
  for (size_t bytes : {size_t(1), size_t(13), size_t(4099)}) {
    for (int root = 0; root < N; ++root) {
      SCOPED_TRACE("bytes=" + std::to_string(bytes) + " root=" + std::to_string(root));
      std::vector<unsigned char> buf(bytes, 0);
      if (r == root)
        for (size_t i = 0; i < bytes; ++i) buf[i] = (unsigned char)((root * 31 + i) & 0xff);
      c.begin_step(3);
      c.wait(c.broadcast(buf.data(), bytes, root));
      for (size_t i = 0; i < bytes; ++i) ASSERT_EQ(buf[i], (unsigned char)((root * 31 + i) & 0xff)) << i;
      EXPECT_EQ(c.step_stats().bytes, (N > 1 && r == root) ? bytes : 0u);
      EXPECT_EQ(last_record(c).op, zt::CollOp::broadcast);
    }
  }
}

TEST(Comm, ManyInFlightWaitedOutOfOrder) {
  zt::Comm& c = *g_comm;
  const int N = c.world(), r = c.rank();
  const size_t n1 = 3 * N + 2, rs_n = 513, ag_n = 129, bc_bytes = 1000, n2 = 100000;
  std::vector<float> a(n1), rs_send(N * rs_n), rs_recv(rs_n), ag_send(ag_n), ag_recv(N * ag_n), e(n2);
  std::vector<unsigned char> bc(bc_bytes, 0);
  for (size_t i = 0; i < n1; ++i) a[i] = val(r, i);
  for (size_t i = 0; i < rs_send.size(); ++i) rs_send[i] = val(r, i + 5);
  for (size_t i = 0; i < ag_n; ++i) ag_send[i] = val(r, i + 9);
  for (size_t i = 0; i < n2; ++i) e[i] = val(r, i + 11);
  const int root = N - 1;
  if (r == root)
    for (size_t i = 0; i < bc_bytes; ++i) bc[i] = (unsigned char)(i * 7);

  c.begin_step(4);
  std::vector<zt::CommHandle> hs = {c.all_reduce(a.data(), n1), c.reduce_scatter(rs_send.data(), rs_recv.data(), rs_n),
                                    c.all_gather(ag_send.data(), ag_recv.data(), ag_n), c.broadcast(bc.data(), bc_bytes, root),
                                    c.all_reduce(e.data(), n2)};
  for (size_t k = 1; k < hs.size(); ++k) EXPECT_EQ(hs[k].seq, hs[k - 1].seq + 1);
  // Each rank waits in its own order (rotated by rank, reversed).
  std::vector<size_t> order(hs.size());
  std::iota(order.begin(), order.end(), 0);
  std::reverse(order.begin(), order.end());
  std::rotate(order.begin(), order.begin() + (r % order.size()), order.end());
  for (size_t k : order) c.wait(hs[k]);
  for (zt::CommHandle h : hs) EXPECT_TRUE(c.test(h));

  for (size_t i = 0; i < n1; ++i) ASSERT_EQ(a[i], sum_over_ranks(N, i));
  for (size_t i = 0; i < rs_n; ++i) ASSERT_EQ(rs_recv[i], sum_over_ranks(N, r * rs_n + i + 5));
  for (int q = 0; q < N; ++q)
    for (size_t i = 0; i < ag_n; ++i) ASSERT_EQ(ag_recv[q * ag_n + i], val(q, i + 9));
  for (size_t i = 0; i < bc_bytes; ++i) ASSERT_EQ(bc[i], (unsigned char)(i * 7));
  for (size_t i = 0; i < n2; ++i) ASSERT_EQ(e[i], sum_over_ranks(N, i + 11));

  const uint64_t expect = all_reduce_bytes(n1, N) + uint64_t(N - 1) * 4 * rs_n + uint64_t(N - 1) * 4 * ag_n +
                          ((N > 1 && r == root) ? bc_bytes : 0) + all_reduce_bytes(n2, N);
  EXPECT_EQ(c.step_stats().bytes, expect);
  EXPECT_EQ(c.step_stats().collectives, 5u);
  EXPECT_GE(c.step_stats().wait_s, 0.0);
}

// Large collectives (the ring / blocking-worker path of comm.collectives, >= 256 KiB per rank) in
// flight together, several at once past comm.inflight, in place, with small ones (MPI's
// non-blocking, completing first) among them, waited in an order of each rank's own; repeated,
// since what goes wrong here (a large one taken as done when a small one completes, two stepping
// on each other) shows only now and then.
TEST(Comm, ManyLargeInFlightTogether) {
  zt::Comm& c = *g_comm;
  const int N = c.world(), r = c.rank();
  const size_t n = 70001 * size_t(N) + 3, shard = 70001;  // 280 KB per rank and more
  for (int round = 0; round < 5; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    std::vector<std::vector<float>> ar(4, std::vector<float>(n));
    std::vector<float> rs(shard * N), ag(shard * N);
    for (size_t k = 0; k < ar.size(); ++k)
      for (size_t i = 0; i < n; ++i) ar[k][i] = val(r, i + k);
    for (size_t i = 0; i < rs.size(); ++i) rs[i] = val(r, i + 7);
    for (size_t i = 0; i < shard; ++i) ag[r * shard + i] = val(r, i + 13);
    std::vector<zt::CommHandle> hs;
    std::vector<float> small(1000);
    for (size_t i = 0; i < small.size(); ++i) small[i] = val(r, i + 3);
    hs.push_back(c.all_reduce(ar[0].data(), n));
    hs.push_back(c.all_reduce(small.data(), small.size()));
    hs.push_back(c.reduce_scatter(rs.data(), rs.data() + r * shard, shard));  // in place
    hs.push_back(c.all_reduce(ar[1].data(), n));
    hs.push_back(c.all_gather(ag.data() + r * shard, ag.data(), shard));  // in place
    hs.push_back(c.all_reduce(ar[2].data(), n));
    hs.push_back(c.all_reduce(ar[3].data(), n));
    std::vector<size_t> order(hs.size());
    std::iota(order.begin(), order.end(), 0);
    std::rotate(order.begin(), order.begin() + ((r + round) % order.size()), order.end());
    for (size_t k : order) c.wait(hs[k]);
    for (size_t i = 0; i < small.size(); ++i) ASSERT_EQ(small[i], sum_over_ranks(N, i + 3)) << "small at " << i;
    for (size_t k = 0; k < ar.size(); ++k)
      for (size_t i = 0; i < n; ++i) ASSERT_EQ(ar[k][i], sum_over_ranks(N, i + k)) << "all_reduce " << k << " at " << i;
    for (size_t i = 0; i < shard; ++i) ASSERT_EQ(rs[r * shard + i], sum_over_ranks(N, r * shard + i + 7)) << i;
    for (int q = 0; q < N; ++q)
      for (size_t i = 0; i < shard; ++i) ASSERT_EQ(ag[q * shard + i], val(q, i + 13)) << "from rank " << q << " at " << i;
  }
}

TEST(Comm, TestEventuallyTrue) {
  zt::Comm& c = *g_comm;
  const size_t n = size_t(1) << 20;
  std::vector<float> buf(n, 1.0f);
  zt::CommHandle h = c.all_reduce(buf.data(), n);
  const auto t0 = std::chrono::steady_clock::now();
  long polls = 0;
  while (!c.test(h)) {
    ++polls;
    ASSERT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 30.0)
        << "test() never became true";
  }
  EXPECT_TRUE(c.test(h));          // stays true
  EXPECT_TRUE(c.test({}));         // invalid handle: just progresses
  c.wait(h);                       // already complete: returns at once
  c.wait({});
  EXPECT_EQ(last_record(c).state, zt::CollState::done);
  EXPECT_GE(last_record(c).t_end, last_record(c).t_start);
  EXPECT_EQ(buf[0], float(c.world()));
  EXPECT_EQ(buf[n - 1], float(c.world()));
}

TEST(Comm, RingKeepsLast256InOrder) {
  zt::Comm& c = *g_comm;
  const int N = c.world();
  c.begin_step(42);
  std::vector<float> buf(N, 1.0f);
  zt::CommHandle first, last;
  for (int k = 0; k < 300; ++k) {
    last = c.all_reduce(buf.data(), N);
    if (k == 0) first = last;
    c.wait(last);
  }
  EXPECT_EQ(last.seq, first.seq + 299);
  const std::vector<zt::CollRecord> recs = c.records();
  ASSERT_EQ(recs.size(), zt::CollLog::kLogRecords);
  EXPECT_EQ(recs.back().seq, last.seq);
  for (size_t i = 1; i < recs.size(); ++i) EXPECT_EQ(recs[i].seq, recs[i - 1].seq + 1);
  for (size_t i = recs.size() - 200; i < recs.size(); ++i) {
    EXPECT_EQ(recs[i].step, 42);
    EXPECT_EQ(recs[i].state, zt::CollState::done);
    EXPECT_GE(recs[i].t_end, recs[i].t_start);
    if (i) {
      EXPECT_GE(recs[i].t_start, recs[i - 1].t_start);
    }
  }
  EXPECT_EQ(c.step_stats().collectives, 300u);
  EXPECT_EQ(c.step_stats().bytes, 300 * all_reduce_bytes(N, N));

  const std::string dump = c.log_dump(3);
  EXPECT_EQ(std::count(dump.begin(), dump.end(), '\n'), 3) << dump;
  EXPECT_NE(dump.find("#" + std::to_string(last.seq) + " all_reduce "), std::string::npos) << dump;
  EXPECT_NE(dump.find("step 42 done "), std::string::npos) << dump;
  EXPECT_EQ(dump.find("#" + std::to_string(last.seq - 3) + " "), std::string::npos) << dump;
}

TEST(Comm, ControlTrafficCountedApart) {
  zt::Comm& c = *g_comm;
  const int N = c.world(), r = c.rank();
  c.begin_step(7);
  double vals[3] = {double(r), 1.5, -0.25 * r};
  c.all_reduce_sum(vals, 3);
  EXPECT_DOUBLE_EQ(vals[0], N * (N - 1) / 2.0);
  EXPECT_DOUBLE_EQ(vals[1], 1.5 * N);
  EXPECT_DOUBLE_EQ(vals[2], -0.25 * N * (N - 1) / 2.0);
  c.barrier();
  std::vector<uint64_t> g = c.all_gather_u64(uint64_t(r) + 100);
  for (int q = 0; q < N; ++q) EXPECT_EQ(g[q], uint64_t(q) + 100);

  const zt::CommStepStats& st = c.step_stats();
  const uint64_t expect = (N == 1 ? 0 : 2 * uint64_t(N - 1) * 8 * 3 / uint64_t(N)) + 0 + uint64_t(N - 1) * 8;
  EXPECT_EQ(st.control_bytes, expect);
  EXPECT_EQ(st.bytes, 0u);
  EXPECT_EQ(st.collectives, 0u);
  EXPECT_EQ(st.control_collectives, 3u);
  const std::vector<zt::CollRecord> recs = c.records();
  ASSERT_GE(recs.size(), 3u);
  EXPECT_EQ(recs[recs.size() - 3].op, zt::CollOp::scalar_all_reduce);
  EXPECT_EQ(recs[recs.size() - 2].op, zt::CollOp::barrier);
  EXPECT_EQ(recs[recs.size() - 1].op, zt::CollOp::scalar_all_gather);
  for (size_t i = recs.size() - 3; i < recs.size(); ++i) EXPECT_EQ(recs[i].state, zt::CollState::done);
}

TEST(Comm, BeginStepResetsCounters) {
  zt::Comm& c = *g_comm;
  std::vector<float> buf(8, 1.0f);
  c.begin_step(10);
  c.wait(c.all_reduce(buf.data(), buf.size()));
  c.barrier();
  EXPECT_EQ(c.step_stats().collectives, 1u);
  c.begin_step(11);
  EXPECT_EQ(c.step_stats().bytes, 0u);
  EXPECT_EQ(c.step_stats().control_bytes, 0u);
  EXPECT_EQ(c.step_stats().collectives, 0u);
  EXPECT_EQ(c.step_stats().control_collectives, 0u);
  EXPECT_EQ(c.step_stats().wait_s, 0.0);
  c.wait(c.all_reduce(buf.data(), buf.size()));
  const std::vector<zt::CollRecord> recs = c.records();
  EXPECT_EQ(recs[recs.size() - 3].step, 10);
  EXPECT_EQ(recs[recs.size() - 2].step, 10);
  EXPECT_EQ(recs.back().step, 11);
}

TEST(Comm, OverlappingBuffersRejected) {
  zt::Comm& c = *g_comm;
  const int N = c.world(), r = c.rank();
  const size_t k = 4;
  std::vector<float> buf((N + 1) * k);
  const uint64_t seq_before = last_record(c).seq;
  // One element off the in-place slot overlaps; nothing may be launched (every rank throws).
  EXPECT_THROW(c.reduce_scatter(buf.data(), buf.data() + r * k + 1, k), zt::Error);
  EXPECT_THROW(c.all_gather(buf.data() + r * k + 1, buf.data(), k), zt::Error);
  EXPECT_EQ(last_record(c).seq, seq_before);
}

// Every rank skips the same collective (fault_skip_rank = own rank), so nothing hangs and the
// skip itself can be checked. Also covers creating a second Comm in the process.
TEST(Comm, FaultInjectionSkipsFirstModelStateCollectiveOfStep) {
  const int N = g_comm->world(), r = g_comm->rank();
  zt::CommOptions opts;
  zt::apply_comm_env(opts);  // ZT_COMM_COLLECTIVES=mpi|mpi_blocking / ZT_COMM_THREAD=0: the other paths (test/tests.cmake)
  opts.timeout_s = 60;
  opts.fault_skip_rank = r;
  opts.fault_skip_step = 5;
  std::unique_ptr<zt::Comm> c = zt::make_mpi_comm(opts);
  ASSERT_EQ(c->rank(), r);
  std::vector<float> buf(2 * N);
  auto fill = [&] { for (size_t i = 0; i < buf.size(); ++i) buf[i] = val(r, i); };

  c->begin_step(4);
  fill();
  c->wait(c->all_reduce(buf.data(), buf.size()));
  EXPECT_EQ(buf[0], sum_over_ranks(N, 0));
  EXPECT_EQ(last_record(*c).state, zt::CollState::done);

  c->begin_step(5);
  double x = 1;
  c->all_reduce_sum(&x, 1);  // control: never skipped
  EXPECT_EQ(x, double(N));
  unsigned char b = r == 0 ? 9 : 0;
  c->wait(c->broadcast(&b, 1, 0));  // broadcast: never skipped
  EXPECT_EQ(b, 9);
  const uint64_t bytes_before = c->step_stats().bytes;
  fill();
  zt::CommHandle h = c->all_reduce(buf.data(), buf.size());  // skipped
  EXPECT_TRUE(h.valid());
  EXPECT_TRUE(c->test(h));
  c->wait(h);
  for (size_t i = 0; i < buf.size(); ++i) ASSERT_EQ(buf[i], val(r, i)) << "skipped collective touched the data";
  const zt::CollRecord rec = last_record(*c);
  EXPECT_EQ(rec.seq, h.seq);
  EXPECT_EQ(rec.state, zt::CollState::skipped);
  EXPECT_EQ(rec.bytes, all_reduce_bytes(buf.size(), N));  // what it would have sent
  EXPECT_EQ(rec.step, 5);
  EXPECT_EQ(c->step_stats().bytes, bytes_before);
  EXPECT_NE(c->log_dump(4).find("skipped (fault injection)"), std::string::npos) << c->log_dump(4);

  // Only the first one of the step, and only once.
  std::vector<float> recv(2);
  c->wait(c->reduce_scatter(buf.data(), recv.data(), 2));
  EXPECT_EQ(recv[0], sum_over_ranks(N, 2 * r));
  EXPECT_EQ(last_record(*c).state, zt::CollState::done);
  c->begin_step(5);
  fill();
  c->wait(c->all_reduce(buf.data(), buf.size()));
  EXPECT_EQ(buf[1], sum_over_ranks(N, 1));
  EXPECT_EQ(last_record(*c).state, zt::CollState::done);
}

// Rank 0 waits for a collective nobody else has started: CommTimeout naming rank, op, sequence.
// The others then join, so the collective completes and the job goes on.
TEST(Comm, TimeoutNamesTheCollective) {
  const int N = g_comm->world(), r = g_comm->rank();
  if (N < 2) GTEST_SKIP() << "needs two ranks";
  zt::CommOptions opts;
  zt::apply_comm_env(opts);  // ZT_COMM_COLLECTIVES=mpi|mpi_blocking / ZT_COMM_THREAD=0: the other paths (test/tests.cmake)
  opts.timeout_s = 0.5;
  std::unique_ptr<zt::Comm> c = zt::make_mpi_comm(opts);
  c->begin_step(3);
  std::vector<float> buf(4, 1.0f);
  if (r == 0) {
    std::fprintf(stderr, "[rank 0] TimeoutNamesTheCollective: the timeout report below is expected\n");
    zt::CommHandle h = c->all_reduce(buf.data(), buf.size());
    const auto t0 = std::chrono::steady_clock::now();
    std::string what;
    try {
      c->wait(h);
    } catch (const zt::CommTimeout& e) {
      what = e.what();
    }
    const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_GE(waited, 0.5);
    EXPECT_LT(waited, 5.0);
    // No "rank 0:": main's "error: rank R:" is the one prefix (train.cu).
    const std::string expect = "collective all_reduce #" + std::to_string(h.seq) + " (" +
                               std::to_string(all_reduce_bytes(4, N)) + " bytes, step 3) did not complete within 0.5 s";
    EXPECT_EQ(what.rfind(expect, 0), 0u) << what;
    EXPECT_NE(what.find("another rank is probably stuck or skipped it"), std::string::npos) << what;
    EXPECT_EQ(what.find('\n'), std::string::npos) << "what() must be one line: " << what;
    EXPECT_TRUE(last_record(*c).timed_out);
    EXPECT_EQ(last_record(*c).state, zt::CollState::pending);
    EXPECT_NE(c->log_dump(2).find("TIMED OUT"), std::string::npos) << c->log_dump(2);
    EXPECT_GE(c->step_stats().wait_s, 0.5);
    g_comm->barrier();
    c->wait(h);  // the others have joined now
    EXPECT_EQ(last_record(*c).state, zt::CollState::done);
    EXPECT_NE(c->log_dump(2).find("(timed out earlier)"), std::string::npos) << c->log_dump(2);
  } else {
    g_comm->barrier();
    c->wait(c->all_reduce(buf.data(), buf.size()));
  }
  EXPECT_EQ(buf[0], float(N));
}

// Failures of ranks other than 0, prefixed with the rank (rank 0 keeps gtest's normal output).
class RankFailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit RankFailurePrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& r) override {
    if (!r.failed()) return;
    std::fprintf(stderr, "[rank %d] %s:%d: Failure\n%s\n", rank_, r.file_name() ? r.file_name() : "?",
                 r.line_number(), r.summary());
  }

 private:
  int rank_;
};

}  // namespace

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  zt::CommOptions opts;
  zt::apply_comm_env(opts);  // ZT_COMM_COLLECTIVES=mpi|mpi_blocking / ZT_COMM_THREAD=0: the other paths (test/tests.cmake)
  opts.timeout_s = 60;  // a test that desynchronises the ranks fails instead of hanging
  std::unique_ptr<zt::Comm> comm;
  try {
    comm = zt::make_mpi_comm(opts);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "test_comm: cannot create the MPI comm: %s\n", e.what());
    return 1;
  }
  g_comm = comm.get();
  if (comm->rank() != 0) {
    ::testing::TestEventListeners& ls = ::testing::UnitTest::GetInstance()->listeners();
    delete ls.Release(ls.default_result_printer());
    ls.Append(new RankFailurePrinter(comm->rank()));
  }
  int rc = RUN_ALL_TESTS();
  try {
    double failed = rc != 0 ? 1 : 0;
    comm->all_reduce_sum(&failed, 1);
    if (comm->rank() == 0)
      std::printf("test_comm: %d rank(s), %d failed\n", comm->world(), int(failed));
    rc = failed > 0 ? 1 : 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rank %d: %s\n", comm->rank(), e.what());
    comm->abort_all(2);
  }
  g_comm = nullptr;
  comm.reset();
  return rc;
}
