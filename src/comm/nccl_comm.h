// NCCL backend of Comm (device float buffers). Built only with the CUDA toolchain (nccl_comm.cu);
// link with -lnccl -lcudart (NCCL lives in /usr/local/cuda/lib on the CUDA 13 images).
//
// make_nccl_comm: rank 0 creates the ncclUniqueId, the MPI `bootstrap` comm broadcasts it, every
// rank selects GPU local_rank % device_count and joins with ncclCommInitRank. Collectives are
// enqueued on the comm's own non-blocking stream, each followed by an event: test() queries the
// event, wait() polls it until timeout_s (then prints the ring buffer, ncclCommAbort, CommTimeout).
// Control helpers (all_reduce_sum, barrier, all_gather_u64) go through `bootstrap`, which must
// outlive this comm; they are recorded in both comms' rings. begin_step is forwarded to it too.
//
// Ordering with compute: before each collective the comm stream waits (cudaStreamWaitEvent) for
// the work already queued on the compute stream (default: the legacy default stream 0), so a
// collective never reads a buffer that a kernel is still writing. After wait()/test() returned
// true the data is ready for every stream and the host.
#pragma once
#include <memory>

#include "comm/comm.h"

struct CUstream_st;  // cudaStream_t without including the CUDA headers

namespace zt {

std::unique_ptr<Comm> make_nccl_comm(const CommOptions& opts, Comm& bootstrap);

// The stream whose queued work collectives must follow (nullptr: the legacy default stream).
// `comm` must come from make_nccl_comm.
void nccl_comm_set_compute_stream(Comm& comm, CUstream_st* stream);
// The comm's own stream (for cudaStreamWaitEvent-style chaining by callers that want it).
CUstream_st* nccl_comm_stream(Comm& comm);

}  // namespace zt
