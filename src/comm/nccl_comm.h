// NCCL backend of Comm (device buffers, fp32 or bf16): the CUDA backend's comm when comm.backend is
// "nccl" (train/backend_choice.h: one GPU per rank), made by the trainer over the MPI comm. Built
// only with the CUDA toolchain (nccl_comm.cu); link with -lnccl -lcudart (NCCL lives in
// /usr/local/cuda/lib on the CUDA 13 images). Tested under emulation (test/emu/nccl.cpp); at world 1 it also ran on an H100 (bit for bit against MPI).
//
// make_nccl_comm: rank 0 creates the ncclUniqueId, the MPI `bootstrap` comm broadcasts it, every
// rank selects GPU local_rank % device_count and joins with ncclCommInitRank. Collectives are
// enqueued on the comm's own non-blocking stream, each followed by an event: test() queries the
// event, wait() polls it until timeout_s (then prints the collective log, ncclCommAbort, CommTimeout),
// order_compute_after() makes the compute stream wait on it (the host goes on). Every query also asks
// ncclCommGetAsyncError: an asynchronous error prints the log, aborts the communicator and throws.
// Control helpers (all_reduce_sum, barrier, all_gather_u64) go through `bootstrap`, which must
// outlive this comm; they are recorded in both comms' rings. begin_step is forwarded to it too.
//
// Ordering with compute: the comm is made with the compute stream it must follow (the backend's:
// CudaOps<T>::stream(), the non-blocking stream of cuda::Context). Before each collective it records
// an event on that stream and makes its own stream wait for it (cudaEventRecord + cudaStreamWaitEvent),
// so a collective never reads a buffer that a kernel is still writing. There is no default: the
// legacy default stream does not order non-blocking streams, so following it would race. After
// wait()/test() returned true the data is ready for every stream and the host; after
// order_compute_after() for the compute stream's later work only:
//
//   compute stream  ... bucket k's last gradient written ─ record e ─ later units' backward ─ wait done ─ reads
//   comm stream                                   wait e ─ ncclReduceScatter(bucket k) ─ done ┘
//
// (docs/design.md §3.4 "Device buffers over NCCL" has the stage-3 all-gathers too).
//
// Groups: split() is ncclCommSplit beside the bootstrap's own split (the group's control traffic);
// the group owns that bootstrap. send/recv (device bytes, ncclSend/ncclRecv) are queued and launched
// together, as one ncclGroupStart/End, at the next wait, test, order_compute_after or collective:
// NCCL's point-to-point kernels hold their stream until the peer's half runs, so both halves of a
// ring step must be in one launch. Issue both before waiting for either (comm.h "Point to point").
#pragma once
#include <memory>

#include "comm/comm.h"

struct CUstream_st;  // cudaStream_t without including the CUDA headers

namespace zt {

// compute_stream: the stream whose queued work each collective must follow (not null). bf16: the
// device buffers hold bf16 (counts are of bf16 elements, the pointers come through comm/comm_ptr.h)
// and are reduced by NCCL's own bf16 sum: NCCL adds in fp32 and rounds to bf16 after each add of its
// ring (world - 1 roundings per element, in an order of NCCL's choosing), where the host-staged
// path sums in fp32 and rounds once; test/emu/nccl.cpp emulates the same. Otherwise fp32 buffers.
std::unique_ptr<Comm> make_nccl_comm(const CommOptions& opts, Comm& bootstrap, CUstream_st* compute_stream,
                                     bool bf16);

}  // namespace zt
