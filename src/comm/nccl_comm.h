// NCCL backend of Comm (device float buffers). Built only with the CUDA toolchain (nccl_comm.cu);
// link with -lnccl -lcudart (NCCL lives in /usr/local/cuda/lib on the CUDA 13 images).
//
// make_nccl_comm: rank 0 creates the ncclUniqueId, the MPI `bootstrap` comm broadcasts it, every
// rank selects GPU local_rank % device_count and joins with ncclCommInitRank. Collectives are
// enqueued on the comm's own non-blocking stream, each followed by an event: test() queries the
// event, wait() polls it until timeout_s (then prints the collective log, ncclCommAbort, CommTimeout).
// Control helpers (all_reduce_sum, barrier, all_gather_u64) go through `bootstrap`, which must
// outlive this comm; they are recorded in both comms' rings. begin_step is forwarded to it too.
//
// Ordering with compute: the comm is made with the compute stream it must follow (the backend's:
// CudaOps<T>::stream(), the non-blocking stream of cuda::Context). Before each collective it records
// an event on that stream and makes its own stream wait for it (cudaEventRecord + cudaStreamWaitEvent),
// so a collective never reads a buffer that a kernel is still writing. There is no default: the
// legacy default stream does not order non-blocking streams, so following it would race. After
// wait()/test() returned true the data is ready for every stream and the host.
#pragma once
#include <memory>

#include "comm/comm.h"

struct CUstream_st;  // cudaStream_t without including the CUDA headers

namespace zt {

// compute_stream: the stream whose queued work each collective must follow (not null).
std::unique_ptr<Comm> make_nccl_comm(const CommOptions& opts, Comm& bootstrap, CUstream_st* compute_stream);

}  // namespace zt
