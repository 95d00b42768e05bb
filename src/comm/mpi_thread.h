// The communication thread of the MPI backend (comm/mpi_comm.cpp; docs/design.md §3.4): the CPU
// analogue of a communication stream. Callers enqueue collectives; one thread per Comm starts them
// in issue order (every rank starts them in the same order) and polls MPI_Testsome while any is in
// flight, because Open MPI advances a non-blocking collective over TCP only inside MPI calls.
// Completion is an atomic flag the caller reads without calling MPI. Included by mpi_comm.cpp only.
// Large float collectives run as ring schedules of point-to-point rounds (ring.h), which the
// thread advances segment by segment, or (comm.collectives "mpi_blocking") as MPI's blocking
// collectives, each on a worker thread of its own that the thread starts and joins; the rest are
// MPI's own non-blocking collectives.
//
// Like a stream, it does not start everything at once: at most CommOptions::inflight collectives
// (comm.inflight, default 2) started in issue order are in flight, the next starting as one completes. Started
// together, collectives share the link and the one needed first finishes last (the parameter
// all-gathers of stages 1-2 are all issued after the optimizer step, forward needs them one by
// one). A collective that someone waits for starts at once, ahead of the queue (promote): the
// small ones forward blocks on (the lookup exchange, scalar reductions) do not queue behind bulk
// transfers, and on the wire cross behind at most one segment (ring.h) of each bulk ring in flight.
// No deadlock: each collective has a communicator of its own (mpi_comm.cpp), and on every rank the
// earliest incomplete collective is started (all before it in the queue are done). Sends and
// receives (Comm::send / recv) are promoted as they are issued: posted at once, outside the limit
// (a synchronous send waits for its recv; held back, a ring's sends would wait for receives queued
// behind them).
#pragma once
#include "comm/mpi_check.h"  // first: includes <mpi.h> without the C++ bindings
#include "comm/ring.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

namespace zt::mpi_thread {

// Below this many bytes per rank a collective is latency-bound: MPI's algorithms (fewer rounds) win.
// Measured: 3 ranks on 2 cores (shared memory, oversubscribed), stage 3 with 66 KiB per rank per
// unit: 1480 tokens/s with the ring from 64 KiB, 2110 with it from 256 KiB (MPI's: 2050).
constexpr size_t kRingMinBytes = 256 * 1024;

// One collective handed to the comm thread. `start` issues the MPI_I* call (returns an MPI error
// code); the thread then owns the request until `done`.
struct Job {
  std::function<int(MPI_Request*)> start;  // one MPI_I* collective, or:
  std::unique_ptr<Ring> ring;              // a ring collective, two requests per round (ring.h), or:
  std::function<int()> blocking;           // one blocking MPI collective, run on `worker`
  std::thread worker;
  std::atomic<bool> worker_done{false};
  int worker_rc = MPI_SUCCESS;             // written before worker_done is set
  MPI_Request req[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};
  float* move_dst = nullptr;  // in-place reduce_scatter: copy the result to its slot when done
  const float* move_src = nullptr;
  size_t move_n = 0;
  std::atomic<bool> urgent{false};  // someone waits for it: start it now, past the in-flight limit
  bool queued_start = false;        // started in issue order (counts against the limit)
  std::atomic<bool> done{false};
  // A ring all-gather: its output elements final so far, in arrival order (Ring::gather_arrived);
  // stored with release after the segment's receive completed, so a reader that loads it with
  // acquire sees the data.
  std::atomic<size_t> arrived{0};
  std::chrono::steady_clock::time_point t_done;  // written before done is set
  int err = MPI_SUCCESS;  // written before done is set
  // Joined by the comm thread when the worker returns; detached if the job goes first (the worker
  // itself dropping the last reference, or a thread left polling at exit).
  ~Job() {
    if (worker.joinable()) worker.detach();
  }
};

// The comm thread of one MpiComm: starts jobs in FIFO order and progresses every started one.
class CommThread {
 public:
  static std::shared_ptr<CommThread> launch(unsigned poll_us, unsigned max_inflight) {
    auto t = std::shared_ptr<CommThread>(new CommThread(poll_us, max_inflight));
    t->thread_ = std::thread([t] { t->run(); });  // the thread keeps its state alive (detach on a stuck exit)
    return t;
  }
  void submit(std::shared_ptr<Job> j) {
    {
      std::lock_guard<std::mutex> g(mu_);
      queue_.push_back(std::move(j));
    }
    cv_.notify_one();
  }
  // The caller waits for j: start it now if it has not started (a no-op once it has).
  void promote(const std::shared_ptr<Job>& j) {
    if (j->urgent.exchange(true)) return;
    std::lock_guard<std::mutex> g(mu_);  // the thread looks at the queue under the lock
    cv_.notify_one();
  }
  // Ends the thread once nothing is in flight (joins); with collectives still in flight (a timed-out
  // one), leaves it polling them (detached): the process is about to abort the job.
  void shutdown() {
    std::unique_lock<std::mutex> g(mu_);
    if (!thread_.joinable()) return;
    stop_ = true;
    cv_.notify_one();
    if (busy_) {
      g.unlock();
      thread_.detach();
      return;
    }
    g.unlock();
    thread_.join();
  }

 private:
  CommThread(unsigned poll_us, unsigned max_inflight) : poll_us_(poll_us), max_inflight_(max_inflight) {}
  void run() {
    std::vector<std::shared_ptr<Job>> active;
    std::vector<MPI_Request> reqs;
    std::vector<std::pair<size_t, int>> owner;  // reqs[i] is active[owner[i].first]->req[owner[i].second]
    std::vector<int> idx;
    std::vector<MPI_Status> st;
    for (;;) {
      {
        std::unique_lock<std::mutex> g(mu_);
        busy_ = !active.empty() || !queue_.empty();
        if (active.empty()) {
          cv_.wait(g, [&] { return stop_ || !queue_.empty(); });
          if (queue_.empty()) return;  // stop_ and nothing to do
          busy_ = true;
        }
        // In issue order while under the limit; past it, only those someone waits for.
        for (auto it = queue_.begin(); it != queue_.end();) {
          const bool urgent = (*it)->urgent.load(std::memory_order_acquire);
          if (!urgent && max_inflight_ && in_order_ >= max_inflight_) {
            ++it;
            continue;
          }
          std::shared_ptr<Job> j = std::move(*it);
          it = queue_.erase(it);
          j->queued_start = !urgent;
          in_order_ += !urgent;
          int rc = MPI_SUCCESS;
          if (j->blocking) {
            // The worker holds the job: a job given up on (a timeout, the process about to abort)
            // outlives its caller's handle until the call returns.
            j->worker = std::thread([j] {
              j->worker_rc = j->blocking();
              j->worker_done.store(true, std::memory_order_release);
            });
          } else {
            rc = j->ring ? j->ring->post(j->req) : j->start(&j->req[0]);
          }
          if (rc != MPI_SUCCESS) {
            j->err = rc;
            finish(*j);
          } else {
            active.push_back(std::move(j));
          }
        }
      }
      if (active.empty()) continue;
      bool blocking_done = false;  // a worker has returned: its job is done (no request to test)
      for (auto& jp : active) {
        Job& j = *jp;
        if (!j.blocking || !j.worker_done.load(std::memory_order_acquire)) continue;
        j.worker.join();
        j.err = j.worker_rc;
        if (j.err == MPI_SUCCESS && j.move_n) std::memmove(j.move_dst, j.move_src, 4 * j.move_n);
        j.t_done = std::chrono::steady_clock::now();
        finish(j);
        blocking_done = true;
      }
      if (blocking_done) {
        active.erase(std::remove_if(active.begin(), active.end(), [](const std::shared_ptr<Job>& j) {
                       return j->done.load(std::memory_order_relaxed);
                     }),
                     active.end());
        continue;
      }
      reqs.clear();
      owner.clear();
      for (size_t a = 0; a < active.size(); ++a)
        for (int k = 0; k < 2; ++k)
          if (active[a]->req[k] != MPI_REQUEST_NULL) {
            reqs.push_back(active[a]->req[k]);
            owner.emplace_back(a, k);
          }
      const int n = int(reqs.size());
      idx.resize(size_t(n));
      st.resize(size_t(n));
      int out = 0;
      const int rc = MPI_Testsome(n, reqs.data(), &out, idx.data(), st.data());
      if (rc != MPI_SUCCESS && rc != MPI_ERR_IN_STATUS) {
        for (auto& j : active) {  // a broken library state: fail everything in flight (a worker ends on its own)
          if (j->blocking) continue;
          j->err = rc;
          finish(*j);
        }
        active.erase(std::remove_if(active.begin(), active.end(), [](const std::shared_ptr<Job>& j) {
                       return j->done.load(std::memory_order_relaxed);
                     }),
                     active.end());
        continue;
      }
      if (out != MPI_UNDEFINED && out > 0) {
        for (int k = 0; k < out; ++k) {
          Job& j = *active[owner[size_t(idx[k])].first];
          if (rc == MPI_ERR_IN_STATUS && st[k].MPI_ERROR != MPI_SUCCESS && j.err == MPI_SUCCESS) j.err = st[k].MPI_ERROR;
          j.req[owner[size_t(idx[k])].second] = MPI_REQUEST_NULL;
        }
        for (auto& jp : active) {  // a job whose requests have all completed: next round, or done
          Job& j = *jp;
          if (j.blocking) continue;  // no requests: done when its worker returns (above)
          if (j.req[0] != MPI_REQUEST_NULL || j.req[1] != MPI_REQUEST_NULL) continue;
          if (j.err == MPI_SUCCESS && j.ring && !j.ring->complete_segment()) {
            j.arrived.store(j.ring->gather_arrived(), std::memory_order_release);
            const int prc = j.ring->post(j.req);
            if (prc == MPI_SUCCESS) continue;
            j.err = prc;
          }
          if (j.err == MPI_SUCCESS && j.move_n) std::memmove(j.move_dst, j.move_src, 4 * j.move_n);
          j.t_done = std::chrono::steady_clock::now();
          finish(j);
        }
        active.erase(std::remove_if(active.begin(), active.end(), [](const std::shared_ptr<Job>& j) {
                       return j->done.load(std::memory_order_relaxed);
                     }),
                     active.end());
        continue;  // something completed: look again at once
      }
      if (poll_us_) usleep(poll_us_);
      else sched_yield();
    }
  }

  void finish(Job& j) {  // on the thread only
    if (j.queued_start) --in_order_;
    j.done.store(true, std::memory_order_release);
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Job>> queue_;
  bool stop_ = false;
  bool busy_ = false;  // collectives queued or in flight
  unsigned poll_us_;
  unsigned max_inflight_;   // CommOptions::inflight
  unsigned in_order_ = 0;   // started in issue order and not done (thread only)
  std::thread thread_;
};

}  // namespace zt::mpi_thread
