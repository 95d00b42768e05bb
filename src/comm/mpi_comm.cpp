// MPI backend of Comm (host buffers). Every collective is a non-blocking MPI call (MPI_I*) kept
// as an MPI_Request keyed by its sequence number. Open MPI moves a non-blocking collective forward
// only inside MPI calls, so test() runs MPI_Testsome over every pending request (progressing all
// of them, not just the one asked about), and wait() polls the same way until done or timeout_s.
//
//   all_reduce       MPI_Iallreduce(MPI_IN_PLACE, MPI_FLOAT, MPI_SUM)
//   reduce_scatter   MPI_Ireduce_scatter_block      all_gather   MPI_Iallgather
//   broadcast        MPI_Ibcast (bytes)             control      MPI_Iallreduce / MPI_Ibarrier / MPI_Iallgather
//
// With the communication thread (below), float all_reduce / reduce_scatter / all_gather of at least
// 256 KiB per rank run instead as ring schedules of point-to-point rounds (ring.h: Open MPI's libnbc
// algorithms send 2-3x the ring's bytes time on a slow link), or with CommOptions::collectives
// (comm.collectives, or ZT_COMM_COLLECTIVES) "mpi" as MPI's non-blocking ones, "mpi_blocking" as
// MPI's blocking ones (MPI_Allreduce, MPI_Reduce_scatter_block, MPI_Allgather: coll/tuned) on a
// worker thread each (bench/bench_collectives.cpp measures the three; docs/multihost.md).
//
// Communication thread (the CPU analogue of a communication stream; default with world > 1, off with
// CommOptions::thread false: comm.thread, or ZT_COMM_THREAD=0): Open MPI advances a non-blocking
// collective over TCP only inside MPI calls, so a collective started between units of compute barely
// moves until the next wait (measured: 0-7% of the communication hidden on a 1 Gbit/s link). With the
// thread, the caller only enqueues: one thread per Comm starts the collectives in the order they were
// issued (so every rank starts them in the same order) and polls MPI_Testsome every
// CommOptions::poll_us microseconds (comm.poll_us, default 50) while any is in flight, sleeping on a
// condition variable otherwise; completion is an atomic flag that
// test()/wait() read without calling MPI. The bookkeeping (CollLog) stays on the caller's thread.
// MPI is initialised with MPI_THREAD_MULTIPLE for it (falls back to the caller's thread when the
// library provides less).
//
// Collectives run on a duplicate of MPI_COMM_WORLD (a group made by split: of its MPI_Comm_split
// result), so nothing else in the process can match them by accident. Sends and receives
// (MPI_Issend / MPI_Irecv, tagged by their order per peer) run on another duplicate, split on a
// third (comm.h "Groups", "Point to point"). Errors come back as codes (MPI_ERRORS_RETURN) and become zt::Error.
// Construction (MPI_Comm_dup, MPI_Comm_split_type) is blocking and has no timeout.
#include "comm/mpi_check.h"  // first: includes <mpi.h> without the C++ bindings

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "comm/coll_log.h"
#include "comm/comm.h"
#include "comm/mpi_thread.h"
#include "runtime/launcher.h"

namespace zt {
namespace {

using mpi_thread::CommThread;
using mpi_thread::Job;
using mpi_thread::Ring;

// Process-wide MPI lifetime: initialised by the first make_mpi_comm (unless someone else did),
// finalised at exit (atexit) only if we initialised it, after an exit barrier with a timeout.
// Comms may be created and destroyed any number of times in between.
bool g_we_initialised = false;
bool g_atexit_registered = false;
// Collectives that timed out and are still pending, over every Comm: exiting with one left means
// the other ranks are stuck, and MPI_Finalize would wait for them forever.
int g_stuck_collectives = 0;
// A communicator of its own for the exit barrier, so it can never match a collective left pending
// on a Comm's communicator.
MPI_Comm g_exit_comm = MPI_COMM_NULL;
// 2 * the largest timeout_s of any Comm + 5 s: longer than any collective timeout, so that when a
// rank is stuck, the ranks waiting in a collective report it (and abort) first.
double g_exit_timeout_s = 0;

// Ranks enter MPI_Finalize only once every rank has reached the exit. Reason: with Open MPI 4.1
// (Debian, external PMIx), a rank sitting in MPI_Finalize while another calls MPI_Abort makes
// mpirun hang or crash after all processes are gone (measured: 6 of 15 runs of hang_probe). A rank
// polling this barrier is simply killed by the abort. Returns false on timeout or error.
bool exit_barrier(int* rank) {
  MPI_Comm_rank(g_exit_comm, rank);
  int size = 1;
  MPI_Comm_size(g_exit_comm, &size);
  if (size == 1) return true;
  MPI_Request req = MPI_REQUEST_NULL;
  if (MPI_Ibarrier(g_exit_comm, &req) != MPI_SUCCESS) return false;
  const auto t0 = std::chrono::steady_clock::now();
  for (;;) {
    int flag = 0;
    if (MPI_Test(&req, &flag, MPI_STATUS_IGNORE) != MPI_SUCCESS) return false;
    if (flag) return true;
    if (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() > g_exit_timeout_s) return false;
    usleep(1000);
  }
}

void stop_comm_threads();

void finalize_at_exit() {
  stop_comm_threads();
  int finalized = 0;
  if (MPI_Finalized(&finalized) != MPI_SUCCESS || finalized) return;
  if (g_stuck_collectives > 0) {
    std::fprintf(stderr,
                 "zerotrain: exiting with %d timed-out collective(s) pending; aborting the MPI job instead of "
                 "finalising (MPI_Finalize would wait for the stuck ranks forever)\n",
                 g_stuck_collectives);
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  if (!g_we_initialised) return;
  int rank = 0;
  if (!exit_barrier(&rank)) {
    std::fprintf(stderr,
                 "zerotrain: rank %d: the other ranks did not reach the end of the program within %g s (one is "
                 "stuck or failed); aborting the MPI job instead of waiting in MPI_Finalize\n",
                 rank, g_exit_timeout_s);
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  MPI_Comm_free(&g_exit_comm);
  MPI_Finalize();
}

bool g_thread_multiple = false;  // MPI provides MPI_THREAD_MULTIPLE (the comm thread needs it)

std::mutex g_threads_mu;
std::vector<std::shared_ptr<CommThread>> g_threads;  // live comm threads, stopped before MPI_Finalize

void stop_comm_threads() {
  std::vector<std::shared_ptr<CommThread>> ts;
  {
    std::lock_guard<std::mutex> g(g_threads_mu);
    ts.swap(g_threads);
  }
  for (auto& t : ts) t->shutdown();
}

// `thread`: the comm thread is wanted (MPI_THREAD_MULTIPLE); read only by the first call, which
// initialises MPI.
void ensure_mpi(bool thread) {
  int initialized = 0, finalized = 0;
  ZT_CHECK_MPI(MPI_Initialized(&initialized));
  ZT_CHECK_MPI(MPI_Finalized(&finalized));
  ZT_REQUIRE(!finalized, "MPI has already been finalised in this process; create the MPI communicator before "
                         "MPI_Finalize (MPI cannot be initialised twice)");
  if (!initialized) {
    // Started by hand (no launcher): a singleton that needs no runtime daemon. Open MPI 4 otherwise
    // forks an orted for it, which costs each one-rank run about 0.15-0.2 s of start-up and exit
    // on this machine (a one-step tiny run: 0.95 s -> 0.77 s). It changes no result. An explicit
    // setting in the environment wins (setenv without overwrite).
    if (this_launch().launcher.empty()) ::setenv("OMPI_MCA_ess_singleton_isolated", "1", 0);
    int provided = 0;
    const int want = thread ? MPI_THREAD_MULTIPLE : MPI_THREAD_FUNNELED;
    ZT_CHECK_MPI(MPI_Init_thread(nullptr, nullptr, want, &provided));
    g_we_initialised = true;
    ZT_REQUIRE(provided >= MPI_THREAD_FUNNELED,
               "the MPI library provides thread level " << provided << ", below MPI_THREAD_FUNNELED");
  }
  int level = MPI_THREAD_SINGLE;
  ZT_CHECK_MPI(MPI_Query_thread(&level));
  g_thread_multiple = level >= MPI_THREAD_MULTIPLE;
  ZT_CHECK_MPI(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));
  if (!g_atexit_registered) {
    if (g_we_initialised) ZT_CHECK_MPI(MPI_Comm_dup(MPI_COMM_WORLD, &g_exit_comm));
    ZT_REQUIRE(std::atexit(finalize_at_exit) == 0, "could not register MPI_Finalize with atexit");
    g_atexit_registered = true;
  }
}

int mpi_count(size_t n, const char* what) {
  ZT_REQUIRE(n <= size_t(INT_MAX), what << ": " << n << " elements is more than MPI's int count allows ("
                                        << INT_MAX << "); use smaller buckets/units");
  return int(n);
}

bool overlaps(const void* a, size_t a_bytes, const void* b, size_t b_bytes) {
  const char* pa = static_cast<const char*>(a);
  const char* pb = static_cast<const char*>(b);
  return a_bytes && b_bytes && pa < pb + b_bytes && pb < pa + a_bytes;
}

// Channels: collective #seq runs on communicator seq % kChannels (duplicates of MPI_COMM_WORLD).
// MPI matches collectives by their order on a communicator, so with a single one, a rank that
// skips (or adds) a collective gets its later ones matched with different collectives of the
// other ranks: wrong data when the sizes agree, MPI_ERR_TRUNCATE and, in Open MPI 4.1's libnbc,
// heap corruption (free(): invalid next size) when they differ -- observed in test/comm/hang_train.sh. With
// channels, a collective can only meet collectives of the same sequence number (mod kChannels) on
// the other ranks, so a skip makes every rank wait (and time out, naming the sequence number)
// instead, as long as no rank gets kChannels collectives ahead: it cannot, unless more than about
// kChannels/2 collectives are in flight at once (the engine has at most ~units or ~buckets in
// flight: measured 14 for 12 layers). Creating 256 duplicates costs ~0.1 s at start-up (4 ranks).
constexpr int kChannels = 256;
constexpr double kAbortGraceS = 5;  // abort_all's watchdog
// Point to point: the n-th message from A to B carries tag n % kP2pTags (MPI guarantees tags up to
// 32767), so sends and receives match by their order per peer even when the comm thread starts
// them out of order (a wait promotes its message ahead of the queue).
constexpr uint64_t kP2pTags = 32768;

MPI_Comm dup_world(bool thread) {
  ensure_mpi(thread);
  MPI_Comm c = MPI_COMM_NULL;
  ZT_CHECK_MPI(MPI_Comm_dup(MPI_COMM_WORLD, &c));
  ZT_CHECK_MPI(MPI_Comm_set_errhandler(c, MPI_ERRORS_RETURN));
  return c;
}

// The world rank of each rank of `c` (for diagnostics).
std::vector<int> world_ranks(MPI_Comm c, int n) {
  MPI_Group g = MPI_GROUP_NULL, w = MPI_GROUP_NULL;
  ZT_CHECK_MPI(MPI_Comm_group(c, &g));
  ZT_CHECK_MPI(MPI_Comm_group(MPI_COMM_WORLD, &w));
  std::vector<int> in(static_cast<size_t>(n)), out(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) in[size_t(r)] = r;
  ZT_CHECK_MPI(MPI_Group_translate_ranks(g, n, in.data(), w, out.data()));
  MPI_Group_free(&g);
  MPI_Group_free(&w);
  return out;
}

class MpiComm final : public Comm {
 public:
  // `comm`: the group's communicator (owned from here on, MPI_ERRORS_RETURN set), `name` "world" for
  // MPI_COMM_WORLD's duplicate.
  MpiComm(const CommOptions& opts, MPI_Comm comm, const std::string& name)
      : comm_(comm), rank_(comm_rank(comm_)), world_(comm_size(comm_)),
        log_(rank_, world_, opts, name, name == "world" ? std::vector<int>{} : world_ranks(comm_, world_)),
        collectives_(opts.collectives), global_rank_(comm_rank(MPI_COMM_WORLD)) {
    channels_.push_back(comm_);
    if (world_ > 1) {
      for (int k = 1; k < kChannels; ++k) {
        MPI_Comm c = MPI_COMM_NULL;
        ZT_CHECK_MPI(MPI_Comm_dup(comm_, &c));
        channels_.push_back(c);
      }
    }
    MPI_Comm node = MPI_COMM_NULL;
    ZT_CHECK_MPI(MPI_Comm_split_type(comm_, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &node));
    ZT_CHECK_MPI(MPI_Comm_rank(node, &local_rank_));
    ZT_CHECK_MPI(MPI_Comm_size(node, &local_world_));
    ZT_CHECK_MPI(MPI_Comm_free(&node));
    ZT_CHECK_MPI(MPI_Comm_dup(comm_, &p2p_));
    ZT_CHECK_MPI(MPI_Comm_dup(comm_, &split_));
    sent_.assign(size_t(world_), 0);
    received_.assign(size_t(world_), 0);
    gather_u64_.resize(world_);
    if (world_ > 1 && g_thread_multiple && opts.thread) {
      thread_ = CommThread::launch(unsigned(opts.poll_us), unsigned(opts.inflight));
      std::lock_guard<std::mutex> g(g_threads_mu);
      g_threads.push_back(thread_);
    }
  }

  ~MpiComm() override {
    if (thread_) {
      thread_->shutdown();  // joins when nothing is in flight, else leaves it polling (detached)
      std::lock_guard<std::mutex> g(g_threads_mu);
      g_threads.erase(std::remove(g_threads.begin(), g_threads.end(), thread_), g_threads.end());
    }
    int finalized = 0;
    if (MPI_Finalized(&finalized) != MPI_SUCCESS || finalized) return;
    if (!pending_.empty()) {
      // Freeing the communicator under in-flight collectives is erroneous; leave it to MPI_Finalize/abort.
      std::fprintf(stderr, "zerotrain: rank %d: MPI comm destroyed with %zu collective(s) pending (oldest #%llu)\n",
                   rank_, pending_.size(), (unsigned long long)pending_.front().seq);
      return;
    }
    for (MPI_Comm& c : channels_) MPI_Comm_free(&c);  // no throw from a destructor; errors are harmless
    MPI_Comm_free(&p2p_);
    MPI_Comm_free(&split_);
  }

  int rank() const override { return rank_; }
  int world() const override { return world_; }
  int local_rank() const override { return local_rank_; }
  int local_world() const override { return local_world_; }
  const std::string& name() const override { return log_.name(); }
  int global_rank() const override { return global_rank_; }

  // MPI_Comm_split on a duplicate of its own, so that it never meets a collective in flight on a
  // channel. The group starts with no tracer of its own: it shares this comm's (its own lanes).
  std::unique_ptr<Comm> split(int color, int key, const std::string& name) override {
    ZT_REQUIRE(color >= 0, "split(" << color << ", " << key << ", \"" << name << "\"): the color must be >= 0");
    ZT_REQUIRE(!name.empty() && name != "world", "split: a group needs a name of its own (not \"\" or \"world\")");
    MPI_Comm c = MPI_COMM_NULL;
    ZT_CHECK_MPI(MPI_Comm_split(split_, color, key, &c));
    ZT_CHECK_MPI(MPI_Comm_set_errhandler(c, MPI_ERRORS_RETURN));
    // Fault injection names a world rank (CollLog::take_fault): a group skips its own first
    // collective of the step there (hybrid sharding's collectives are all in groups).
    const CommOptions opts = log_.options();
    auto group = std::make_unique<MpiComm>(opts, c, name);
    group->set_tracer(log_.tracer());
    return group;
  }

  CommHandle send(const void* buf, size_t bytes, int peer) override {
    return p2p(CollOp::send, const_cast<void*>(buf), bytes, peer);  // MPI_Issend only reads it
  }
  CommHandle recv(void* buf, size_t bytes, int peer) override { return p2p(CollOp::recv, buf, bytes, peer); }

  CommHandle all_reduce(float* buf, size_t n) override {
    const int count = mpi_count(n, "all_reduce");
    const uint64_t bytes = model_bytes_all_reduce(n, world_);
    if (log_.take_fault(CollOp::all_reduce)) return {log_.start(CollOp::all_reduce, bytes, true)};
    const uint64_t seq = log_.start(CollOp::all_reduce, bytes);
    if (world_ == 1 || n == 0) return finished(seq);
    const MPI_Comm c = channel(seq);
    if (use_ring(n)) return issue_ring(seq, Ring::all_reduce(buf, n, rank_, world_, c));
    if (use_blocking(n))
      return issue_blocking(seq, [=] { return MPI_Allreduce(MPI_IN_PLACE, buf, count, MPI_FLOAT, MPI_SUM, c); });
    issue(seq, "MPI_Iallreduce", [=](MPI_Request* r) { return MPI_Iallreduce(MPI_IN_PLACE, buf, count, MPI_FLOAT, MPI_SUM, c, r); });
    return {seq};
  }

  CommHandle reduce_scatter(const float* send, float* recv, size_t recv_n) override {
    const int count = mpi_count(recv_n, "reduce_scatter");
    const bool in_place = recv == send + size_t(rank_) * recv_n;
    ZT_REQUIRE(in_place || !overlaps(send, 4 * recv_n * world_, recv, 4 * recv_n),
               "reduce_scatter: send and recv overlap (only recv == send + rank*recv_n is allowed in place)");
    const uint64_t bytes = model_bytes_reduce_scatter(recv_n, world_);
    if (log_.take_fault(CollOp::reduce_scatter)) return {log_.start(CollOp::reduce_scatter, bytes, true)};
    const uint64_t seq = log_.start(CollOp::reduce_scatter, bytes);
    if (world_ == 1 || recv_n == 0) {
      if (!in_place && recv_n) std::memcpy(recv, send, 4 * recv_n);
      return finished(seq);
    }
    const MPI_Comm c = channel(seq);
    if (use_ring(recv_n * size_t(world_)))
      return issue_ring(seq, Ring::reduce_scatter(send, recv, recv_n, rank_, world_, c));
    if (use_blocking(recv_n * size_t(world_))) {
      if (!in_place)
        return issue_blocking(seq, [=] { return MPI_Reduce_scatter_block(send, recv, count, MPI_FLOAT, MPI_SUM, c); });
      float* full = const_cast<float*>(send);  // as below: the result lands at the start, moved to our slot
      return issue_blocking(seq, [=] { return MPI_Reduce_scatter_block(MPI_IN_PLACE, full, count, MPI_FLOAT, MPI_SUM, c); },
                            rank_ != 0 ? Move{recv, full, recv_n} : Move{});
    }
    if (in_place) {
      // MPI's in-place form leaves the result at the start of the full buffer; move it to our
      // shard's slot when the collective completes.
      float* full = const_cast<float*>(send);  // writable: recv points into it
      issue(seq, "MPI_Ireduce_scatter_block",
            [=](MPI_Request* r) { return MPI_Ireduce_scatter_block(MPI_IN_PLACE, full, count, MPI_FLOAT, MPI_SUM, c, r); },
            rank_ != 0 ? Move{recv, full, recv_n} : Move{});
    } else {
      issue(seq, "MPI_Ireduce_scatter_block",
            [=](MPI_Request* r) { return MPI_Ireduce_scatter_block(send, recv, count, MPI_FLOAT, MPI_SUM, c, r); });
    }
    return {seq};
  }

  CommHandle all_gather(const float* send, float* recv, size_t send_n) override {
    const int count = mpi_count(send_n, "all_gather");
    const bool in_place = send == recv + size_t(rank_) * send_n;
    ZT_REQUIRE(in_place || !overlaps(send, 4 * send_n, recv, 4 * send_n * world_),
               "all_gather: send and recv overlap (only send == recv + rank*send_n is allowed in place)");
    const uint64_t bytes = model_bytes_all_gather(send_n, world_);
    if (log_.take_fault(CollOp::all_gather)) return {log_.start(CollOp::all_gather, bytes, true)};
    const uint64_t seq = log_.start(CollOp::all_gather, bytes);
    if (world_ == 1 || send_n == 0) {
      if (!in_place && send_n) std::memcpy(recv, send, 4 * send_n);
      return finished(seq);
    }
    const MPI_Comm c = channel(seq);
    if (use_ring(send_n * size_t(world_))) return issue_ring(seq, Ring::all_gather(send, recv, send_n, rank_, world_, c));
    const void* sendp = in_place ? MPI_IN_PLACE : send;
    if (use_blocking(send_n * size_t(world_)))
      return issue_blocking(seq, [=] { return MPI_Allgather(sendp, count, MPI_FLOAT, recv, count, MPI_FLOAT, c); });
    issue(seq, "MPI_Iallgather",
          [=](MPI_Request* r) { return MPI_Iallgather(sendp, count, MPI_FLOAT, recv, count, MPI_FLOAT, c, r); });
    return {seq};
  }

  CommHandle broadcast(void* buf, size_t bytes, int root) override {
    const int count = mpi_count(bytes, "broadcast");
    ZT_REQUIRE(root >= 0 && root < world_, "broadcast: root " << root << " is not a rank of a world of " << world_);
    const uint64_t seq = log_.start(CollOp::broadcast, model_bytes_broadcast(bytes, world_, root == rank_));
    if (world_ == 1 || bytes == 0) return finished(seq);
    const MPI_Comm c = channel(seq);
    issue(seq, "MPI_Ibcast", [=](MPI_Request* r) { return MPI_Ibcast(buf, count, MPI_BYTE, root, c, r); });
    return {seq};
  }

  bool test(CommHandle h) override {
    progress();
    return !h.valid() || !is_pending(h.seq);
  }

  void wait(CommHandle h) override {
    if (!h.valid() || !is_pending(h.seq)) return;
    if (thread_)  // a collective still queued behind the in-flight limit starts now (mpi_thread.h)
      for (const Pending& p : pending_)
        if (p.seq == h.seq) {
          thread_->promote(p.job);
          break;
        }
    log_.note_wait(h.seq);
    log_.wait_polling([&] { progress(); }, [&] { return !is_pending(h.seq); }, [&] { timeout(h.seq); }, 50);
  }

  size_t all_gather_arrived(CommHandle h) override {
    if (test(h)) return SIZE_MAX;
    for (const Pending& p : pending_)
      if (p.seq == h.seq && p.job) return p.job->arrived.load(std::memory_order_acquire);
    return 0;
  }

  void wait_all_gather_arrived(CommHandle h, size_t n) override {
    if (!h.valid() || !is_pending(h.seq)) return;
    std::shared_ptr<const Job> job;  // held: progress() may retire its Pending while we poll
    for (const Pending& p : pending_)
      if (p.seq == h.seq) {
        if (p.job) thread_->promote(p.job);  // as wait(): start it now if it is still queued
        job = p.job;
        break;
      }
    if (!job) return wait(h);  // no comm thread: no progress to read
    if (job->arrived.load(std::memory_order_acquire) >= n) return;
    log_.note_wait(h.seq);
    log_.wait_polling([&] { progress(); },
                      [&] { return !is_pending(h.seq) || job->arrived.load(std::memory_order_acquire) >= n; },
                      [&] { timeout(h.seq); }, 50);
  }

  void all_reduce_sum(double* vals, int n) override {
    ZT_REQUIRE(n >= 0, "all_reduce_sum: negative count " << n);
    const uint64_t seq = log_.start(CollOp::scalar_all_reduce, model_bytes_all_reduce(uint64_t(n), world_, 8));
    if (world_ == 1 || n == 0) {
      log_.finish(seq);
      return;
    }
    const MPI_Comm c = channel(seq);
    issue(seq, "MPI_Iallreduce", [=](MPI_Request* r) { return MPI_Iallreduce(MPI_IN_PLACE, vals, n, MPI_DOUBLE, MPI_SUM, c, r); });
    wait({seq});
  }

  void barrier() override {
    const uint64_t seq = log_.start(CollOp::barrier, 0);
    if (world_ == 1) {
      log_.finish(seq);
      return;
    }
    const MPI_Comm c = channel(seq);
    issue(seq, "MPI_Ibarrier", [=](MPI_Request* r) { return MPI_Ibarrier(c, r); });
    wait({seq});
  }

  std::vector<uint64_t> all_gather_u64(uint64_t v) override {
    const uint64_t seq = log_.start(CollOp::scalar_all_gather, model_bytes_all_gather(1, world_, 8));
    if (world_ == 1) {
      log_.finish(seq);
      return {v};
    }
    // A member buffer: if the wait times out, MPI may still write into it later.
    gather_u64_[rank_] = v;
    const MPI_Comm c = channel(seq);
    uint64_t* g = gather_u64_.data();
    issue(seq, "MPI_Iallgather",
          [=](MPI_Request* r) { return MPI_Iallgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, g, 1, MPI_UINT64_T, c, r); });
    wait({seq});
    return gather_u64_;
  }

  void begin_step(int64_t step) override { log_.begin_step(step); }
  const CommStepStats& step_stats() const override { return log_.stats(); }
  std::string log_dump(size_t n) const override { return log_.dump(n); }
  std::vector<CollRecord> records() const override { return log_.records(); }
  void set_tracer(Tracer* t) override { log_.set_tracer(t); }

  [[noreturn]] void abort_all(int code) override {
    std::fflush(stdout);
    std::fflush(stderr);
    // Watchdog: MPI_Abort asks the launcher to end every rank, and normally this process is
    // killed at once. When the launcher cannot act (its host unreachable after a network fault),
    // MPI_Abort can block; the rank then ends itself kAbortGraceS later (the report is out).
    std::thread([code, rank = rank_] {
      std::this_thread::sleep_for(std::chrono::duration<double>(kAbortGraceS));
      std::fprintf(stderr, "zerotrain: rank %d: MPI_Abort did not end this process within %g s; exiting\n", rank,
                   kAbortGraceS);
      std::fflush(stderr);
      std::_Exit(code);
    }).detach();
    MPI_Abort(MPI_COMM_WORLD, code);
    std::_Exit(code);  // MPI_Abort does not return; this only satisfies [[noreturn]]
  }

 private:
  struct Move {  // post-completion copy for in-place reduce_scatter
    float* dst = nullptr;
    const float* src = nullptr;
    size_t n = 0;
  };
  struct Pending {
    uint64_t seq = 0;
    MPI_Request req = MPI_REQUEST_NULL;
    Move move{};
    bool timed_out = false;
    std::shared_ptr<Job> job;  // with the comm thread: the thread owns the request
  };

  // Starts collective `seq`: on the comm thread (enqueued, in issue order) or here.
  void issue(uint64_t seq, const char* call, std::function<int(MPI_Request*)> start) {
    issue(seq, call, std::move(start), Move{});
  }
  void issue(uint64_t seq, const char* call, std::function<int(MPI_Request*)> start, Move move) {
    if (thread_) {
      std::shared_ptr<Job> j = job_with(move);
      j->start = std::move(start);
      submit(seq, std::move(j));
      return;
    }
    MPI_Request req = MPI_REQUEST_NULL;
    const int rc = start(&req);
    if (rc != MPI_SUCCESS) detail::mpi_fail(__FILE__, __LINE__, call, rc);
    Pending p;
    p.seq = seq;
    p.req = req;
    p.move = move;
    pending_.push_back(p);
  }

  // A float collective of `total` elements (the full buffer) runs as a ring on the comm thread, or
  // as a blocking MPI call on a worker thread (comm.collectives).
  bool large(size_t total) const { return thread_ && 4 * total / size_t(world_) >= mpi_thread::kRingMinBytes; }
  bool use_ring(size_t total) const { return collectives_ == CommCollectives::ring && large(total); }
  bool use_blocking(size_t total) const { return collectives_ == CommCollectives::mpi_blocking && large(total); }
  CommHandle issue_blocking(uint64_t seq, std::function<int()> call) { return issue_blocking(seq, std::move(call), Move()); }
  CommHandle issue_blocking(uint64_t seq, std::function<int()> call, Move move) {
    std::shared_ptr<Job> j = job_with(move);
    j->blocking = std::move(call);
    submit(seq, std::move(j));
    return {seq};
  }
  // A job for the comm thread that does `move` when its collective completes.
  static std::shared_ptr<Job> job_with(Move move) {
    auto j = std::make_shared<Job>();
    j->move_dst = move.dst;
    j->move_src = move.src;
    j->move_n = move.n;
    return j;
  }
  CommHandle issue_ring(uint64_t seq, Ring ring) {
    auto j = std::make_shared<Job>();
    j->ring = std::make_unique<Ring>(std::move(ring));
    submit(seq, std::move(j));
    return {seq};
  }
  // Hands collective `seq` to the comm thread; pending until the thread marks it done.
  void submit(uint64_t seq, std::shared_ptr<Job> j) {
    Pending p;
    p.seq = seq;
    p.job = j;
    pending_.push_back(std::move(p));
    thread_->submit(std::move(j));
  }

  // With the comm thread: retire what it has completed (no MPI call here).
  void progress_threaded() {
    for (Pending& p : pending_) {
      if (!p.job->done.load(std::memory_order_acquire)) continue;
      if (p.job->err != MPI_SUCCESS) {
        const CollRecord* r = log_.find(p.seq);
        fail_at(__FILE__, __LINE__,
                std::string("MPI collective ") + (r ? coll_op_name(r->op) : "?") + " #" + std::to_string(p.seq) +
                    " failed: " + detail::mpi_error_string(p.job->err));
      }
      if (p.timed_out) --g_stuck_collectives;
      log_.finish(p.seq, p.job->err == MPI_SUCCESS ? log_.since(p.job->t_done) : log_.now());
      p.seq = 0;
    }
    pending_.erase(std::remove_if(pending_.begin(), pending_.end(), [](const Pending& p) { return p.seq == 0; }),
                   pending_.end());
  }

  static int comm_rank(MPI_Comm c) {
    int r = 0;
    ZT_CHECK_MPI(MPI_Comm_rank(c, &r));
    return r;
  }
  static int comm_size(MPI_Comm c) {
    int n = 0;
    ZT_CHECK_MPI(MPI_Comm_size(c, &n));
    return n;
  }

  // Collective #seq's channel, by its order among the collectives (sends and receives, which not
  // every rank of the group issues alike, do not count: see comm.h "Point to point").
  MPI_Comm channel(uint64_t seq) const { return channels_[(seq - p2p_ops_) % channels_.size()]; }

  // A send or receive on the point-to-point communicator, tagged by its order per peer (kP2pTags).
  // A send is synchronous (MPI_Issend): it completes once the recv is posted, so a missing recv
  // times out on the sender instead of the message sitting in MPI's buffers.
  CommHandle p2p(CollOp op, void* buf, size_t bytes, int peer) {
    const int count = mpi_count(bytes, coll_op_name(op));
    ZT_REQUIRE(peer >= 0 && peer < world_ && peer != rank_,
               coll_op_name(op) << ": peer " << peer << " is not another rank of group \"" << name() << "\" ("
                                << world_ << " ranks; this is rank " << rank_ << ")");
    ++p2p_ops_;
    uint64_t& nth = (op == CollOp::send ? sent_ : received_)[size_t(peer)];
    const int tag = int(nth++ % kP2pTags);
    // A send dropped by fault injection still takes its place in the order: the peer's receive of it
    // never matches a later message.
    if (log_.take_fault(op)) return {log_.start_p2p(op, model_bytes_p2p(bytes, op), peer, true)};
    const uint64_t seq = log_.start_p2p(op, model_bytes_p2p(bytes, op), peer);
    const MPI_Comm c = p2p_;
    if (op == CollOp::send)
      issue(seq, "MPI_Issend", [=](MPI_Request* r) { return MPI_Issend(buf, count, MPI_BYTE, peer, tag, c, r); });
    else
      issue(seq, "MPI_Irecv", [=](MPI_Request* r) { return MPI_Irecv(buf, count, MPI_BYTE, peer, tag, c, r); });
    // Posted at once, past comm.inflight: a send waits for its recv, so sends held back behind other
    // sends on both sides of a ring would wait for recvs that never start.
    if (thread_) thread_->promote(pending_.back().job);
    return {seq};
  }

  CommHandle finished(uint64_t seq) {
    log_.finish(seq);
    return {seq};
  }

  bool is_pending(uint64_t seq) const {
    for (const Pending& p : pending_)
      if (p.seq == seq) return true;
    return false;
  }

  // One MPI_Testsome over every pending request: progresses all of them and retires those done.
  void progress() {
    if (pending_.empty()) return;
    if (thread_) return progress_threaded();
    const int n = int(pending_.size());
    reqs_.resize(n);
    idx_.resize(n);
    statuses_.resize(n);
    for (int i = 0; i < n; ++i) reqs_[i] = pending_[i].req;
    int outcount = 0;
    const int rc = MPI_Testsome(n, reqs_.data(), &outcount, idx_.data(), statuses_.data());
    if (rc == MPI_ERR_IN_STATUS) {
      for (int k = 0; k < outcount; ++k) {
        const int err = statuses_[k].MPI_ERROR;
        if (err != MPI_SUCCESS) {
          const CollRecord* r = log_.find(pending_[idx_[k]].seq);
          fail_at(__FILE__, __LINE__,
                  std::string("MPI collective ") + (r ? coll_op_name(r->op) : "?") + " #" +
                      std::to_string(pending_[idx_[k]].seq) + " failed: " + detail::mpi_error_string(err));
        }
      }
    }
    if (rc != MPI_SUCCESS) detail::mpi_fail(__FILE__, __LINE__, "MPI_Testsome(pending collectives)", rc);
    if (outcount == MPI_UNDEFINED || outcount == 0) return;
    for (int k = 0; k < outcount; ++k) {
      Pending& p = pending_[idx_[k]];
      if (p.move.n) std::memmove(p.move.dst, p.move.src, 4 * p.move.n);
      if (p.timed_out) --g_stuck_collectives;
      log_.finish(p.seq);
      p.seq = 0;  // retired
    }
    for (int i = 0; i < n; ++i) pending_[i].req = reqs_[i];
    pending_.erase(std::remove_if(pending_.begin(), pending_.end(), [](const Pending& p) { return p.seq == 0; }),
                   pending_.end());
  }

  [[noreturn]] void timeout(uint64_t seq) {
    log_.mark_timed_out(seq);
    for (Pending& p : pending_)
      if (p.seq == seq && !p.timed_out) {
        p.timed_out = true;
        ++g_stuck_collectives;
      }
    const std::string report = log_.timeout_report(seq);
    std::fprintf(stderr, "%s", report.c_str());
    std::fflush(stderr);
    throw CommTimeout(log_.timeout_headline(seq));
  }

  MPI_Comm comm_;                   // channels_[0]
  std::vector<MPI_Comm> channels_;  // collective #seq runs on channels_[(seq - p2p_ops_) % size]
  MPI_Comm p2p_ = MPI_COMM_NULL;    // sends and receives
  MPI_Comm split_ = MPI_COMM_NULL;  // split()'s MPI_Comm_split
  uint64_t p2p_ops_ = 0;            // sends and receives logged so far
  std::vector<uint64_t> sent_, received_;  // messages to / from each peer so far (their tags)
  int rank_, world_;
  int local_rank_ = 0, local_world_ = 1;
  CollLog log_;
  std::vector<Pending> pending_;
  std::vector<MPI_Request> reqs_;
  std::vector<int> idx_;
  std::vector<MPI_Status> statuses_;
  std::vector<uint64_t> gather_u64_;
  CommCollectives collectives_;  // how the thread runs large float collectives
  int global_rank_;              // in MPI_COMM_WORLD
  std::shared_ptr<CommThread> thread_;  // null: collectives are started and progressed on the caller's thread
};

}  // namespace

std::unique_ptr<Comm> make_mpi_comm(const CommOptions& opts) {
  ZT_REQUIRE(opts.timeout_s > 0, "comm timeout must be > 0 s, got " << opts.timeout_s);
  ZT_REQUIRE(opts.inflight >= 0 && opts.inflight <= kMaxCommInflight && opts.poll_us >= 0 && opts.poll_us <= kMaxCommPollUs,
             "comm: inflight " << opts.inflight << " / poll_us " << opts.poll_us << " out of range (0-"
                               << kMaxCommInflight << " / 0-" << kMaxCommPollUs << ")");
  g_exit_timeout_s = std::max(g_exit_timeout_s, 2 * opts.timeout_s + 5);
  const MPI_Comm world = dup_world(opts.thread);
  return std::make_unique<MpiComm>(opts, world, "world");
}

}  // namespace zt
