// NCCL backend of Comm: see nccl_comm.h. Host code only (no kernels): NCCL launches its own.
#include <cuda_runtime.h>
#include <nccl.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <vector>

#include "comm/coll_log.h"
#include "comm/comm.h"
#include "comm/nccl_comm.h"
#include "runtime/cuda_check.h"


#define ZT_CHECK_NCCL(call)                                                                             \
  do {                                                                                                  \
    const ncclResult_t zt_nccl_rc_ = (call);                                                            \
    if (zt_nccl_rc_ != ncclSuccess)                                                                     \
      ::zt::fail_at(__FILE__, __LINE__,                                                                 \
                    std::string("NCCL call failed: ") + #call + ": " + ncclGetErrorString(zt_nccl_rc_) + \
                        " (NCCL_DEBUG=WARN tells more)");                                              \
  } while (0)

namespace zt {
namespace {

const char* elem(const void* p) { return static_cast<const char*>(p); }

bool overlaps(const void* a, size_t a_bytes, const void* b, size_t b_bytes) {
  const char* pa = static_cast<const char*>(a);
  const char* pb = static_cast<const char*>(b);
  return a_bytes && b_bytes && pa < pb + b_bytes && pb < pa + a_bytes;
}

// The world rank of each rank of the group `boot` (for diagnostics); collective over it.
std::vector<int> world_ranks(Comm& boot) {
  std::vector<int> out;
  for (uint64_t g : boot.all_gather_u64(uint64_t(boot.global_rank()))) out.push_back(int(g));
  return out;
}

class NcclComm final : public Comm {
 public:
  NcclComm(const CommOptions& opts, Comm& boot, cudaStream_t compute_stream, bool bf16)
      : boot_(boot), rank_(boot.rank()), world_(boot.world()), log_(boot.rank(), boot.world(), opts),
        compute_stream_(compute_stream), type_(bf16 ? ncclBfloat16 : ncclFloat), es_(bf16 ? 2 : 4) {
    int ndev = 0;
    ZT_CHECK_CUDA(cudaGetDeviceCount(&ndev));
    ZT_REQUIRE(ndev > 0, "no CUDA device visible; NCCL needs one GPU per rank");
    ZT_REQUIRE(boot.local_world() <= ndev,
               boot.local_world() << " ranks on this host but only " << ndev
                       << " GPU(s) visible; NCCL needs one GPU per rank (start fewer ranks per host)");
    device_ = boot.local_rank() % ndev;
    ZT_CHECK_CUDA(cudaSetDevice(device_));

    ncclUniqueId id{};
    if (rank_ == 0) ZT_CHECK_NCCL(ncclGetUniqueId(&id));
    boot_.wait(boot_.broadcast(&id, sizeof id, 0));
    ZT_CHECK_NCCL(ncclCommInitRank(&comm_, world_, id, rank_));
    ZT_CHECK_CUDA(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    ZT_CHECK_CUDA(cudaEventCreateWithFlags(&input_ready_, cudaEventDisableTiming));
  }

  // A group (split): `comm` split from the parent's by ncclCommSplit, `boot` the parent's bootstrap
  // split alike (owned: the group's control traffic and broadcasts).
  NcclComm(const CommOptions& opts, std::unique_ptr<Comm> boot, ncclComm_t comm, int device, cudaStream_t compute_stream,
           ncclDataType_t type, size_t es)
      : boot_owned_(std::move(boot)), boot_(*boot_owned_), rank_(boot_.rank()), world_(boot_.world()),
        device_(device), log_(rank_, world_, opts, boot_.name(), world_ranks(boot_)), comm_(comm),
        compute_stream_(compute_stream), type_(type), es_(es) {
    ZT_CHECK_CUDA(cudaSetDevice(device_));
    ZT_CHECK_CUDA(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    ZT_CHECK_CUDA(cudaEventCreateWithFlags(&input_ready_, cudaEventDisableTiming));
  }

  ~NcclComm() override {
    // No throw from here: report and go on.
    cudaSetDevice(device_);
    if (comm_ && !aborted_) {
      if (!pending_.empty()) {
        std::fprintf(stderr, "zerotrain: rank %d: NCCL comm destroyed with %zu collective(s) pending; aborting it\n",
                     rank_, pending_.size());
        ncclCommAbort(comm_);
      } else {
        cudaStreamSynchronize(stream_);
        if (ncclCommFinalize(comm_) == ncclSuccess) ncclCommDestroy(comm_);
        else ncclCommAbort(comm_);
      }
    }
    for (Pending& p : pending_) cudaEventDestroy(p.done);
    for (cudaEvent_t e : free_events_) cudaEventDestroy(e);
    if (input_ready_) cudaEventDestroy(input_ready_);
    if (stream_) cudaStreamDestroy(stream_);
  }

  int rank() const override { return rank_; }
  int world() const override { return world_; }
  int local_rank() const override { return boot_.local_rank(); }
  int local_world() const override { return boot_.local_world(); }
  int device_elem_bytes() const override { return int(es_); }
  const std::string& name() const override { return log_.name(); }
  int global_rank() const override { return boot_.global_rank(); }

  // ncclCommSplit, collective over this comm like the bootstrap's split beside it (same order on
  // every rank). The group's bootstrap traces nothing: its lanes would be the group's.
  std::unique_ptr<Comm> split(int color, int key, const std::string& name) override {
    check_usable();
    flush_p2p();
    std::unique_ptr<Comm> boot = boot_.split(color, key, name);  // checks color and name
    boot->set_tracer(nullptr);
    ZT_CHECK_CUDA(cudaSetDevice(device_));
    ncclComm_t c = nullptr;
    ZT_CHECK_NCCL(ncclCommSplit(comm_, color, key, &c, nullptr));
    CommOptions opts = log_.options();
    auto group = std::make_unique<NcclComm>(opts, std::move(boot), c, device_, compute_stream_, type_, es_);
    group->set_tracer(log_.tracer());
    return group;
  }

  // Device bytes. Queued, and launched together at the next wait, test, order_compute_after or
  // collective as one NCCL group (flush_p2p): NCCL's send and receive kernels block their stream
  // until the peer's half runs, so a ring's send and recv on one stream must be launched together.
  CommHandle send(const void* buf, size_t bytes, int peer) override {
    return p2p(CollOp::send, const_cast<void*>(buf), bytes, peer);
  }
  CommHandle recv(void* buf, size_t bytes, int peer) override { return p2p(CollOp::recv, buf, bytes, peer); }

  CommHandle all_reduce(float* buf, size_t n) override {
    check_usable();
    flush_p2p();
    const uint64_t bytes = model_bytes_all_reduce(n, world_, es_);
    if (log_.take_fault(CollOp::all_reduce)) return {log_.start(CollOp::all_reduce, bytes, true)};
    const uint64_t seq = log_.start(CollOp::all_reduce, bytes);
    if (n == 0) return finished(seq);
    before_launch();
    ZT_CHECK_NCCL(ncclAllReduce(buf, buf, n, type_, ncclSum, comm_, stream_));
    return after_launch(seq);
  }

  CommHandle reduce_scatter(const float* send, float* recv, size_t recv_n) override {
    check_usable();
    flush_p2p();
    const bool in_place = elem(recv) == elem(send) + size_t(rank_) * recv_n * es_;
    ZT_REQUIRE(in_place || !overlaps(send, es_ * recv_n * world_, recv, es_ * recv_n),
               "reduce_scatter: send and recv overlap (only recv == send + rank*recv_n is allowed in place)");
    const uint64_t bytes = model_bytes_reduce_scatter(recv_n, world_, es_);
    if (log_.take_fault(CollOp::reduce_scatter)) return {log_.start(CollOp::reduce_scatter, bytes, true)};
    const uint64_t seq = log_.start(CollOp::reduce_scatter, bytes);
    if (recv_n == 0) return finished(seq);
    before_launch();
    ZT_CHECK_NCCL(ncclReduceScatter(send, recv, recv_n, type_, ncclSum, comm_, stream_));
    return after_launch(seq);
  }

  CommHandle all_gather(const float* send, float* recv, size_t send_n) override {
    check_usable();
    flush_p2p();
    const bool in_place = elem(send) == elem(recv) + size_t(rank_) * send_n * es_;
    ZT_REQUIRE(in_place || !overlaps(send, es_ * send_n, recv, es_ * send_n * world_),
               "all_gather: send and recv overlap (only send == recv + rank*send_n is allowed in place)");
    const uint64_t bytes = model_bytes_all_gather(send_n, world_, es_);
    if (log_.take_fault(CollOp::all_gather)) return {log_.start(CollOp::all_gather, bytes, true)};
    const uint64_t seq = log_.start(CollOp::all_gather, bytes);
    if (send_n == 0) return finished(seq);
    before_launch();
    ZT_CHECK_NCCL(ncclAllGather(send, recv, send_n, type_, comm_, stream_));
    return after_launch(seq);
  }

  // Host bytes over the bootstrap comm, as on every backend (nothing broadcasts device memory).
  CommHandle broadcast(void* buf, size_t bytes, int root) override {
    check_usable();
    ZT_REQUIRE(root >= 0 && root < world_, "broadcast: root " << root << " is not a rank of a world of " << world_);
    const uint64_t seq = log_.start(CollOp::broadcast, model_bytes_broadcast(bytes, world_, root == rank_));
    const double t0 = log_.now();
    boot_.wait(boot_.broadcast(buf, bytes, root));
    log_.add_wait(log_.now() - t0);
    return finished(seq);
  }

  bool test(CommHandle h) override {
    flush_p2p();
    progress();
    return !h.valid() || !is_pending(h.seq);
  }

  // The compute stream waits on the collective's event; the host goes on (see Comm).
  void order_compute_after(CommHandle h) override {
    flush_p2p();
    progress();
    const auto p = std::find_if(pending_.begin(), pending_.end(), [&](const Pending& q) { return q.seq == h.seq; });
    if (p == pending_.end()) return;  // complete already
    ZT_CHECK_CUDA(cudaSetDevice(device_));
    ZT_CHECK_CUDA(cudaStreamWaitEvent(compute_stream_, p->done, 0));
    progress();  // one that completed meanwhile is recorded so now (the trace's comm lane)
  }

  void wait(CommHandle h) override {
    flush_p2p();
    if (!h.valid() || !is_pending(h.seq)) return;
    log_.wait_polling([&] { progress(); }, [&] { return !is_pending(h.seq); }, [&] { timeout(h.seq); }, 20);
  }

  // Control traffic goes over MPI (host doubles); recorded here too so step_stats() of the model
  // comm has the control bytes.
  void all_reduce_sum(double* vals, int n) override {
    const uint64_t seq = log_.start(CollOp::scalar_all_reduce, model_bytes_all_reduce(uint64_t(std::max(n, 0)), world_, 8));
    const double t0 = log_.now();
    boot_.all_reduce_sum(vals, n);
    log_.add_wait(log_.now() - t0);
    log_.finish(seq);
  }
  void barrier() override {
    const uint64_t seq = log_.start(CollOp::barrier, 0);
    const double t0 = log_.now();
    boot_.barrier();
    log_.add_wait(log_.now() - t0);
    log_.finish(seq);
  }
  std::vector<uint64_t> all_gather_u64(uint64_t v) override {
    const uint64_t seq = log_.start(CollOp::scalar_all_gather, model_bytes_all_gather(1, world_, 8));
    const double t0 = log_.now();
    std::vector<uint64_t> out = boot_.all_gather_u64(v);
    log_.add_wait(log_.now() - t0);
    log_.finish(seq);
    return out;
  }

  void begin_step(int64_t step) override {
    log_.begin_step(step);
    boot_.begin_step(step);
  }
  const CommStepStats& step_stats() const override { return log_.stats(); }
  std::string log_dump(size_t n) const override { return log_.dump(n); }
  std::vector<CollRecord> records() const override { return log_.records(); }
  void set_tracer(Tracer* t) override { log_.set_tracer(t); }

  [[noreturn]] void abort_all(int code) override {
    if (comm_ && !aborted_) {
      aborted_ = true;
      ncclCommAbort(comm_);  // unblocks our kernels; best effort, we are going down anyway
    }
    boot_.abort_all(code);
    std::_Exit(code);  // not reached: abort_all never returns
  }

 private:
  struct Pending {
    uint64_t seq;
    cudaEvent_t done;
  };
  struct P2p {  // a send or recv issued, not yet launched
    CollOp op;
    void* buf;
    size_t bytes;
    int peer;
    uint64_t seq;
  };

  CommHandle p2p(CollOp op, void* buf, size_t bytes, int peer) {
    check_usable();
    ZT_REQUIRE(peer >= 0 && peer < world_ && peer != rank_,
               coll_op_name(op) << ": peer " << peer << " is not another rank of group \"" << name() << "\" ("
                                << world_ << " ranks; this is rank " << rank_ << ")");
    const uint64_t seq = log_.start_p2p(op, model_bytes_p2p(bytes, op), peer);
    if (bytes == 0) return finished(seq);
    p2p_queue_.push_back({op, buf, bytes, peer, seq});
    return {seq};
  }

  void flush_p2p() {
    if (p2p_queue_.empty()) return;
    before_launch();
    ZT_CHECK_NCCL(ncclGroupStart());
    for (const P2p& p : p2p_queue_) {
      if (p.op == CollOp::send) ZT_CHECK_NCCL(ncclSend(p.buf, p.bytes, ncclUint8, p.peer, comm_, stream_));
      else ZT_CHECK_NCCL(ncclRecv(p.buf, p.bytes, ncclUint8, p.peer, comm_, stream_));
    }
    ZT_CHECK_NCCL(ncclGroupEnd());
    for (const P2p& p : p2p_queue_) after_launch(p.seq);  // one event each, all after the whole group
    p2p_queue_.clear();
  }

  void check_usable() const {
    ZT_REQUIRE(!aborted_, "the NCCL communicator was aborted after a collective timed out; "
                          "no further collectives are possible");
  }

  void before_launch() {
    ZT_CHECK_CUDA(cudaSetDevice(device_));
    ZT_CHECK_CUDA(cudaEventRecord(input_ready_, compute_stream_));
    ZT_CHECK_CUDA(cudaStreamWaitEvent(stream_, input_ready_, 0));
  }

  CommHandle after_launch(uint64_t seq) {
    cudaEvent_t ev = nullptr;
    if (!free_events_.empty()) {
      ev = free_events_.back();
      free_events_.pop_back();
    } else {
      ZT_CHECK_CUDA(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
    }
    ZT_CHECK_CUDA(cudaEventRecord(ev, stream_));
    pending_.push_back({seq, ev});
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

  // Retires every pending collective whose event has fired; surfaces NCCL's asynchronous errors.
  void progress() {
    if (pending_.empty()) return;
    for (Pending& p : pending_) {
      const cudaError_t rc = cudaEventQuery(p.done);
      if (rc == cudaErrorNotReady) continue;
      ZT_CHECK_CUDA(rc);
      log_.finish(p.seq);
      free_events_.push_back(p.done);
      p.seq = 0;
    }
    pending_.erase(std::remove_if(pending_.begin(), pending_.end(), [](const Pending& p) { return p.seq == 0; }),
                   pending_.end());
    if (!pending_.empty()) {
      ncclResult_t async = ncclSuccess;
      ZT_CHECK_NCCL(ncclCommGetAsyncError(comm_, &async));
      if (async != ncclSuccess && async != ncclInProgress) async_error(async);
    }
  }

  // A peer lost, a network error: NCCL's kernels would wait forever. As on a timeout: the recent
  // collectives, ncclCommAbort, and an error naming the oldest collective in flight.
  [[noreturn]] void async_error(ncclResult_t rc) {
    const uint64_t seq = pending_.front().seq;  // collectives complete in stream order: the stuck one
    const CollRecord* r = log_.find(seq);
    std::ostringstream what;
    what << "NCCL reported an asynchronous error (" << ncclGetErrorString(rc) << ") with collective "
         << (r ? coll_op_name(r->op) : "?") << " #" << seq << " in flight"
         << (r && r->step >= 0 ? " (step " + std::to_string(r->step) + ")" : std::string())
         << "; NCCL_DEBUG=WARN tells more";
    std::fprintf(stderr, "rank %d: %s; last collectives on this rank:\n%s", rank_, what.str().c_str(),
                 log_.dump(16).c_str());
    std::fflush(stderr);
    aborted_ = true;
    ncclCommAbort(comm_);
    throw Error(what.str());
  }

  [[noreturn]] void timeout(uint64_t seq) {
    log_.mark_timed_out(seq);
    const std::string report = log_.timeout_report(seq);
    std::fprintf(stderr, "%s", report.c_str());
    std::fflush(stderr);
    // The kernels of this and every later collective on the stream would spin forever: abort the
    // communicator so the GPU is released; the comm is unusable from here on.
    aborted_ = true;
    ncclCommAbort(comm_);
    throw CommTimeout(log_.timeout_headline(seq));
  }

  std::unique_ptr<Comm> boot_owned_;  // a group's bootstrap (split of the parent's); null for the world
  Comm& boot_;
  int rank_, world_;
  int device_ = 0;
  CollLog log_;
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  cudaStream_t compute_stream_;  // the backend's compute stream: every collective follows its queued work
  ncclDataType_t type_;  // of the device buffers: ncclFloat, or ncclBfloat16 (reduced by NCCL's bf16 sum)
  size_t es_;            // its bytes
  cudaEvent_t input_ready_ = nullptr;
  bool aborted_ = false;
  std::vector<Pending> pending_;
  std::vector<cudaEvent_t> free_events_;
  std::vector<P2p> p2p_queue_;  // sends and receives until flush_p2p
};

}  // namespace

std::unique_ptr<Comm> make_nccl_comm(const CommOptions& opts, Comm& bootstrap, CUstream_st* compute_stream, bool bf16) {
  ZT_REQUIRE(opts.timeout_s > 0, "comm timeout must be > 0 s, got " << opts.timeout_s);
  ZT_REQUIRE(compute_stream != nullptr, "internal error: make_nccl_comm needs the compute stream its collectives "
                                        "follow (the legacy default stream does not order a non-blocking one)");
  return std::make_unique<NcclComm>(opts, bootstrap, compute_stream, bf16);
}

}  // namespace zt
