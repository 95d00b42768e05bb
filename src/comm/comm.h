// Communication layer (docs/design.md §2: "Communication knows no ZeRO"). One interface, two implementations:
// MPI for host buffers (CPU backend, non-blocking collectives) and NCCL for device buffers (its own
// stream, completion through events). Every collective is non-blocking and returns a handle; the
// caller overlaps work and then wait()s. Blocking helpers are built on the same path so that a hang
// anywhere becomes a timeout error.
//
// Bookkeeping: every collective gets a sequence number and a record in a per-rank collective log
// (op, bytes, sequence, start/end time, state), and bytes sent are counted per step under the ring
// model stated below, so tests can compare them with theory exactly.
//
// Byte model (per rank, what a ring algorithm sends; n = element count, N = world, 4-byte floats):
//   all_reduce(n)              2 * (N-1)/N * 4n     (reduce-scatter + all-gather phases)
//   reduce_scatter(recv_n)     (N-1) * 4 recv_n      (the full buffer is N * recv_n)
//   all_gather(send_n)         (N-1) * 4 send_n
//   broadcast(bytes)           bytes on the root, 0 elsewhere
//   send(bytes)                bytes (the sender counts the message)   recv(bytes)   0
// Model-state traffic (gradients, parameters) is counted in `bytes`; small control messages
// (scalar all-reduces for loss and gradient norm, barriers) are counted apart in `control_bytes`.
// Integer arithmetic, rounded down: all_reduce is (2*(N-1)*4n)/N, exact whenever N divides n
// (ZeRO pads units so that it always does). Control traffic under the same model:
//   all_reduce_sum(n doubles)  (2*(N-1)*8n)/N     all_gather_u64  (N-1)*8     barrier  0
// With N == 1 every count is 0 (a world of one sends nothing, broadcast root included).
// A collective skipped by fault injection sends nothing and is not counted (its record still
// shows the bytes it would have sent).
//
// Buffers: reduce_scatter/all_gather buffers must not overlap, except NCCL's in-place forms:
//   reduce_scatter: recv == send + rank*recv_n   (send's other parts are undefined afterwards)
//   all_gather:     send == recv + rank*send_n
// Element counts above INT_MAX (MPI's count type) are rejected with an error.
//
// Timeouts: a CommTimeout leaves the collective pending (its record is marked timed_out); the
// only sensible continuation is abort_all(). If a process exits after a timeout without calling
// abort_all, the MPI backend aborts the job at exit instead of finalising (finalising would wait
// for the stuck ranks forever).
//
// Collective matching: MPI and NCCL match collectives by their order on a communicator. The MPI
// backend runs collective #seq on one of 256 duplicate communicators (seq % 256), so a collective
// only ever meets the same sequence number on the other ranks: when a rank skips #s, the others
// wait in #s and the skipping rank waits in its next one, and every rank's timeout fires (instead
// of the skipper's next collective completing with the others' #s, with wrong data or, for
// different sizes, MPI_ERR_TRUNCATE and heap corruption inside Open MPI's libnbc). NCCL has a
// single communicator (they are expensive): there, a skip shifts the matching by one.
//
// Groups (docs/design.md §3.4 "Groups and point-to-point"): make_mpi_comm gives the world, named
// "world"; split(color, key, name) gives a sub-communicator of the ranks that passed the same color,
// ordered by key (ties by parent rank). It is collective over the parent: every rank of the parent
// must call split, the same splits in the same order (MPI_Comm_split / ncclCommSplit match them by
// order). A group is a Comm of its own: rank() and world() within the group, its own sequence
// numbers, collective log, duplicate-communicator pool, trace lanes ("comm <name>") and step stats,
// the parent's options (timeout etc.; fault injection by world rank) and its name in every diagnostic;
// global_rank() is the rank in the world, for messages. The caller of split owns the group.
//
// Point to point: send/recv move bytes (host buffers on MPI, device buffers on NCCL and the
// host-staged comm) to/from a rank of the group, non-blocking like the collectives (CommHandle,
// test/wait, the comm thread, the timeout). The n-th send from A to B matches the n-th recv on B
// from A (sizes must agree), whatever the order in which other messages are issued or waited for.
// A send completes only when its recv has been posted (MPI_Issend; NCCL's ncclSend likewise), so a
// missing recv is a timeout on the sender naming the op, the peer and the group, as a skipped
// collective is. Sends and receives are logged (CollOp send / recv, with the peer) and counted with
// the model-state traffic (bytes, collectives); they take sequence numbers of the log but do not
// shift the collectives' matching (each backend matches collectives by their own order).
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "runtime/error.h"

namespace zt {

class Tracer;  // runtime/trace.h

// scalar_all_reduce / scalar_all_gather / barrier are control traffic (all_reduce_sum,
// all_gather_u64, barrier); the first four are model-state traffic.
// send / recv: point to point (CollRecord::peer).
enum class CollOp : uint8_t { all_reduce, reduce_scatter, all_gather, broadcast, barrier, scalar_all_reduce,
                              scalar_all_gather, send, recv };
const char* coll_op_name(CollOp op);

enum class CollState : uint8_t { pending, done, skipped };

struct CollRecord {
  uint64_t seq = 0;
  CollOp op = CollOp::barrier;
  size_t bytes = 0;        // under the byte model above
  int64_t step = -1;       // training step it belongs to (begin_step), -1 before the first
  double t_start = 0;      // seconds since the Comm was created
  double t_end = -1;       // -1 while pending
  CollState state = CollState::pending;
  bool timed_out = false;  // a wait() on it gave up (CommTimeout)
  int peer = -1;           // send / recv: the other rank (in the group), else -1
};

// Handle to one in-flight collective. Default-constructed = nothing to wait for.
struct CommHandle {
  uint64_t seq = 0;
  bool valid() const { return seq != 0; }
};

// comm.collectives (docs/multihost.md has the measurements behind the default):
//   ring          ring schedules of point-to-point rounds advanced by the comm thread (ring.h)
//   mpi           Open MPI's non-blocking collectives (libnbc) progressed by the comm thread
//   mpi_blocking  Open MPI's blocking collectives (coll/tuned), each on a thread of its own
enum class CommCollectives { ring, mpi, mpi_blocking };
const char* comm_collectives_name(CommCollectives c);
// "ring" | "mpi" | "mpi_blocking"; anything else throws zt::Error naming `what` (the plan key or
// the variable) and the choices.
CommCollectives parse_comm_collectives(const std::string& what, const std::string& value);

struct CommOptions {
  double timeout_s = 300;  // a wait longer than this is a hang: print the collective log, throw CommTimeout
  // Fault injection for tests: at training step `fault_skip_step`, rank `fault_skip_rank` silently
  // skips its first model-state collective (all_reduce, reduce_scatter or all_gather) or send of that
  // step (-1 = off): recorded as skipped, data untouched, the handle is already complete. Once per Comm.
  int fault_skip_rank = -1;
  int64_t fault_skip_step = -1;
  // The MPI backend's communication thread (docs/design.md §3.4); the defaults are the plan's
  // (comm.thread, comm.collectives, comm.inflight, comm.poll_us in plans/base.json).
  bool thread = true;  // a thread starts and progresses collectives; false: only inside test()/wait()
  // How that thread runs float collectives of at least mpi_thread::kRingMinBytes per rank.
  CommCollectives collectives = CommCollectives::ring;
  int inflight = 2;    // collectives started in issue order in flight at once, 0 to kMaxCommInflight (0 = no limit)
  int poll_us = 50;    // microseconds between polls while any is in flight, 0 to kMaxCommPollUs (0 = yield)
};
constexpr int kMaxCommInflight = 1024;
constexpr int kMaxCommPollUs = 100000;

// One ZT_COMM_* variable that replaced a field of CommOptions.
struct CommEnvOverride {
  std::string variable;  // "ZT_COMM_INFLIGHT"
  std::string value;     // as set: "4"
  std::string field;     // "inflight"
};

// The environment's overrides of the communication settings: ZT_COMM_THREAD (0 or 1),
// ZT_COMM_COLLECTIVES (ring, mpi or mpi_blocking), ZT_COMM_INFLIGHT (0 to kMaxCommInflight) and ZT_COMM_POLL_US (0 to kMaxCommPollUs),
// each replacing its field of `opts` when set and not empty. Anything else is refused before any
// field changes (zt::Error naming the variable). Returns the overrides applied, in that order.
std::vector<CommEnvOverride> apply_comm_env(CommOptions& opts);

struct CommStepStats {
  uint64_t bytes = 0;          // model-state bytes this rank sent in the step (byte model)
  uint64_t control_bytes = 0;  // scalar reductions and barriers
  uint64_t collectives = 0;          // model-state collectives launched (skipped ones excluded)
  uint64_t control_collectives = 0;  // all_reduce_sum, barrier, all_gather_u64
  double wait_s = 0;           // time spent blocked in wait() (blocking helpers included)
  uint64_t host_waits = 0;     // wait() calls that found their collective still in flight (the host blocked)
};

// Position of element `i` of an all_gather's output (world chunks of chunk_n) in the arrival order
// of Comm::all_gather_arrived at `rank`: it is final once that many elements have arrived plus one;
// the rank's own chunk is final from the start (returns -1).
inline long long gather_arrival_position(int rank, int world, size_t chunk_n, size_t i) {
  const int c = int(i / chunk_n);
  if (c == rank) return -1;
  const int round = ((rank - 1 - c) % world + world) % world;  // the ring's gather round that receives c
  return (long long)(size_t(round) * chunk_n + (i - size_t(c) * chunk_n));
}

class Comm {
 public:
  virtual ~Comm() = default;
  virtual int rank() const = 0;
  virtual int world() const = 0;
  virtual int local_rank() const = 0;   // rank among the processes on this host
  virtual int local_world() const = 0;
  virtual const std::string& name() const = 0;  // "world", or the name given to split
  virtual int global_rank() const = 0;          // this process's rank in the world (for messages)

  // A sub-communicator of the ranks with the same color (>= 0), ordered by key: see "Groups" above.
  // Collective over this comm (blocking, no timeout): every rank calls it, in the same order.
  virtual std::unique_ptr<Comm> split(int color, int key, const std::string& name) = 0;

  // Point to point (see above): `bytes` bytes to / from rank `peer` of this group (not this rank).
  virtual CommHandle send(const void* buf, size_t bytes, int peer) = 0;
  virtual CommHandle recv(void* buf, size_t bytes, int peer) = 0;

  // Sums of floats. Host pointers for MPI, device pointers for NCCL and the host-staged comm.
  virtual CommHandle all_reduce(float* buf, size_t n) = 0;                            // in place
  virtual CommHandle reduce_scatter(const float* send, float* recv, size_t recv_n) = 0;  // send: N*recv_n
  virtual CommHandle all_gather(const float* send, float* recv, size_t send_n) = 0;      // recv: N*send_n
  virtual CommHandle broadcast(void* buf, size_t bytes, int root) = 0;  // host bytes on every backend

  // Bytes per element of the device buffers the collectives above take (2: bf16, 4: fp32), where
  // the element counts are of that type; 0: host float buffers only (MPI).
  virtual int device_elem_bytes() const { return 0; }

  // Completes the collective; throws CommTimeout (after printing the collective log) past timeout_s.
  virtual void wait(CommHandle h) = 0;
  // Progresses outstanding collectives (MPI moves non-blocking collectives only inside MPI calls);
  // returns true when h has completed (h invalid: just progresses and returns true).
  // Completion times in the records are when the collective completed: measured by the MPI
  // communication thread where there is one, else when test()/wait() observed it.
  virtual bool test(CommHandle h) = 0;
  // The compute stream reads h's result next (a gathered unit, a reduced bucket): order it after the
  // collective. NCCL makes the compute stream wait on the collective's event and returns at once, so
  // the host keeps enqueuing work; the collective stays in flight, and the caller must still wait()
  // for it before the host next blocks on the compute stream (a d2h, a synchronize): hang detection
  // lives in wait(), and a host blocked on a stream that waits for a hung collective has none.
  // Backends whose collectives the host completes (MPI, host-staged): wait(h).
  virtual void order_compute_after(CommHandle h) { wait(h); }
  // Where an all_gather's output becomes final piece by piece (the ring, comm/ring.h), a reader may
  // start on the pieces that have arrived (the LM head over the embedding's rows, docs/design.md
  // §3.4). Arrival order: the chunks of ranks r-1, r-2, ..., r+1 (mod world), each front to back
  // (gather_arrival_position); this rank's own chunk is final from the start. Elements of h's output
  // final in that order, at least: here every backend may say 0 until h completes (SIZE_MAX after).
  virtual size_t all_gather_arrived(CommHandle h) { return test(h) ? SIZE_MAX : 0; }
  // Blocks until all_gather_arrived(h) >= n, or h completes (waited as wait() is: counted, timed out).
  virtual void wait_all_gather_arrived(CommHandle h, size_t n) {
    (void)n;
    wait(h);
  }
  void wait_all(std::vector<CommHandle>& hs) {
    for (CommHandle& h : hs) wait(h);
    hs.clear();
  }

  // Blocking helpers (control traffic): sum of doubles on host, barrier, bytes from every rank.
  virtual void all_reduce_sum(double* vals, int n) = 0;
  virtual void barrier() = 0;
  virtual std::vector<uint64_t> all_gather_u64(uint64_t v) = 0;

  // Step bookkeeping: begin_step resets the per-step counters; step_stats reads them.
  virtual void begin_step(int64_t step) = 0;
  virtual const CommStepStats& step_stats() const = 0;
  // The last `n` records of the collective log, one per line (op, bytes, sequence, step, state, times).
  virtual std::string log_dump(size_t n = 16) const = 0;
  // Every record still in the log (oldest first), for tests.
  virtual std::vector<CollRecord> records() const = 0;
  // run.trace: each collective, when it completes, becomes a comm event (start to completion, with
  // its sequence number and bytes); each wait() a wait event. nullptr (the default) = off. Calls
  // come from the caller's thread only.
  virtual void set_tracer(Tracer* t) = 0;

  // Ends every rank (after a fatal error on this one). Never returns.
  [[noreturn]] virtual void abort_all(int code) = 0;
};

// One verdict for all ranks, so that a failure prints one line rather than one per rank: every
// rank passes its failure ("" = fine); the lowest failing rank throws its own message, the others
// "rank R <what>", both as AgreedError (runtime/error.h): only the first is printed, and every rank
// exits through MPI_Finalize, with no MPI_Abort. Returns when no rank failed.
void agree_or_throw(Comm& comm, const std::string& failure, const std::string& what);

// Thrown when a collective did not complete within timeout_s. what() names rank, op and sequence.
struct CommTimeout : Error {
  using Error::Error;
};

// MPI for host buffers. Initialises MPI (MPI_THREAD_MULTIPLE for the communication thread of
// mpi_comm.cpp; MPI_THREAD_FUNNELED with opts.thread false) if nobody has; finalises at exit
// (atexit) only if it initialised MPI, and only after every rank has reached the exit (a barrier
// with a timeout of 2*timeout_s + 5 s that aborts the job instead: Open MPI 4.1's mpirun can hang
// when one rank sits in MPI_Finalize while another calls MPI_Abort). May be called more than once
// per process (each Comm has its own communicator). Works without mpirun as a world of one.
// Link: MPI's C API only (the C++ bindings are skipped), e.g. CMake MPI::MPI_CXX or MPI::MPI_C.
std::unique_ptr<Comm> make_mpi_comm(const CommOptions& opts);

}  // namespace zt
