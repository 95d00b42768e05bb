// Groups and point to point of the MPI Comm (src/comm/comm.h "Groups", "Point to point";
// docs/design.md §3.4). Run under mpirun like test_comm.cpp:
//   mpirun --oversubscribe -np N ./zt_test_comm_groups     (ctest: N = 2, 3, 4, and 4 without the comm thread)
// The ranks form a grid two wide: rows {0,1}, {2,3}, ... and columns {even}, {odd}. At N = 4 that is
// 2x2; at N = 3 a row and a column of one rank. Exit 0 only when every rank passed.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "comm/comm.h"
#include "runtime/trace.h"

namespace {

zt::Comm* g_world = nullptr;

float val(int world_rank, size_t i) { return float((world_rank + 1) * 5 + int(i % 13)); }  // small: exact sums

// The world ranks of my row / column in the grid.
std::vector<int> row_members(int r, int N) {
  std::vector<int> m;
  for (int q = r / 2 * 2; q < std::min(N, r / 2 * 2 + 2); ++q) m.push_back(q);
  return m;
}
std::vector<int> col_members(int r, int N) {
  std::vector<int> m;
  for (int q = r % 2; q < N; q += 2) m.push_back(q);
  return m;
}
int index_of(const std::vector<int>& v, int x) { return int(std::find(v.begin(), v.end(), x) - v.begin()); }

std::unique_ptr<zt::Comm> make_row(zt::Comm& w) { return w.split(w.rank() / 2, w.rank(), "row " + std::to_string(w.rank() / 2)); }
std::unique_ptr<zt::Comm> make_col(zt::Comm& w) { return w.split(w.rank() % 2, w.rank(), "col " + std::to_string(w.rank() % 2)); }

uint64_t all_reduce_bytes(uint64_t n, int N) { return N == 1 ? 0 : 2 * uint64_t(N - 1) * 4 * n / uint64_t(N); }

TEST(Groups, RowsAndColumns) {
  zt::Comm& w = *g_world;
  const int r = w.rank(), N = w.world();
  std::unique_ptr<zt::Comm> row = make_row(w), col = make_col(w);
  const std::vector<int> rm = row_members(r, N), cm = col_members(r, N);
  EXPECT_EQ(w.name(), "world");
  EXPECT_EQ(row->name(), "row " + std::to_string(r / 2));
  EXPECT_EQ(col->name(), "col " + std::to_string(r % 2));
  EXPECT_EQ(row->world(), int(rm.size()));
  EXPECT_EQ(col->world(), int(cm.size()));
  EXPECT_EQ(row->rank(), index_of(rm, r));
  EXPECT_EQ(col->rank(), index_of(cm, r));
  EXPECT_EQ(row->global_rank(), r);
  EXPECT_EQ(col->global_rank(), r);
  // Who is in my group, in group-rank order.
  const std::vector<uint64_t> got = col->all_gather_u64(uint64_t(r));
  ASSERT_EQ(got.size(), cm.size());
  for (size_t k = 0; k < cm.size(); ++k) EXPECT_EQ(got[k], uint64_t(cm[k]));
  // Row and column sums (a ring above 256 KiB per rank, MPI's below).
  for (size_t n : {size_t(7), size_t(200003)}) {
    SCOPED_TRACE("n=" + std::to_string(n));
    std::vector<float> a(n), b(n);
    for (size_t i = 0; i < n; ++i) a[i] = b[i] = val(r, i);
    row->begin_step(5);
    col->begin_step(5);
    row->wait(row->all_reduce(a.data(), n));
    col->wait(col->all_reduce(b.data(), n));
    for (size_t i = 0; i < n; ++i) {
      float rs = 0, cs = 0;
      for (int q : rm) rs += val(q, i);
      for (int q : cm) cs += val(q, i);
      if (a[i] != rs || b[i] != cs) {
        ADD_FAILURE() << "element " << i << ": row " << a[i] << " != " << rs << " or col " << b[i] << " != " << cs;
        break;
      }
    }
    EXPECT_EQ(row->step_stats().bytes, all_reduce_bytes(n, row->world()));  // the group's byte model
    EXPECT_EQ(col->step_stats().bytes, all_reduce_bytes(n, col->world()));
  }
  // Each group numbers its own collectives: the all_gather_u64 was the column's #1.
  EXPECT_EQ(col->records().front().seq, 1u);
  EXPECT_EQ(col->records().front().op, zt::CollOp::scalar_all_gather);
  EXPECT_EQ(row->records().front().op, zt::CollOp::all_reduce);
}

TEST(Groups, KeyOrdersTheGroup) {
  zt::Comm& w = *g_world;
  std::unique_ptr<zt::Comm> rev = w.split(0, w.world() - w.rank(), "reversed");
  EXPECT_EQ(rev->world(), w.world());
  EXPECT_EQ(rev->rank(), w.world() - 1 - w.rank());
  const std::vector<uint64_t> got = rev->all_gather_u64(uint64_t(w.rank()));
  for (int k = 0; k < w.world(); ++k) EXPECT_EQ(got[size_t(k)], uint64_t(w.world() - 1 - k));
  // A group of a group: the pairs {0,1}, {2,3} of the reversed order.
  std::unique_ptr<zt::Comm> pair = rev->split(rev->rank() / 2, rev->rank(), "pair");
  const std::vector<uint64_t> members = pair->all_gather_u64(uint64_t(w.rank()));
  for (size_t k = 0; k < members.size(); ++k) EXPECT_EQ(members[k], uint64_t(w.world() - 1 - (rev->rank() / 2 * 2 + int(k))));
}

// Every rank sends to rank + 1 and receives from rank - 1, several messages in flight at once,
// waited for in another order than issued; bytes counted exactly (send: its bytes, recv: 0).
void ring(zt::Comm& c, int64_t step) {
  const int g = c.rank(), N = c.world();
  if (N == 1) return;
  const int next = (g + 1) % N, prev = (g + N - 1) % N;
  const std::vector<size_t> sizes = {1, 1000, 300001};  // floats; the last beyond any eager limit
  std::vector<std::vector<float>> out(sizes.size()), in(sizes.size());
  std::vector<zt::CommHandle> sends, recvs;
  c.begin_step(step);
  uint64_t sent = 0;
  for (size_t m = 0; m < sizes.size(); ++m) {
    out[m].resize(sizes[m]);
    in[m].assign(sizes[m], -1.0f);
    for (size_t i = 0; i < sizes[m]; ++i) out[m][i] = val(c.global_rank(), i + m);
    sends.push_back(c.send(out[m].data(), 4 * sizes[m], next));
    recvs.push_back(c.recv(in[m].data(), 4 * sizes[m], prev));
    sent += 4 * sizes[m];
  }
  const std::vector<uint64_t> globals = c.all_gather_u64(uint64_t(c.global_rank()));  // a collective amid them
  for (size_t m = sizes.size(); m-- > 0;) c.wait(recvs[m]);
  c.wait_all(sends);
  for (size_t m = 0; m < sizes.size(); ++m)
    for (size_t i = 0; i < sizes[m]; ++i)
      if (in[m][i] != val(int(globals[size_t(prev)]), i + m)) {
        ADD_FAILURE() << "message " << m << " element " << i << ": " << in[m][i] << " from group rank " << prev;
        break;
      }
  const zt::CommStepStats& st = c.step_stats();
  EXPECT_EQ(st.bytes, sent);
  EXPECT_EQ(st.collectives, 2 * sizes.size());
  EXPECT_EQ(st.control_collectives, 1u);
  size_t n_send = 0, n_recv = 0;
  for (const zt::CollRecord& rec : c.records()) {
    if (rec.step != step) continue;
    EXPECT_EQ(rec.state, zt::CollState::done);
    if (rec.op == zt::CollOp::send) {
      EXPECT_EQ(rec.peer, next);
      EXPECT_EQ(rec.bytes, 4 * sizes[n_send++]);
    } else if (rec.op == zt::CollOp::recv) {
      EXPECT_EQ(rec.peer, prev);
      EXPECT_EQ(rec.bytes, 0u);
      ++n_recv;
    }
  }
  EXPECT_EQ(n_send, sizes.size());
  EXPECT_EQ(n_recv, sizes.size());
}

TEST(PointToPoint, RingInTheWorld) { ring(*g_world, 40); }

TEST(PointToPoint, RingInAGroup) {
  std::unique_ptr<zt::Comm> rev = g_world->split(0, -g_world->rank(), "reversed ring");
  ring(*rev, 41);
  std::unique_ptr<zt::Comm> col = make_col(*g_world);
  ring(*col, 42);
  // Collectives after point to point still meet (p2p does not shift the channels).
  std::vector<float> x(5, 1.0f);
  rev->wait(rev->all_reduce(x.data(), x.size()));
  EXPECT_EQ(x[0], float(g_world->world()));
}

// Two messages to one peer, the second waited for first: they match by order, not by wait.
TEST(PointToPoint, MatchedByOrderPerPeer) {
  zt::Comm& w = *g_world;
  if (w.world() == 1) return;
  const int r = w.rank(), N = w.world();
  if (r < 2) {
    const int peer = 1 - r;
    std::vector<float> a(300000, float(10 + r)), b(3, float(20 + r)), ra(a.size()), rb(b.size());
    zt::CommHandle sa, sb, qa, qb;
    if (r == 0) {
      sa = w.send(a.data(), 4 * a.size(), peer);
      sb = w.send(b.data(), 4 * b.size(), peer);
      qa = w.recv(ra.data(), 4 * ra.size(), peer);
      qb = w.recv(rb.data(), 4 * rb.size(), peer);
    } else {
      qa = w.recv(ra.data(), 4 * ra.size(), peer);
      qb = w.recv(rb.data(), 4 * rb.size(), peer);
      sa = w.send(a.data(), 4 * a.size(), peer);
      sb = w.send(b.data(), 4 * b.size(), peer);
    }
    w.wait(qb);
    w.wait(sb);
    w.wait(qa);
    w.wait(sa);
    EXPECT_EQ(ra[0], float(10 + peer));
    EXPECT_EQ(ra.back(), float(10 + peer));
    EXPECT_EQ(rb[2], float(20 + peer));
  }
  (void)N;
  w.barrier();
}

// A row's all-reduce and a column's in flight at once, each logged under its group, none in the world's.
TEST(Groups, CollectivesOfTwoGroupsAtOnce) {
  zt::Comm& w = *g_world;
  const int r = w.rank(), N = w.world();
  std::unique_ptr<zt::Comm> row = make_row(w), col = make_col(w);
  const size_t n = 100000;
  std::vector<float> a(n), b(n);
  for (size_t i = 0; i < n; ++i) a[i] = b[i] = val(r, i);
  const uint64_t world_seqs = w.records().empty() ? 0 : w.records().back().seq;
  row->begin_step(7);
  col->begin_step(7);
  const zt::CommHandle ha = row->all_reduce(a.data(), n), hb = col->all_reduce(b.data(), n);
  if (r % 2) {  // half the ranks wait for the column first
    col->wait(hb);
    row->wait(ha);
  } else {
    row->wait(ha);
    col->wait(hb);
  }
  float rs = 0, cs = 0;
  for (int q : row_members(r, N)) rs += val(q, 3);
  for (int q : col_members(r, N)) cs += val(q, 3);
  EXPECT_EQ(a[3], rs);
  EXPECT_EQ(b[3], cs);
  ASSERT_FALSE(row->records().empty());
  EXPECT_EQ(row->records().back().op, zt::CollOp::all_reduce);
  EXPECT_EQ(row->records().back().bytes, all_reduce_bytes(n, row->world()));
  EXPECT_EQ(col->records().back().bytes, all_reduce_bytes(n, col->world()));
  EXPECT_EQ(row->records().back().state, zt::CollState::done);
  EXPECT_EQ(w.records().empty() ? 0 : w.records().back().seq, world_seqs);  // nothing in the world's log
  EXPECT_NE(row->log_dump(1).find("all_reduce"), std::string::npos);
}

// run.trace: a group's collectives on lanes named for the group.
TEST(Groups, TraceLanesPerGroup) {
  zt::Comm& w = *g_world;
  const std::string dir = (std::filesystem::temp_directory_path() / "zt_groups_trace").string();
  if (w.rank() == 0) std::filesystem::create_directories(dir);
  w.barrier();
  const std::string file = zt::Tracer::rank_path(dir + "/t.json", w.rank()) + "." + std::to_string(::getpid());
  {
    zt::Tracer tr(file, w.rank());
    w.set_tracer(&tr);
    std::unique_ptr<zt::Comm> row = make_row(w);  // inherits the tracer
    std::vector<float> x(10, 1.0f);
    row->wait(row->all_reduce(x.data(), x.size()));
    w.wait(w.all_reduce(x.data(), x.size()));
    if (row->world() > 1) {
      const int peer = 1 - row->rank();
      std::vector<float> y(4);
      zt::CommHandle s = row->send(x.data(), 16, peer), q = row->recv(y.data(), 16, peer);
      row->wait(q);
      row->wait(s);
    }
    w.set_tracer(nullptr);
    row->set_tracer(nullptr);
    tr.close();
  }
  std::ifstream f(file);
  std::stringstream ss;
  ss << f.rdbuf();
  const std::string t = ss.str();
  std::filesystem::remove(file);
  const std::string lane = "\"comm row " + std::to_string(w.rank() / 2) + "\"";
  EXPECT_NE(t.find(lane), std::string::npos) << t.substr(0, 2000);
  EXPECT_NE(t.find("\"tid\":1000,\"ts\""), std::string::npos) << "no event on the group's first lane";
  EXPECT_NE(t.find("\"tid\":10,\"ts\""), std::string::npos) << "no event on the world's comm lane";
  if (w.world() > 1 && w.rank() / 2 * 2 + 1 < w.world()) {
    EXPECT_NE(t.find("\"peer\":"), std::string::npos);
  }
}

TEST(Groups, BadArguments) {
  zt::Comm& w = *g_world;
  std::vector<float> x(1);
  EXPECT_THROW(w.send(x.data(), 4, w.rank()), zt::Error);  // not to itself
  EXPECT_THROW(w.recv(x.data(), 4, w.world()), zt::Error);
  EXPECT_THROW(w.split(-1, 0, "neg"), zt::Error);  // refused before MPI: every rank throws alike
}

}  // namespace

// One report: rank 0 prints gtest's; the other ranks only their failures (--gtest_brief). The
// verdict is every rank's, summed over the world.
int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  zt::CommOptions opts;
  zt::apply_comm_env(opts);  // ZT_COMM_THREAD=0: without the comm thread (test/tests.cmake)
  opts.timeout_s = 60;       // a test that desynchronises the ranks fails instead of hanging
  std::unique_ptr<zt::Comm> world = zt::make_mpi_comm(opts);
  g_world = world.get();
  if (world->rank() != 0) ::testing::GTEST_FLAG(brief) = true;
  double failed = RUN_ALL_TESTS() != 0 ? 1 : 0;
  world->all_reduce_sum(&failed, 1);
  if (world->rank() == 0) std::printf("groups_test: %d rank(s), %d failed\n", world->world(), int(failed));
  g_world = nullptr;
  return failed > 0 ? 1 : 0;
}
