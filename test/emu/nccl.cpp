// NCCL, emulated for one rank or several: enough for src/comm/nccl_comm.cu to run under the
// emulator, its stream ordering checked like every other piece of stream work (the comm stream
// must wait for the compute stream's event before it reads or writes a buffer).
//
// Several ranks: each emulated process is one MPI rank with its own emulated device (runtime.cpp:
// ZT_EMU_DEVICES). ncclCommInitRank splits MPI_COMM_WORLD by the unique id into a communicator of
// its own; a collective runs when its stream reaches it (work runs in issue order here, so: when it
// is enqueued), blocking, over MPI on the device buffers (which the OpScope opens to host code for
// the duration). Every rank computes a reduction from all contributions in rank order, so all ranks
// get the same bits:
//   fp32  summed in fp32, rank 0 + rank 1 + ... (NCCL's ring order differs; fp32 sums differ by
//         rounding only)
//   bf16  each addition in fp32, rounded to bf16 after each (round to nearest even), as NCCL's ring
//         reduction rounds after each step: world - 1 roundings per element.
// Only ncclSum, ncclFloat32 and ncclBfloat16 reduce (what nccl_comm.cu uses); gathers and
// broadcasts move bytes of any type.
#include <mpi.h>
#include <nccl.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "emu_internal.h"

using namespace zt_emu;

namespace {
struct Comm {
  int nranks = 1, rank = 0;
  MPI_Comm mpi = MPI_COMM_NULL;  // nranks > 1
  ncclResult_t async_error = ncclSuccess;
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
float bf16_to_float(uint16_t b) {
  const uint32_t u = uint32_t(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
uint16_t float_to_bf16(float f) {  // round to nearest even, as __float2bfloat16
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);  // NaN stays a (quiet) NaN
  return uint16_t((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
// out[i] = sum over ranks r of part(r)[i], in rank order; parts are `count` elements `stride`
// elements apart in `all`.
void reduce_parts(void* out, const char* all, size_t count, size_t stride, int nranks, ncclDataType_t t) {
  if (t == ncclFloat32) {
    const float* a = reinterpret_cast<const float*>(all);
    float* o = static_cast<float*>(out);
    for (size_t i = 0; i < count; ++i) {
      float acc = a[i];
      for (int r = 1; r < nranks; ++r) acc += a[size_t(r) * stride + i];
      o[i] = acc;
    }
  } else {
    const uint16_t* a = reinterpret_cast<const uint16_t*>(all);
    uint16_t* o = static_cast<uint16_t*>(out);
    for (size_t i = 0; i < count; ++i) {
      uint16_t acc = a[i];
      for (int r = 1; r < nranks; ++r) acc = float_to_bf16(bf16_to_float(acc) + bf16_to_float(a[size_t(r) * stride + i]));
      o[i] = acc;
    }
  }
}
int mpi_count(size_t bytes) {
  if (bytes > size_t(INT32_MAX)) fatal("emulated NCCL: a collective of %zu bytes (more than MPI's int count)", bytes);
  return int(bytes);
}
Comm* usable(ncclComm_t comm, cudaStream_t stream) {
  Comm* c = reinterpret_cast<Comm*>(comm);
  if (!c || !valid_stream(stream)) return nullptr;
  return c;
}
std::string describe(const char* name, const Comm& c, size_t bytes) {
  return std::string(name) + " (emulated NCCL, rank " + std::to_string(c.rank) + " of " + std::to_string(c.nranks) +
         ", " + std::to_string(bytes) + " bytes)";
}
bool reducible(ncclDataType_t t, ncclRedOp_t op) {
  if ((t == ncclFloat32 || t == ncclBfloat16) && op == ncclSum) return true;
  std::fprintf(stderr, "zt-emu: NCCL reduction of type %d with op %d is not emulated (ncclSum of fp32, bf16 only)\n",
               int(t), int(op));
  return false;
}
}  // namespace

extern "C" {

ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
  banner();
  std::memset(id, 0, sizeof *id);
  // Communicators made from different ids must not meet: the id names the creating process.
  std::snprintf(id->internal, sizeof id->internal, "zt-emu %ld", long(getpid()));
  return ncclSuccess;
}
ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank) {
  if (nranks < 1 || rank < 0 || rank >= nranks) return ncclInvalidArgument;
  Comm* c = new Comm{nranks, rank};
  if (nranks > 1) {
    int init = 0;
    MPI_Initialized(&init);
    if (!init) fatal("emulated NCCL with %d ranks runs over MPI, and MPI is not initialised", nranks);
    int world = 0;
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    if (world < nranks) fatal("emulated NCCL: %d ranks asked for in an MPI job of %d processes", nranks, world);
    // Every process of MPI_COMM_WORLD takes part (nccl_comm.cu joins all ranks at once), grouped by id.
    uint32_t color = 2166136261u;
    for (char ch : std::string(id.internal, strnlen(id.internal, sizeof id.internal))) color = (color ^ uint8_t(ch)) * 16777619u;
    MPI_Comm_split(MPI_COMM_WORLD, int(color & 0x7fffffff), rank, &c->mpi);
    int size = 0;
    MPI_Comm_size(c->mpi, &size);
    if (size != nranks) fatal("emulated NCCL: %d processes joined a communicator of %d ranks", size, nranks);
  }
  *comm = reinterpret_cast<ncclComm_t>(c);
  return ncclSuccess;
}
ncclResult_t ncclCommFinalize(ncclComm_t) { return ncclSuccess; }
ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  Comm* c = reinterpret_cast<Comm*>(comm);
  if (c && c->mpi != MPI_COMM_NULL) MPI_Comm_free(&c->mpi);
  delete c;
  return ncclSuccess;
}
// No MPI call: the other ranks may be stuck in a collective (that is why one aborts).
ncclResult_t ncclCommAbort(ncclComm_t comm) {
  delete reinterpret_cast<Comm*>(comm);
  return ncclSuccess;
}
ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* e) {
  Comm* c = reinterpret_cast<Comm*>(comm);
  if (!c) return ncclInvalidArgument;
  *e = c->async_error;
  return ncclSuccess;
}
const char* ncclGetErrorString(ncclResult_t r) { return r == ncclSuccess ? "no error" : "error (emulated NCCL)"; }

ncclResult_t ncclAllReduce(const void* send, void* recv, size_t count, ncclDataType_t t, ncclRedOp_t op,
                           ncclComm_t comm, cudaStream_t stream) {
  Comm* c = usable(comm, stream);
  if (!c || !reducible(t, op)) return ncclInvalidArgument;
  const size_t b = count * type_bytes(t);
  OpScope scope(stream, describe("ncclAllReduce", *c, b),
                {{send, b, false, Where::device, "sendbuff", true}, {recv, b, true, Where::device, "recvbuff", true}});
  if (c->nranks == 1) {
    if (send != recv) std::memmove(recv, send, b);
    return ncclSuccess;
  }
  std::vector<char> all(b * size_t(c->nranks));
  MPI_Allgather(send, mpi_count(b), MPI_BYTE, all.data(), mpi_count(b), MPI_BYTE, c->mpi);
  reduce_parts(recv, all.data(), count, count, c->nranks, t);
  return ncclSuccess;
}
ncclResult_t ncclReduceScatter(const void* send, void* recv, size_t recvcount, ncclDataType_t t, ncclRedOp_t op,
                               ncclComm_t comm, cudaStream_t stream) {
  Comm* c = usable(comm, stream);
  if (!c || !reducible(t, op)) return ncclInvalidArgument;
  const size_t b = recvcount * type_bytes(t);
  OpScope scope(stream, describe("ncclReduceScatter", *c, b),
                {{send, b * size_t(c->nranks), false, Where::device, "sendbuff", true}, {recv, b, true, Where::device, "recvbuff", true}});
  if (c->nranks == 1) {
    if (send != recv) std::memmove(recv, send, b);
    return ncclSuccess;
  }
  // Part r of every rank's send buffer goes to rank r.
  std::vector<char> mine(b * size_t(c->nranks));
  MPI_Alltoall(send, mpi_count(b), MPI_BYTE, mine.data(), mpi_count(b), MPI_BYTE, c->mpi);
  reduce_parts(recv, mine.data(), recvcount, recvcount, c->nranks, t);
  return ncclSuccess;
}
ncclResult_t ncclAllGather(const void* send, void* recv, size_t sendcount, ncclDataType_t t, ncclComm_t comm,
                           cudaStream_t stream) {
  Comm* c = usable(comm, stream);
  if (!c) return ncclInvalidArgument;
  const size_t b = sendcount * type_bytes(t);
  OpScope scope(stream, describe("ncclAllGather", *c, b),
                {{send, b, false, Where::device, "sendbuff", true}, {recv, b * size_t(c->nranks), true, Where::device, "recvbuff", true}});
  if (c->nranks == 1) {
    if (send != recv) std::memmove(recv, send, b);
    return ncclSuccess;
  }
  std::vector<char> mine(static_cast<const char*>(send), static_cast<const char*>(send) + b);  // send may lie in recv
  MPI_Allgather(mine.data(), mpi_count(b), MPI_BYTE, recv, mpi_count(b), MPI_BYTE, c->mpi);
  return ncclSuccess;
}
ncclResult_t ncclBroadcast(const void* send, void* recv, size_t count, ncclDataType_t t, int root, ncclComm_t comm,
                           cudaStream_t stream) {
  Comm* c = usable(comm, stream);
  if (!c || root < 0 || root >= c->nranks) return ncclInvalidArgument;
  const size_t b = count * type_bytes(t);
  OpScope scope(stream, describe("ncclBroadcast", *c, b),
                {{send, c->rank == root ? b : 0, false, Where::device, "sendbuff", true}, {recv, b, true, Where::device, "recvbuff", true}});
  if (c->rank == root && send != recv) std::memmove(recv, send, b);
  if (c->nranks > 1) MPI_Bcast(recv, mpi_count(b), MPI_BYTE, root, c->mpi);
  return ncclSuccess;
}

}  // extern "C"
