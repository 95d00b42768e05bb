// NCCL, emulated for one rank or several: enough for src/comm/nccl_comm.cu to run under the
// emulator, its stream ordering checked like every other piece of stream work (the comm stream
// must wait for the compute stream's event before it reads or writes a buffer).
//
// Several ranks: each emulated process is one MPI rank with its own emulated device (runtime.cpp:
// ZT_EMU_DEVICES). ncclCommInitRank splits MPI_COMM_WORLD by the unique id into a communicator of
// its own. A collective is matched by its order on the communicator, as NCCL's are: the n-th
// collective of each rank sends its contribution to its peers at once (point to point, tag n) and
// is deferred work of its stream (emu_internal.h: defer) that completes when every peer's n-th
// contribution has arrived; cudaEventQuery on an event after it says cudaErrorNotReady until then.
// So a rank that skips a collective leaves its peers waiting (a contribution of another size never
// completes one), as on NCCL, and nccl_comm.cu's timeout, ncclCommAbort and error path run.
//
// ZT_EMU_NCCL_ASYNC_ERROR=R:N breaks rank R's link from its N-th collective on (1-based): that
// collective and every later one send nothing and never complete, and ncclCommGetAsyncError says
// ncclRemoteError once one of them is issued (a peer or a NIC lost, as NCCL reports it); the other
// ranks see a collective that never completes.
// Every rank computes a reduction from all contributions in rank order, so all ranks get the same bits:
//   fp32  summed in fp32, rank 0 + rank 1 + ... (NCCL's ring order differs; fp32 sums differ by
//         rounding only)
//   bf16  each addition in fp32, rounded to bf16 after each (round to nearest even), as NCCL's ring
//         reduction rounds after each step: world - 1 roundings per element.
// Only ncclSum, ncclFloat32 and ncclBfloat16 reduce (what nccl_comm.cu uses); gathers move bytes
// of any type; nothing else of NCCL is emulated (nccl_comm.cu broadcasts host bytes over MPI).
// ncclCommAbort ends the deferred collectives unfinished.
//
// Groups and point to point (comm.h "Groups", "Point to point"): ncclCommSplit is MPI_Comm_split of
// the communicator (NCCL_SPLIT_NOCOLOR: no communicator). ncclSend / ncclRecv run on a duplicate of
// it, the n-th message to / from a peer tagged n: a send copies the bytes out and completes at once
// (eager, unlike NCCL, whose send waits for the recv: a missing recv hangs the receiver only here);
// a recv is deferred work of its stream that completes when the message has arrived. So
// ncclGroupStart / ncclGroupEnd have nothing to fuse and only count their nesting.
#include <mpi.h>
#include <nccl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "emu_internal.h"

using namespace zt_emu;

namespace {
struct Comm {
  int nranks = 1, rank = 0;
  MPI_Comm mpi = MPI_COMM_NULL;  // nranks > 1
  uint64_t issued = 0;           // collectives issued: the next one's tag
  bool aborted = false;
  uint64_t broken_from = 0;      // ZT_EMU_NCCL_ASYNC_ERROR: the first broken collective (1-based), 0 none
  bool broken() const { return broken_from && issued >= broken_from; }
  MPI_Comm p2p = MPI_COMM_NULL;  // nranks > 1: sends and receives
  std::vector<uint64_t> sent{}, received{};  // messages to / from each peer so far (their tags)
  void join(MPI_Comm c) {  // c: this rank's MPI communicator of the group
    mpi = c;
    MPI_Comm_dup(c, &p2p);
    sent.assign(size_t(nranks), 0);
    received.assign(size_t(nranks), 0);
  }
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
// out[i] = sum over ranks r of parts[r][i], in rank order.
void reduce_parts(void* out, const std::vector<std::vector<char>>& parts, size_t count, ncclDataType_t t) {
  if (t == ncclFloat32) {
    float* o = static_cast<float*>(out);
    for (size_t i = 0; i < count; ++i) {
      float acc = reinterpret_cast<const float*>(parts[0].data())[i];
      for (size_t r = 1; r < parts.size(); ++r) acc += reinterpret_cast<const float*>(parts[r].data())[i];
      o[i] = acc;
    }
  } else {
    uint16_t* o = static_cast<uint16_t*>(out);
    for (size_t i = 0; i < count; ++i) {
      uint16_t acc = reinterpret_cast<const uint16_t*>(parts[0].data())[i];
      for (size_t r = 1; r < parts.size(); ++r)
        acc = float_to_bf16(bf16_to_float(acc) + bf16_to_float(reinterpret_cast<const uint16_t*>(parts[r].data())[i]));
      o[i] = acc;
    }
  }
}
int mpi_count(size_t bytes) {
  if (bytes > size_t(INT32_MAX)) fatal("emulated NCCL: a collective of %zu bytes (more than MPI's int count)", bytes);
  return int(bytes);
}
bool reducible(ncclDataType_t t, ncclRedOp_t op) {
  if ((t == ncclFloat32 || t == ncclBfloat16) && op == ncclSum) return true;
  std::fprintf(stderr, "zt-emu: NCCL reduction of type %d with op %d is not emulated (ncclSum of fp32, bf16 only)\n",
               int(t), int(op));
  return false;
}

// Sends in flight: their buffers live until MPI is done with them.
struct Send {
  MPI_Request req;
  std::vector<char> data;
};
std::vector<std::unique_ptr<Send>> g_sends;
void progress_sends() {
  for (auto& s : g_sends) {
    int done = 0;
    MPI_Test(&s->req, &done, MPI_STATUS_IGNORE);
    if (done) s.reset();
  }
  g_sends.erase(std::remove(g_sends.begin(), g_sends.end(), nullptr), g_sends.end());
}

// One collective in flight: the parts by rank (mine filled at issue), which peers' are awaited, and
// what to make of them once all have arrived.
struct Pending {
  Comm* comm;  // outlives its collectives: destroyed only after they completed, kept by an abort
  int tag = 0;
  size_t part_bytes = 0;  // expected from each awaited peer
  std::vector<std::vector<char>> parts;
  std::vector<bool> awaited;
  bool mismatched = false;  // a peer's collective of this order had another size: never completes (as NCCL)
  void* recv = nullptr;
  bool broken = false;  // issued on a broken link (ZT_EMU_NCCL_ASYNC_ERROR)
  std::function<void(std::vector<std::vector<char>>&)> finish;  // writes recv (device memory opened)

  bool arrived() {  // receives what has come; true when nothing is awaited any more
    bool all = true;
    for (int r = 0; r < comm->nranks; ++r) {
      if (!awaited[size_t(r)]) continue;
      int flag = 0, bytes = 0;
      MPI_Message msg;
      MPI_Status st;
      MPI_Improbe(r, tag, comm->mpi, &flag, &msg, &st);
      if (!flag) {
        all = false;
        continue;
      }
      MPI_Get_count(&st, MPI_BYTE, &bytes);
      parts[size_t(r)].resize(size_t(bytes));
      MPI_Mrecv(parts[size_t(r)].data(), bytes, MPI_BYTE, &msg, MPI_STATUS_IGNORE);
      awaited[size_t(r)] = false;
      mismatched |= size_t(bytes) != part_bytes;
    }
    return all;
  }
};

// Collective `name` on `stream`: inside its OpScope (`ranges`), read() takes the inputs from device
// memory and to(r) is my contribution for peer r (empty: none), sent at once; `mine` my own part;
// awaits part_bytes from each peer `from` names; `finish` makes the result when all have arrived.
ncclResult_t issue(const char* name, Comm* c, cudaStream_t stream, size_t bytes, std::initializer_list<Range> ranges,
                   const std::function<void()>& read, const std::function<std::vector<char>(int)>& to,
                   const std::function<std::vector<char>()>& mine, const std::function<bool(int)>& from,
                   size_t part_bytes, void* recv, std::function<void(std::vector<std::vector<char>>&)> finish) {
  auto p = std::make_shared<Pending>();
  p->comm = c;
  {
    OpScope scope(stream, std::string(name) + " (emulated NCCL, rank " + std::to_string(c->rank) + " of " +
                              std::to_string(c->nranks) + ", " + std::to_string(bytes) + " bytes)",
                  ranges, /*collective=*/true);
    read();
    p->tag = int(c->issued++ % 32768);
    for (int r = 0; r < c->nranks; ++r) {
      if (r == c->rank || c->broken()) continue;
      std::vector<char> d = to(r);
      if (d.empty()) continue;
      auto snd = std::make_unique<Send>();
      snd->data = std::move(d);
      MPI_Isend(snd->data.data(), mpi_count(snd->data.size()), MPI_BYTE, r, p->tag, c->mpi, &snd->req);
      g_sends.push_back(std::move(snd));
    }
  }
  p->broken = c->broken();
  p->part_bytes = part_bytes;
  p->parts.assign(size_t(c->nranks), {});
  p->parts[size_t(c->rank)] = mine();
  p->awaited.assign(size_t(c->nranks), false);
  for (int r = 0; r < c->nranks; ++r) p->awaited[size_t(r)] = r != c->rank && from(r);
  p->recv = recv;
  p->finish = std::move(finish);
  defer(stream, [p](bool block) {
    for (;;) {
      if (p->comm->aborted) return true;  // ncclCommAbort: ends unfinished, nothing written
      if (p->broken) return false;        // a lost link: never completes
      if (p->comm->nranks > 1) progress_sends();
      if (p->arrived() && !p->mismatched) {
        with_device_memory(p->recv, [&] { p->finish(p->parts); });
        return true;
      }
      if (!block) return false;
      usleep(50);
    }
  });
  return ncclSuccess;
}
std::vector<char> bytes_of(const void* p, size_t n) {
  const char* c = static_cast<const char*>(p);
  return std::vector<char>(c, c + n);
}
Comm* usable(ncclComm_t comm, cudaStream_t stream) {
  Comm* c = reinterpret_cast<Comm*>(comm);
  if (!c || c->aborted || !valid_stream(stream)) return nullptr;
  return c;
}
auto everyone = [](int) { return true; };
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
  if (const char* e = std::getenv("ZT_EMU_NCCL_ASYNC_ERROR"); e && *e) {
    int r = -1;
    unsigned long long n = 0;
    if (std::sscanf(e, "%d:%llu", &r, &n) != 2 || n == 0) fatal("ZT_EMU_NCCL_ASYNC_ERROR=%s: want RANK:N (N >= 1)", e);
    if (r == rank) c->broken_from = n;
  }
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
    MPI_Comm m = MPI_COMM_NULL;
    MPI_Comm_split(MPI_COMM_WORLD, int(color & 0x7fffffff), rank, &m);
    int size = 0;
    MPI_Comm_size(m, &size);
    if (size != nranks) fatal("emulated NCCL: %d processes joined a communicator of %d ranks", size, nranks);
    c->join(m);
  }
  *comm = reinterpret_cast<ncclComm_t>(c);
  return ncclSuccess;
}
ncclResult_t ncclCommFinalize(ncclComm_t) { return ncclSuccess; }
ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  Comm* c = reinterpret_cast<Comm*>(comm);
  if (c && c->mpi != MPI_COMM_NULL) {
    while (!g_sends.empty()) progress_sends();  // every peer received them (their collectives completed)
    MPI_Comm_free(&c->mpi);
    MPI_Comm_free(&c->p2p);
  }
  delete c;
  return ncclSuccess;
}
// No MPI call: the other ranks may be stuck in a collective (that is why one aborts). The Comm is
// kept (its deferred collectives end on seeing it aborted); the process is going down.
ncclResult_t ncclCommAbort(ncclComm_t comm) {
  Comm* c = reinterpret_cast<Comm*>(comm);
  if (!c) return ncclInvalidArgument;
  c->aborted = true;
  std::fprintf(stderr, "zt-emu: ncclCommAbort on rank %d of %d (emulated NCCL)\n", c->rank, c->nranks);
  return ncclSuccess;
}
ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* e) {
  if (!comm) return ncclInvalidArgument;
  *e = reinterpret_cast<Comm*>(comm)->broken() ? ncclRemoteError : ncclSuccess;
  return ncclSuccess;
}
const char* ncclGetErrorString(ncclResult_t r) {
  return r == ncclSuccess ? "no error" : r == ncclRemoteError ? "remote process exited or there was a network error (emulated NCCL)"
                                                              : "error (emulated NCCL)";
}

ncclResult_t ncclAllReduce(const void* send, void* recv, size_t count, ncclDataType_t t, ncclRedOp_t op,
                           ncclComm_t comm, cudaStream_t stream) {
  Comm* c = usable(comm, stream);
  if (!c || !reducible(t, op)) return ncclInvalidArgument;
  const size_t b = count * type_bytes(t);
  std::vector<char> mine;
  return issue(
      "ncclAllReduce", c, stream, b,
      {{send, b, false, Where::device, "sendbuff"}, {recv, b, true, Where::device, "recvbuff"}},
      [&] { mine = bytes_of(send, b); }, [&](int) { return mine; }, [&] { return mine; }, everyone, b, recv,
      [recv, count, t](std::vector<std::vector<char>>& parts) { reduce_parts(recv, parts, count, t); });
}
ncclResult_t ncclReduceScatter(const void* send, void* recv, size_t recvcount, ncclDataType_t t, ncclRedOp_t op,
                               ncclComm_t comm, cudaStream_t stream) {
  Comm* c = usable(comm, stream);
  if (!c || !reducible(t, op)) return ncclInvalidArgument;
  const size_t b = recvcount * type_bytes(t), N = size_t(c->nranks);
  std::vector<char> all;
  // Part r of every rank's send buffer goes to rank r.
  auto part = [&](int r) { return std::vector<char>(all.begin() + long(b) * r, all.begin() + long(b) * (r + 1)); };
  return issue(
      "ncclReduceScatter", c, stream, b,
      {{send, b * N, false, Where::device, "sendbuff"}, {recv, b, true, Where::device, "recvbuff"}},
      [&] { all = bytes_of(send, b * N); }, part, [&] { return part(c->rank); }, everyone, b, recv,
      [recv, recvcount, t](std::vector<std::vector<char>>& parts) { reduce_parts(recv, parts, recvcount, t); });
}
ncclResult_t ncclAllGather(const void* send, void* recv, size_t sendcount, ncclDataType_t t, ncclComm_t comm,
                           cudaStream_t stream) {
  Comm* c = usable(comm, stream);
  if (!c) return ncclInvalidArgument;
  const size_t b = sendcount * type_bytes(t);
  std::vector<char> mine;
  return issue(
      "ncclAllGather", c, stream, b,
      {{send, b, false, Where::device, "sendbuff"},
       {recv, b * size_t(c->nranks), true, Where::device, "recvbuff"}},
      [&] { mine = bytes_of(send, b); }, [&](int) { return mine; }, [&] { return mine; }, everyone, b, recv,
      [recv, b](std::vector<std::vector<char>>& parts) {
        for (size_t r = 0; r < parts.size(); ++r) std::memcpy(static_cast<char*>(recv) + r * b, parts[r].data(), b);
      });
}

ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t* newcomm, ncclConfig_t*) {
  Comm* c = reinterpret_cast<Comm*>(comm);
  if (!c || c->aborted) return ncclInvalidArgument;
  *newcomm = nullptr;
  if (c->nranks == 1) {
    if (color != NCCL_SPLIT_NOCOLOR) *newcomm = reinterpret_cast<ncclComm_t>(new Comm{1, 0});
    return ncclSuccess;
  }
  MPI_Comm m = MPI_COMM_NULL;
  MPI_Comm_split(c->mpi, color == NCCL_SPLIT_NOCOLOR ? MPI_UNDEFINED : color, key, &m);
  if (m == MPI_COMM_NULL) return ncclSuccess;
  Comm* g = new Comm{};
  MPI_Comm_size(m, &g->nranks);
  MPI_Comm_rank(m, &g->rank);
  if (g->nranks > 1) g->join(m);
  else MPI_Comm_free(&m);
  *newcomm = reinterpret_cast<ncclComm_t>(g);
  return ncclSuccess;
}

namespace {
int g_group_depth = 0;
}
ncclResult_t ncclGroupStart() {
  ++g_group_depth;
  return ncclSuccess;
}
ncclResult_t ncclGroupEnd() {
  return g_group_depth-- > 0 ? ncclSuccess : ncclInvalidUsage;
}

ncclResult_t ncclSend(const void* send, size_t count, ncclDataType_t t, int peer, ncclComm_t comm, cudaStream_t stream) {
  Comm* c = usable(comm, stream);
  if (!c || peer < 0 || peer >= c->nranks || peer == c->rank || !type_bytes(t)) return ncclInvalidArgument;
  const size_t b = count * type_bytes(t);
  auto snd = std::make_unique<Send>();
  {
    OpScope scope(stream, "ncclSend (emulated NCCL, rank " + std::to_string(c->rank) + " to " + std::to_string(peer) +
                              ", " + std::to_string(b) + " bytes)",
                  {{send, b, false, Where::device, "sendbuff"}}, /*collective=*/true);
    snd->data = bytes_of(send, b);
  }
  const int tag = int(c->sent[size_t(peer)]++ % 32768);
  MPI_Isend(snd->data.data(), mpi_count(b), MPI_BYTE, peer, tag, c->p2p, &snd->req);
  g_sends.push_back(std::move(snd));
  return ncclSuccess;
}

ncclResult_t ncclRecv(void* recv, size_t count, ncclDataType_t t, int peer, ncclComm_t comm, cudaStream_t stream) {
  Comm* c = usable(comm, stream);
  if (!c || peer < 0 || peer >= c->nranks || peer == c->rank || !type_bytes(t)) return ncclInvalidArgument;
  const size_t b = count * type_bytes(t);
  {
    OpScope scope(stream, "ncclRecv (emulated NCCL, rank " + std::to_string(c->rank) + " from " +
                              std::to_string(peer) + ", " + std::to_string(b) + " bytes)",
                  {{recv, b, true, Where::device, "recvbuff"}}, /*collective=*/true);
  }
  const int tag = int(c->received[size_t(peer)]++ % 32768);
  defer(stream, [c, recv, b, peer, tag](bool block) {
    for (;;) {
      if (c->aborted) return true;
      progress_sends();
      int flag = 0, bytes = 0;
      MPI_Message msg;
      MPI_Status st;
      MPI_Improbe(peer, tag, c->p2p, &flag, &msg, &st);
      if (flag) {
        MPI_Get_count(&st, MPI_BYTE, &bytes);
        std::vector<char> data(static_cast<size_t>(bytes));
        MPI_Mrecv(data.data(), bytes, MPI_BYTE, &msg, MPI_STATUS_IGNORE);
        if (size_t(bytes) != b) fatal("emulated NCCL: ncclRecv of %zu bytes from rank %d got %d", b, peer, bytes);
        with_device_memory(recv, [&] { std::memcpy(recv, data.data(), b); });
        return true;
      }
      if (!block) return false;
      usleep(50);
    }
  });
  return ncclSuccess;
}

}  // extern "C"
