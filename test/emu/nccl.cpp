// NCCL for one rank, emulated: enough for src/comm/nccl_comm.cu to run under the emulator so that
// its stream ordering (the comm stream waiting for the compute stream's event before it reads or
// writes a buffer) is checked like every other piece of stream work. With one rank every
// collective is a copy (or nothing, in place); more ranks are refused (README: NCCL with several
// ranks is not emulated).
#include <nccl.h>

#include <cstdio>
#include <cstring>
#include <string>

#include "emu_internal.h"

using namespace zt_emu;

namespace {
struct Comm {
  int nranks;
  bool aborted = false;
};
size_t type_bytes(ncclDataType_t t) {
  switch (t) {
    case ncclInt8: case ncclUint8: return 1;
    case ncclFloat16: case ncclBfloat16: return 2;
    case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
    case ncclInt64: case ncclUint64: case ncclFloat64: return 8;
    default: return 0;
  }
}
ncclResult_t collective(const char* name, const void* send, void* recv, size_t send_bytes, size_t recv_bytes,
                        ncclComm_t comm, cudaStream_t stream) {
  Comm* c = reinterpret_cast<Comm*>(comm);
  if (!c || c->aborted) return ncclInvalidArgument;
  if (!valid_stream(stream)) return ncclInvalidArgument;
  OpScope op(stream, std::string(name) + " (emulated NCCL, 1 rank, " + std::to_string(recv_bytes) + " bytes)",
             {{send, send_bytes, false, Where::device, "sendbuff"}, {recv, recv_bytes, true, Where::device, "recvbuff"}});
  if (send != recv) std::memmove(recv, send, recv_bytes);
  return ncclSuccess;
}
}  // namespace

extern "C" {

ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
  banner();
  std::memset(id, 0, sizeof *id);
  std::snprintf(id->internal, sizeof id->internal, "zt-emu");
  return ncclSuccess;
}
ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId, int rank) {
  if (nranks != 1 || rank != 0) {
    std::fprintf(stderr, "zt-emu: NCCL with %d ranks is not emulated (one rank only)\n", nranks);
    return ncclInvalidUsage;
  }
  *comm = reinterpret_cast<ncclComm_t>(new Comm{nranks});
  return ncclSuccess;
}
ncclResult_t ncclCommFinalize(ncclComm_t) { return ncclSuccess; }
ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  delete reinterpret_cast<Comm*>(comm);
  return ncclSuccess;
}
ncclResult_t ncclCommAbort(ncclComm_t comm) {
  delete reinterpret_cast<Comm*>(comm);
  return ncclSuccess;
}
ncclResult_t ncclCommGetAsyncError(ncclComm_t, ncclResult_t* e) {
  *e = ncclSuccess;
  return ncclSuccess;
}
const char* ncclGetErrorString(ncclResult_t r) { return r == ncclSuccess ? "no error" : "error (emulated NCCL)"; }

ncclResult_t ncclAllReduce(const void* send, void* recv, size_t count, ncclDataType_t t, ncclRedOp_t, ncclComm_t comm,
                           cudaStream_t stream) {
  const size_t b = count * type_bytes(t);
  return collective("ncclAllReduce", send, recv, b, b, comm, stream);
}
ncclResult_t ncclReduceScatter(const void* send, void* recv, size_t recvcount, ncclDataType_t t, ncclRedOp_t,
                               ncclComm_t comm, cudaStream_t stream) {
  const size_t b = recvcount * type_bytes(t);
  return collective("ncclReduceScatter", send, recv, b, b, comm, stream);
}
ncclResult_t ncclAllGather(const void* send, void* recv, size_t sendcount, ncclDataType_t t, ncclComm_t comm,
                           cudaStream_t stream) {
  const size_t b = sendcount * type_bytes(t);
  return collective("ncclAllGather", send, recv, b, b, comm, stream);
}
ncclResult_t ncclBroadcast(const void* send, void* recv, size_t count, ncclDataType_t t, int root, ncclComm_t comm,
                           cudaStream_t stream) {
  if (root != 0) return ncclInvalidArgument;
  const size_t b = count * type_bytes(t);
  return collective("ncclBroadcast", send, recv, b, b, comm, stream);
}

}  // extern "C"
