// Collective bookkeeping shared by the MPI and NCCL backends: sequence numbers, the collective log
// (a circular buffer of the last kLogRecords records), per-step counters under the byte model of
// comm.h, fault injection, and the timeout diagnostic. Knows nothing about MPI, CUDA or NCCL.
#pragma once
#include <sched.h>
#include <unistd.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "comm/comm.h"
#include "runtime/trace.h"

namespace zt {

// Byte model of comm.h (per rank, integer arithmetic, rounded down).
uint64_t model_bytes_all_reduce(uint64_t n, int world, uint64_t elem_bytes = 4);
uint64_t model_bytes_reduce_scatter(uint64_t recv_n, int world, uint64_t elem_bytes = 4);
uint64_t model_bytes_all_gather(uint64_t send_n, int world, uint64_t elem_bytes = 4);
uint64_t model_bytes_broadcast(uint64_t bytes, int world, bool is_root);
uint64_t model_bytes_p2p(uint64_t bytes, CollOp op);  // send: bytes, recv: 0

bool coll_op_is_control(CollOp op);

class CollLog {
 public:
  static constexpr size_t kLogRecords = 256;

  // `name`: the group's ("world" or split's); global_ranks[r]: the world rank of group rank r
  // (empty: the group is the world), for diagnostics.
  CollLog(int rank, int world, const CommOptions& opts, std::string name = "world", std::vector<int> global_ranks = {});

  double now() const;  // seconds since creation
  double since(std::chrono::steady_clock::time_point tp) const;  // tp in seconds since creation

  // run.trace: every finished collective becomes a comm event, every wait a wait event (null: off).
  void set_tracer(Tracer* t) {
    tracer_ = t;
    lanes_ = t ? t->lane_group(name_) : 0;
  }
  Tracer* tracer() const { return tracer_; }

  // Fault injection: true exactly once per comm (the world and each group), for its first
  // model-state collective, or send (a pipeline stage that never sends), of fault_skip_step on world
  // rank fault_skip_rank. Call before start().
  bool take_fault(CollOp op);

  // New record (pending, or skipped when `skipped`), counted in the step stats unless skipped.
  // Returns its sequence number (1, 2, ...).
  uint64_t start(CollOp op, uint64_t bytes, bool skipped = false);
  // send / recv with rank `peer` of the group (skipped: a send dropped by fault injection).
  uint64_t start_p2p(CollOp op, uint64_t bytes, int peer, bool skipped = false);
  void finish(uint64_t seq);          // done at now(); no-op if the record left the log
  void finish(uint64_t seq, double t_end);  // done at t_end (seconds since creation), e.g. measured
                                            // by a communication thread
  void mark_timed_out(uint64_t seq);
  void add_wait(double s) { stats_.wait_s += s; }

  // The timed wait both backends use: calls poll() (progress the backend) until done(); past
  // timeout_s calls on_timeout(), which reports and throws. A short spin keeps latency low for
  // small messages; then it yields the core (ranks are often oversubscribed on small machines)
  // while still polling every sleep_us.
  template <class Poll, class Done, class OnTimeout>
  void wait_polling(Poll poll, Done done, OnTimeout on_timeout, unsigned sleep_us) {
    const double t0 = now();
    for (int spins = 0;; ++spins) {
      poll();
      if (done()) break;
      if (spins == 0) ++stats_.host_waits;
      const double waited = now() - t0;
      if (waited > opts_.timeout_s) {
        add_wait(waited);
        on_timeout();
      }
      if (spins < 64) sched_yield();
      else usleep(sleep_us);
    }
    const double t1 = now();
    add_wait(t1 - t0);
    clear_wait_note();
    if (tracer_) trace_wait(t0, t1);
  }

  // For the SIGTERM note: the collective the caller is about to wait for (see install_term_note).
  // Cheap (one snprintf per wait); cleared when wait_polling returns.
  void note_wait(uint64_t seq);
  static void clear_wait_note();

  void begin_step(int64_t step);
  void trace_wait(double t0, double t1) const;
  int64_t step() const { return step_; }
  const CommStepStats& stats() const { return stats_; }

  const CollRecord* find(uint64_t seq) const;  // nullptr once it left the log
  std::vector<CollRecord> records() const;     // oldest first
  std::string dump(size_t n) const;            // last n records, one line each

  // Timeout diagnostic: the one-line headline (CommTimeout::what(); no rank in it: main prefixes
  // "error: rank R:") and the full text printed to stderr: "rank R: " + headline + "; last
  // collectives on this rank:" + the log dump.
  std::string timeout_headline(uint64_t seq) const;
  std::string timeout_report(uint64_t seq, size_t dump_n = 16) const;

  // When a launcher ends the job (mpirun/orted send SIGTERM, then SIGKILL a second later, e.g.
  // after losing a host), print one line naming the collective this rank was waiting for, then
  // die of the signal as before. Installed once per process, for worlds > 1, only over SIG_DFL.
  static void install_term_note(int rank);

  int rank() const { return rank_; }
  int world() const { return world_; }
  const CommOptions& options() const { return opts_; }
  const std::string& name() const { return name_; }
  int global_rank(int group_rank) const {
    return global_ranks_.empty() ? group_rank : global_ranks_[size_t(group_rank)];
  }

 private:
  uint64_t start_record(CollOp op, uint64_t bytes, int peer, bool skipped);
  std::string what(const CollRecord& r) const;  // "collective all_reduce #3", "send #4 to rank 1", + the group
  int rank_, world_;
  CommOptions opts_;
  std::string name_;
  std::vector<int> global_ranks_;
  int lanes_ = 0;  // the tracer's lane group of this comm
  std::chrono::steady_clock::time_point t0_;
  std::vector<CollRecord> records_;
  uint64_t next_seq_ = 1;
  int64_t step_ = -1;
  bool fault_fired_ = false;
  CommStepStats stats_;
  Tracer* tracer_ = nullptr;
  double t0_us_ = 0;       // t0_ in Tracer::now_us() units
  uint64_t wait_seq_ = 0;  // note_wait's collective
};

}  // namespace zt
