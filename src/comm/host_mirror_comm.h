// Collectives on device buffers through the MPI comm, by pinned host mirrors (docs/design.md §3.4
// "Device buffers over MPI"; docs/gpu.md): the CUDA backend's multi-rank path. A Comm decorator: the
// caller hands device pointers to a HostMirrorComm; it copies each operand to the fp32 host mirror of
// the device region it lies in (the regions and their mirrors are the caller's: the ZeRO engine's
// are listed by zero/store.h, host_mirror_regions), runs the inner comm's collective there, and
// copies the result back, ordered against the compute stream with events:
//
//   compute stream  ... grads of bucket k written ─ record e0 ─────────────── wait e2 ─> reads result
//   copy stream                          wait e0 ─ D2H(send) ─ record e1          H2D(recv) ─ record e2
//   caller (host)                        MPI collective starts once e1 is done ─> completes ─┘
//
// The MPI comm and its comm thread (comm/mpi_thread.h) only ever see the host mirrors. Collectives
// start on the inner comm in the order they were issued (every rank issues the same order), each as
// soon as its device-to-host copy is done: test() (every unit hook calls it) starts what is ready,
// wait() blocks for the copies first. After wait() returns, the compute stream is ordered after the
// copies (both ways: it may overwrite the send buffer and read the result).
//
// bf16 buffers: reductions (all_reduce, reduce_scatter) are widened to fp32 in the mirror, summed in
// fp32 by MPI and narrowed back once (round to nearest even); all-gathers move the bf16 bits as they
// are (two bf16 per float: a copy, not arithmetic). A world of one copies device to device on the
// compute stream and needs no mirror. Host-side bookkeeping (scalar all-reduces, barriers) passes
// through to the inner comm unchanged.
#pragma once
#include <cstddef>
#include <vector>

namespace zt {

// A device buffer that collectives may be given, and its pinned host mirror.
struct MirroredRegion {
  const void* device;
  size_t numel;  // elements of the comm's device type
  float* host;   // numel fp32 elements, page-locked
};

}  // namespace zt

#if ZT_HAVE_CUDA
#include <cstdint>
#include <cstdlib>
#include <map>
#include <memory>

#include "comm/comm.h"
#include "runtime/cuda_check.h"

namespace zt {

class HostMirrorComm final : public Comm {
 public:
  // elem_bytes: the device buffers' element, 2 (bf16) or 4 (fp32); every device pointer this comm is
  // given points into one of `regions` (none for a world of one, which copies device to device).
  HostMirrorComm(Comm& inner, std::vector<MirroredRegion> regions, int elem_bytes);
  ~HostMirrorComm() override;
  int device_elem_bytes() const override { return int(es_); }

  int rank() const override { return inner_.rank(); }
  int world() const override { return inner_.world(); }
  int local_rank() const override { return inner_.local_rank(); }
  int local_world() const override { return inner_.local_world(); }

  CommHandle all_reduce(float* buf, size_t n) override;
  CommHandle reduce_scatter(const float* send, float* recv, size_t recv_n) override;
  CommHandle all_gather(const float* send, float* recv, size_t send_n) override;
  CommHandle broadcast(void* buf, size_t bytes, int root) override;  // host buffers only

  void wait(CommHandle h) override;
  bool test(CommHandle h) override;

  void all_reduce_sum(double* vals, int n) override { inner_.all_reduce_sum(vals, n); }
  void barrier() override { inner_.barrier(); }
  std::vector<uint64_t> all_gather_u64(uint64_t v) override { return inner_.all_gather_u64(v); }
  void begin_step(int64_t step) override { inner_.begin_step(step); }
  const CommStepStats& step_stats() const override { return inner_.step_stats(); }
  std::string log_dump(size_t n) const override { return inner_.log_dump(n); }
  std::vector<CollRecord> records() const override { return inner_.records(); }
  // run.trace: the copies on the copy track; each collective keeps the tags it was issued with
  // until its inner collective starts (after its copies: other collectives may be tagged meanwhile).
  void set_tracer(Tracer* t) override {
    tr_ = t;
    inner_.set_tracer(t);
  }
  [[noreturn]] void abort_all(int code) override {
    inner_.abort_all(code);
    std::abort();  // unreachable: inner_ never returns either, but the compiler cannot see through the override
  }

 private:
  struct Op;
  struct Copy {  // one device-to-host copy
    void* dst;
    const void* src;
    size_t bytes;
  };
  float* mirror(const void* dev, size_t n) const;  // the mirror's element of device element `dev`
  CommHandle submit(std::unique_ptr<Op> op, const std::vector<Copy>& d2h);
  CommHandle local();  // nothing to send (a world of one, no elements): drops the issuer's tags
  void start_ready(uint64_t upto);  // start queued ops in order; block on the copies of ops <= upto
  void finish(uint64_t id);         // narrow, copy back, order the compute stream after it

  Comm& inner_;
  size_t es_;  // bytes per element: 2 (bf16) or 4
  std::vector<MirroredRegion> regions_;
  cudaStream_t copy_ = nullptr;
  std::map<uint64_t, std::unique_ptr<Op>> ops_;  // issued, not finished; by id (= issue order)
  uint64_t next_id_ = 1;
  Tracer* tr_ = nullptr;

  // ---- groups and point to point (comm/comm.h "Groups", "Point to point") ----------------------
  // A group is a HostMirrorComm over the inner comm's split, with this one's mirrors (a buffer in flight
  // in two groups at once would share its mirror: the engine never does that). send / recv move
  // device bytes through a pinned host buffer of their own, copied like a collective's operand.
 public:
  const std::string& name() const override { return inner_.name(); }
  int global_rank() const override { return inner_.global_rank(); }
  std::unique_ptr<Comm> split(int color, int key, const std::string& name) override;
  CommHandle send(const void* buf, size_t bytes, int peer) override;
  CommHandle recv(void* buf, size_t bytes, int peer) override;

 private:
  HostMirrorComm(std::unique_ptr<Comm> inner, const HostMirrorComm& parent);
  float* p2p_buffer(size_t bytes, uint64_t id);  // pinned, kept until op `id` has finished
  std::unique_ptr<Comm> owned_inner_;             // a group's: inner_ is its split of the parent's inner comm
  std::map<uint64_t, std::shared_ptr<void>> p2p_bufs_;  // by the op using it
};

}  // namespace zt
#endif
