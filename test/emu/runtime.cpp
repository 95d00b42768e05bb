// The CUDA runtime, emulated on the CPU (see README.md): device memory, copies, streams and events
// with the ordering check, kernel launch, fibers for CUDA threads, warp collectives, tensor-core
// and async-copy instructions. Single OS thread: everything runs synchronously in issue order.
#include <cuda_runtime_api.h>
#include <execinfo.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "cuda_emu.h"
#include "emu_internal.h"

namespace zt_emu {

uint3 g_thread_idx, g_block_idx;
dim3 g_block_dim, g_grid_dim;

namespace {

constexpr size_t kPage = 4096;
constexpr size_t kHeapReserve = size_t(64) << 30;  // virtual; addresses are never reused
constexpr size_t kStackBytes = size_t(128) << 10;  // per CUDA thread (fiber), plus a guard page
constexpr int kMaxThreads = 1024;
constexpr size_t kDefaultSmemLimit = 48 * 1024;
constexpr size_t kOptinSmemLimit = 232448;  // sm_90: 227 KiB per block

std::string g_op = "host code";  // what is running, for fault messages
cudaError_t g_last_error = cudaSuccess;

// ---- messages ---------------------------------------------------------------------------------------
void vreport(const char* kind, const char* fmt, va_list ap) {
  std::fprintf(stderr, "\nzt-emu: %s: ", kind);
  std::vfprintf(stderr, fmt, ap);
  std::fprintf(stderr, "\n");
}

}  // namespace

void fatal(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vreport("ERROR (a GPU run would be wrong here)", fmt, ap);
  va_end(ap);
  std::fprintf(stderr, "zt-emu: while running: %s\n", g_op.c_str());
  void* bt[64];
  const int n = backtrace(bt, 64);
  backtrace_symbols_fd(bt, n, 2);
  std::fflush(stderr);
  std::abort();
}

void banner() {
  static bool done = false;
  if (done) return;
  done = true;
  if (!std::getenv("ZT_EMU_QUIET"))
    std::fprintf(stderr,
                 "zt-emu: CUDA runtime and cuBLASLt EMULATED on the CPU (test/emu): results check the CUDA "
                 "code's logic, not a GPU\n");
}

void set_last_error(cudaError_t e) {
  if (g_last_error == cudaSuccess) g_last_error = e;
}

// =====================================================================================================
// Device memory
// =====================================================================================================
namespace {

struct Alloc {
  uintptr_t span;     // first page of the mapping (guard page follows the last one)
  size_t span_bytes;  // pages holding the allocation (without the guard)
  uintptr_t ptr;      // what cudaMalloc returned (the allocation ends at the guard page)
  size_t bytes;       // requested size
  int open = 0;       // OpScopes / kernels currently allowed to touch it
  int slot = -1;      // its protection key's slot in g_keys (below), -1: none (PROT_NONE while closed)
  uint64_t last_open = 0;
};

// ---- opening allocations to the code allowed to touch them --------------------------------------------
// A closed allocation must fault when touched. mprotect'ing it PROT_NONE and back around every op
// walks its page table entries twice per launch: up to half the CPU time of an emulated run (the
// offload runs of emulated.offload_cuda). So the allocations opened most recently stay readable and
// writable, each tagged with a memory protection key of its own (pkeys(7), x86 PKU), and the key's
// access bit in this thread's PKRU register (a user-mode instruction, no system call) opens and
// closes it. Host code runs with every key's access disabled, and an op enables the keys of its own
// allocations only, so the same accesses fault as with PROT_NONE: host code touching any device
// allocation, an op touching one it was not given. The least recently opened closed allocation
// gives up its key when another needs one (mprotect, back to PROT_NONE). With no key to take (every
// key held by an allocation the current op has open, or a CPU or kernel without protection keys) an
// allocation is opened and closed with mprotect, as without keys. Other threads keep every key
// disabled (a new thread starts with its creator's PKRU, and the host threads start in host code),
// so host threads touching device memory fault even while an op runs, which PROT_NONE alone
// did not catch.
struct Keys {
  int n = 0;  // keys allocated at start-up (up to 15 on x86; 0 without PKU)
  int key[16];
  Alloc* holder[16] = {};  // allocation tagged with key[i], or nullptr
  uint64_t opens = 0;
};
Keys g_keys;

void alloc_keys() {
  while (g_keys.n < 16) {
    const int k = pkey_alloc(0, PKEY_DISABLE_ACCESS);
    if (k < 0) break;
    g_keys.key[g_keys.n++] = k;
  }
}

void set_prot(const Alloc& a, int prot, int key) {
  void* p = reinterpret_cast<void*>(a.span);
  if ((key < 0 ? mprotect(p, a.span_bytes, prot) : pkey_mprotect(p, a.span_bytes, prot, key)) != 0)
    fatal("mprotect of the device allocation [%p, +%zu bytes): %s", (void*)a.ptr, a.bytes, strerror(errno));
}

// Back to PROT_NONE without a key (key 0: merges with its neighbours' mappings again).
void drop_key(Alloc& a) {
  set_prot(a, PROT_NONE, 0);
  g_keys.holder[a.slot] = nullptr;
  a.slot = -1;
}

// Tags a (closed, keyless) with a free key, or the key of the least recently opened closed allocation.
bool take_key(Alloc& a) {
  int s = -1;
  for (int i = 0; i < g_keys.n; ++i) {
    const Alloc* h = g_keys.holder[i];
    if (!h) {
      s = i;
      break;
    }
    if (h->open == 0 && (s < 0 || h->last_open < g_keys.holder[s]->last_open)) s = i;
  }
  if (s < 0) return false;
  if (g_keys.holder[s]) drop_key(*g_keys.holder[s]);
  set_prot(a, PROT_READ | PROT_WRITE, g_keys.key[s]);
  g_keys.holder[s] = &a;
  a.slot = s;
  return true;
}

void open_alloc(Alloc& a) {
  a.last_open = ++g_keys.opens;
  if (a.open++ > 0) return;
  if (a.slot >= 0 || take_key(a)) pkey_set(g_keys.key[a.slot], 0);
  else set_prot(a, PROT_READ | PROT_WRITE, -1);
}

void close_alloc(Alloc& a) {
  if (--a.open > 0) return;
  if (a.slot >= 0) pkey_set(g_keys.key[a.slot], PKEY_DISABLE_ACCESS);
  else set_prot(a, PROT_NONE, -1);
}

struct Heap {
  unsigned char* base = nullptr;
  size_t top = 0;  // bump offset
  size_t used = 0;
  size_t capacity = 0;
  std::map<uintptr_t, Alloc> live;  // by ptr
  std::vector<std::pair<uintptr_t, uintptr_t>> freed;  // spans, for messages

  void init() {
    if (base) return;
    void* p = mmap(nullptr, kHeapReserve, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) fatal("cannot reserve %zu bytes of address space for device memory", kHeapReserve);
    base = static_cast<unsigned char*>(p);
    const char* mb = std::getenv("ZT_EMU_MEM_MB");
    capacity = size_t(mb ? std::atoll(mb) : 16384) << 20;
    alloc_keys();
  }
  bool contains(uintptr_t a) const { return base && a >= uintptr_t(base) && a < uintptr_t(base) + kHeapReserve; }
  // Live allocation whose [ptr, ptr + bytes] holds a (one past the end included), or nullptr.
  Alloc* find(uintptr_t a) {
    auto it = live.upper_bound(a);
    if (it == live.begin()) return nullptr;
    --it;
    Alloc& al = it->second;
    return a <= al.ptr + al.bytes ? &al : nullptr;
  }
  // Any live allocation whose pages hold a (for fault messages).
  Alloc* find_span(uintptr_t a) {
    for (auto& [p, al] : live)
      if (a >= al.span && a < al.span + al.span_bytes + kPage) return &al;
    return nullptr;
  }
};
Heap g_heap;

std::string describe_addr(uintptr_t a) {
  char buf[256];
  if (Alloc* al = g_heap.find_span(a)) {
    if (a >= al->ptr && a < al->ptr + al->bytes)
      std::snprintf(buf, sizeof buf, "inside the device allocation [%p, +%zu bytes) at offset %zu", (void*)al->ptr,
                    al->bytes, size_t(a - al->ptr));
    else if (a >= al->ptr + al->bytes)
      std::snprintf(buf, sizeof buf, "%zu bytes past the end of the device allocation [%p, +%zu bytes)",
                    size_t(a - al->ptr - al->bytes), (void*)al->ptr, al->bytes);
    else
      std::snprintf(buf, sizeof buf, "%zu bytes before the device allocation [%p, +%zu bytes)", size_t(al->ptr - a),
                    (void*)al->ptr, al->bytes);
    return buf;
  }
  for (auto& [s, e] : g_heap.freed)
    if (a >= s && a < e) return "in device memory that was freed (cudaFree)";
  return "in device address space outside every allocation";
}

// ---- fault handler: host code touching device memory, kernels leaving their allocations -------------
uintptr_t g_stacks = 0;  // fiber stacks, for overflow messages
size_t g_stacks_bytes = 0;
thread_local bool g_in_kernel = false;  // on the thread running the kernel: others are host code

void on_segv(int sig, siginfo_t* si, void*) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(si->si_addr);
  char msg[1024];
  if (g_heap.contains(a)) {
    if (g_in_kernel)
      std::snprintf(msg, sizeof msg,
                    "%s touched device memory at %p, %s, which is not an allocation passed to it as an argument "
                    "(out of bounds, or a stale pointer)",
                    g_op.c_str(), (void*)a, describe_addr(a).c_str());
    else
      std::snprintf(msg, sizeof msg,
                    "host code dereferenced device memory at %p (%s): on a GPU this address is not readable by the "
                    "CPU; copy it with cudaMemcpy (device::copy_to_host) first",
                    (void*)a, describe_addr(a).c_str());
  } else if (g_stacks && a >= g_stacks && a < g_stacks + g_stacks_bytes) {
    std::snprintf(msg, sizeof msg, "stack overflow of a CUDA thread (fiber) in %s (raise kStackBytes)", g_op.c_str());
  } else {
    signal(sig, SIG_DFL);
    return;  // re-executes the access: an ordinary crash
  }
  const char head[] = "\nzt-emu: ERROR (a GPU run would be wrong here): ";
  (void)!write(2, head, sizeof head - 1);
  (void)!write(2, msg, strlen(msg));
  (void)!write(2, "\n", 1);
  void* bt[64];
  const int n = backtrace(bt, 64);
  backtrace_symbols_fd(bt, n, 2);
  signal(SIGABRT, SIG_DFL);
  abort();
}

void install_handler() {
  static bool done = false;
  if (done) return;
  done = true;
  static std::vector<char> alt(1 << 16);
  stack_t ss{};
  ss.ss_sp = alt.data();
  ss.ss_size = alt.size();
  sigaltstack(&ss, nullptr);
  struct sigaction sa {};
  sa.sa_sigaction = on_segv;
  sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
  sigaction(SIGSEGV, &sa, nullptr);
  sigaction(SIGBUS, &sa, nullptr);
}

void init() {
  banner();
  g_heap.init();
  install_handler();
}

}  // namespace

bool is_device_ptr(const void* p) { return g_heap.contains(reinterpret_cast<uintptr_t>(p)); }
size_t bytes_to_alloc_end(const void* p) {
  Alloc* a = g_heap.find(reinterpret_cast<uintptr_t>(p));
  return a ? a->ptr + a->bytes - reinterpret_cast<uintptr_t>(p) : 0;
}

// =====================================================================================================
// Streams, events, and the ordering check (vector clocks)
// =====================================================================================================
namespace {

using Clock = std::vector<uint64_t>;  // per stream id: the last op of that stream known to be complete

void merge(Clock& into, const Clock& from) {
  if (into.size() < from.size()) into.resize(from.size(), 0);
  for (size_t i = 0; i < from.size(); ++i) into[i] = std::max(into[i], from[i]);
}
uint64_t at(const Clock& c, int i) { return size_t(i) < c.size() ? c[size_t(i)] : 0; }

struct Deferred {  // work the stream reached that completes later (emu_internal.h: defer)
  uint64_t id;
  std::function<bool(bool)> done;
};
struct Stream {
  int id;
  bool blocking;  // synchronises with the legacy default stream
  bool alive = true;
  Clock vc;
  uint64_t ops = 0;
  std::string last_op;
  std::deque<Deferred> deferred;  // in stream order
};
struct Event {
  Clock vc;
  bool recorded = false;
  bool timing = true;
  double t = 0;
  int stream = -1;
  uint64_t deferred_upto = 0;  // the stream's deferred work up to this id precedes the event
};
uint64_t g_deferred_ids = 0;

std::deque<Stream> g_streams;  // id 0: the legacy default stream
Clock g_host;                   // what the host has waited for
std::map<uintptr_t, Stream*> g_stream_handles;

// How far an access is known: exactly (copies, GEMMs, sorts, collectives), or from a kernel's pointer
// argument to the end of its allocation (the kernel's extent is unknown).
enum class Extent : uint8_t { exact, from_pointer };
struct Record {
  uintptr_t lo, hi;
  int stream;
  uint64_t seq;
  bool write;
  std::string op;
  Extent extent;
};

// Whether access [lo, hi) of extent `e` meets record r. A kernel's pointer argument against an exact
// range (a collective, a copy) meets it only where that range holds the pointer: the engine carves
// slots and unit ranges of one allocation (bucket staging, reduce-scatter receive, gathered units,
// the gradient shard) and a collective or copy works on part k + 1 while kernels use part k; to the
// end of the allocation, every such pair would be reported. A kernel that starts before an exact
// range and runs into it is not seen here (README, "What it cannot imitate").
bool meets(const Record& r, uintptr_t lo, uintptr_t hi, Extent e) {
  if (r.hi <= lo || r.lo >= hi) return false;
  if (e == Extent::from_pointer && r.extent == Extent::exact) return r.lo <= lo && lo < r.hi;
  if (e == Extent::exact && r.extent == Extent::from_pointer) return lo <= r.lo && r.lo < hi;
  return true;
}
std::vector<Record> g_records;

Stream& legacy() {
  if (g_streams.empty()) g_streams.push_back(Stream{0, true});
  return g_streams.front();
}

Stream* lookup(cudaStream_t s) {
  if (s == nullptr) return &legacy();
  auto it = g_stream_handles.find(reinterpret_cast<uintptr_t>(s));
  if (it == g_stream_handles.end() || !it->second->alive) return nullptr;
  return it->second;
}

const char* stream_name(int id) {
  static char buf[8][48];
  static int k = 0;
  char* b = buf[k++ % 8];
  if (id == 0) std::snprintf(b, 48, "the legacy default stream");
  else std::snprintf(b, 48, "stream #%d", id);
  return b;
}

// Finishes st's deferred work with ids <= upto, in order; block: until it is done. True when done.
bool finish_deferred(Stream& st, uint64_t upto, bool block) {
  while (!st.deferred.empty() && st.deferred.front().id <= upto) {
    if (!st.deferred.front().done(block)) return false;
    st.deferred.pop_front();
  }
  return true;
}

// Issues one op on stream st: returns its sequence number after ordering it behind what it waits for.
// Other work than collectives and event records first waits for the stream's deferred work.
uint64_t issue(Stream& st, const std::string& what, bool after_deferred = true) {
  if (after_deferred) finish_deferred(st, UINT64_MAX, true);
  merge(st.vc, g_host);
  if (st.id == 0) {
    for (Stream& o : g_streams)
      if (o.alive && o.blocking && o.id != 0) merge(st.vc, o.vc);
  } else if (st.blocking) {
    merge(st.vc, legacy().vc);
  }
  if (st.vc.size() <= size_t(st.id)) st.vc.resize(size_t(st.id) + 1, 0);
  st.last_op = what;
  return ++st.vc[size_t(st.id)];
}

bool g_check_order = [] {
  const char* e = std::getenv("ZT_EMU_NO_ORDER_CHECK");
  return !(e && *e && *e != '0');
}();

void check_and_record(Stream& st, uint64_t seq, uintptr_t lo, uintptr_t hi, bool write, const std::string& op,
                      const char* what, Extent extent) {
  if (lo >= hi) return;
  for (const Record& r : g_records) {
    if (!meets(r, lo, hi, extent) || r.stream == st.id) continue;
    if (!write && !r.write) continue;
    if (at(st.vc, r.stream) >= r.seq) continue;
    if (!g_check_order) continue;
    fatal("unordered use of memory across streams: %s on %s %s [%p, +%zu bytes) (%s), which %s on %s %s "
          "[%p, +%zu bytes) and nothing orders the two (no cudaEventRecord on %s followed by cudaStreamWaitEvent "
          "on %s, and no synchronisation of %s by the host in between). On a GPU the two may run at the same time.",
          op.c_str(), stream_name(st.id), write ? "writes" : "reads", (void*)lo, size_t(hi - lo), what,
          r.op.c_str(), stream_name(r.stream), r.write ? "writes" : "reads", (void*)r.lo, size_t(r.hi - r.lo),
          stream_name(r.stream), stream_name(st.id), stream_name(r.stream));
  }
  // Drop what this access supersedes: same-stream records inside the range (a write supersedes
  // reads and writes, a read other reads), and records of other streams already ordered before it
  // when this is a write.
  g_records.erase(std::remove_if(g_records.begin(), g_records.end(),
                                 [&](const Record& r) {
                                   if (r.lo < lo || r.hi > hi) return false;
                                   if (r.stream == st.id) return write || !r.write;
                                   return write && at(st.vc, r.stream) >= r.seq;
                                 }),
                  g_records.end());
  g_records.push_back(Record{lo, hi, st.id, seq, write, op, extent});
}

void forget_range(uintptr_t lo, uintptr_t hi) {
  g_records.erase(std::remove_if(g_records.begin(), g_records.end(),
                                 [&](const Record& r) { return r.lo >= lo && r.hi <= hi; }),
                  g_records.end());
}

void host_waits_for(const Clock& c) { merge(g_host, c); }
void host_waits_all() {
  for (Stream& s : g_streams) merge(g_host, s.vc);
}

}  // namespace

bool valid_stream(cudaStream_t s) { return lookup(s) != nullptr; }

void defer(cudaStream_t stream, std::function<bool(bool)> done) {
  Stream* st = lookup(stream);
  if (!st) fatal("deferred work on an invalid or destroyed stream %p", (void*)stream);
  st->deferred.push_back(Deferred{++g_deferred_ids, std::move(done)});
}

void with_device_memory(const void* ptr, const std::function<void()>& fn) {
  Alloc* a = g_heap.find(reinterpret_cast<uintptr_t>(ptr));
  if (!a) fatal("deferred write to %p, which is not live device memory", ptr);
  open_alloc(*a);
  fn();
  close_alloc(*a);
}

// ---- OpScope ------------------------------------------------------------------------------------------
OpScope::OpScope(cudaStream_t stream, const std::string& what, std::initializer_list<Range> ranges, bool collective) {
  init();
  Stream* st = lookup(stream);
  if (!st) fatal("%s on an invalid or destroyed stream %p", what.c_str(), (void*)stream);
  const uint64_t seq = issue(*st, what, !collective);
  for (const Range& r : ranges) {
    if (r.ptr == nullptr) {
      if (r.bytes == 0) continue;
      fatal("%s: %s is a null pointer", what.c_str(), r.what);
    }
    const uintptr_t lo = reinterpret_cast<uintptr_t>(r.ptr);
    const bool dev = g_heap.contains(lo);
    if (r.where == Where::device && !dev)
      fatal("%s: %s (%p) is not device memory (a host pointer where the call needs a cudaMalloc'd one)",
            what.c_str(), r.what, r.ptr);
    if (r.where == Where::host && dev)
      fatal("%s: %s (%p) is device memory, %s, where the call needs host memory (wrong cudaMemcpyKind?)",
            what.c_str(), r.what, r.ptr, describe_addr(lo).c_str());
    size_t bytes = r.bytes;
    if (dev) {
      Alloc* a = g_heap.find(lo);
      if (!a) fatal("%s: %s (%p) is %s", what.c_str(), r.what, r.ptr, describe_addr(lo).c_str());
      const size_t room = a->ptr + a->bytes - lo;
      if (bytes == SIZE_MAX) bytes = room;
      if (bytes > room)
        fatal("%s: %s [%p, +%zu bytes) runs %zu bytes past the end of its allocation [%p, +%zu bytes)",
              what.c_str(), r.what, r.ptr, bytes, bytes - room, (void*)a->ptr, a->bytes);
      bool seen = false;
      for (int i = 0; i < nopen_; ++i) seen |= open_[i] == a->ptr;
      if (!seen) {
        if (nopen_ == 16) fatal("%s: more than 16 allocations in one operation", what.c_str());
        open_[nopen_++] = a->ptr;
        open_alloc(*a);
      }
    }
    check_and_record(*st, seq, lo, lo + bytes, r.write, what, r.what, Extent::exact);
  }
  g_op = what;
}

OpScope::~OpScope() {
  for (int i = 0; i < nopen_; ++i) {
    auto it = g_heap.live.find(open_[i]);
    if (it != g_heap.live.end()) close_alloc(it->second);
  }
  g_op = "host code";
}

// =====================================================================================================
// Fibers (one per CUDA thread of a block) and the block scheduler
// =====================================================================================================
namespace {

extern "C" void zt_emu_switch(void** save_sp, void* to_sp);
// Saves the callee-saved registers on the current stack, stores the stack pointer in *save_sp, loads
// to_sp, restores the same from there and returns into that fiber. (MXCSR and the x87 control word
// are not switched: kernel code never changes them, and all fibers start with the launcher's.)
asm(R"(
.text
.globl zt_emu_switch
.type zt_emu_switch,@function
zt_emu_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
.size zt_emu_switch, .-zt_emu_switch
)");

struct CpCopy {
  void* dst;
  const void* src;
  int bytes;
  bool valid;
};

enum Wait { kNone, kBlock, kWarp };

struct Fiber {
  void* sp = nullptr;
  uint3 idx;
  int tid = 0, warp = 0, lane = 0;
  bool done = false;
  Wait wait = kNone;
  uint64_t wait_gen = 0;
  int xphase = 0;
  std::vector<CpCopy> cp_open;
  std::deque<std::vector<CpCopy>> cp_groups;
};

struct WarpState {
  int size = 0, live = 0, arrived = 0;
  uint64_t gen = 0;
  const char* pending = nullptr;  // the collective the arrived lanes are at
  alignas(16) unsigned char slots[2][32][32];
};

struct BlockState {
  int live = 0, arrived = 0;
  uint64_t gen = 0;
};

std::vector<Fiber> g_fibers;
std::vector<WarpState> g_warps;
BlockState g_block;
Fiber* g_cur = nullptr;
int g_live_fibers = 0;
void* g_sched_sp = nullptr;
void (*g_body)(void*) = nullptr;
void* g_body_ctx = nullptr;
std::vector<unsigned char> g_smem_store;
unsigned char* g_smem = nullptr;
size_t g_smem_bytes = 0;
std::map<const void*, int> g_max_dyn_smem;  // cudaFuncSetAttribute

unsigned char* stacks() {
  if (!g_stacks) {
    g_stacks_bytes = size_t(kMaxThreads) * (kStackBytes + kPage);
    void* p = mmap(nullptr, g_stacks_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1,
                   0);
    if (p == MAP_FAILED) fatal("cannot map fiber stacks");
    g_stacks = reinterpret_cast<uintptr_t>(p);
    for (int i = 0; i < kMaxThreads; ++i)  // guard page at the low end of every stack
      mprotect(reinterpret_cast<void*>(g_stacks + size_t(i) * (kStackBytes + kPage)), kPage, PROT_NONE);
  }
  return reinterpret_cast<unsigned char*>(g_stacks);
}

void release(uint64_t& gen, int& arrived) {
  arrived = 0;
  ++gen;
}

bool runnable(const Fiber& f) {
  if (f.done) return false;
  if (f.wait == kBlock) return g_block.gen != f.wait_gen;
  if (f.wait == kWarp) return g_warps[size_t(f.warp)].gen != f.wait_gen;
  return true;
}

// Leaves the current fiber (waiting at a barrier, or done) for the next runnable one in block
// order, directly (one switch); back to the scheduler when every fiber is done. No runnable fiber
// while some wait: a deadlock.
void switch_away() {
  Fiber* f = g_cur;
  const int n = int(g_fibers.size());
  if (f->wait == kWarp) {  // fast path: the next lane of the same warp that can go on
    const int base = f->tid - f->lane, size = g_warps[size_t(f->warp)].size;
    for (int i = 1; i < size; ++i) {
      Fiber& next = g_fibers[size_t(base + (f->lane + i) % size)];
      if (!runnable(next)) continue;
      next.wait = kNone;
      g_cur = &next;
      g_thread_idx = next.idx;
      zt_emu_switch(&f->sp, next.sp);
      return;
    }
  }
  for (int i = 1; i <= n; ++i) {
    Fiber& next = g_fibers[size_t((f->tid + i) % n)];
    if (&next == f && !runnable(next)) break;
    if (!runnable(next)) continue;
    if (&next == f) return;  // only this one can go on (its barrier was released meanwhile)
    next.wait = kNone;
    g_cur = &next;
    g_thread_idx = next.idx;
    zt_emu_switch(&f->sp, next.sp);
    return;  // resumed: someone switched back to f because it is runnable
  }
  if (g_live_fibers == 0) {
    zt_emu_switch(&f->sp, g_sched_sp);
    return;
  }
  int at_block = 0, at_warp = 0;
  for (Fiber& x : g_fibers) at_block += !x.done && x.wait == kBlock, at_warp += !x.done && x.wait == kWarp;
  fatal("deadlock in block (%u,%u,%u): %d threads wait at __syncthreads, %d at a warp-collective "
        "instruction, and no thread can move (a barrier inside a branch not taken by every thread?)",
        g_block_idx.x, g_block_idx.y, g_block_idx.z, at_block, at_warp);
}

[[noreturn]] void fiber_exit() {
  Fiber* f = g_cur;
  f->done = true;  // cp.async copies still queued are dropped: no thread of the block can wait for them
  f->wait = kNone;
  --g_live_fibers;
  BlockState& b = g_block;
  WarpState& w = g_warps[size_t(f->warp)];
  --b.live;
  --w.live;
  if (b.arrived > 0 && b.arrived >= b.live) release(b.gen, b.arrived);
  if (w.arrived > 0 && w.arrived >= w.live) {
    w.pending = nullptr;
    release(w.gen, w.arrived);
  }
  switch_away();
  __builtin_unreachable();
}

void fiber_entry() {
  g_body(g_body_ctx);
  fiber_exit();
}

void yield_to_scheduler() { switch_away(); }

void init_fiber(Fiber& f, int i) {
  unsigned char* top = stacks() + size_t(i + 1) * (kStackBytes + kPage);
  uint64_t* sp = reinterpret_cast<uint64_t*>(top);
  *--sp = 0;                                             // fake return address of fiber_entry
  *--sp = reinterpret_cast<uint64_t>(&fiber_entry);      // popped by `ret`
  for (int r = 0; r < 6; ++r) *--sp = 0;                 // rbp rbx r12 r13 r14 r15
  f.sp = sp;
}

void run_block(int nthreads) {
  const dim3 bd = g_block_dim;
  g_block = BlockState{nthreads, 0, 0};
  const int nwarps = (nthreads + 31) / 32;
  g_warps.resize(size_t(nwarps));
  for (int w = 0; w < nwarps; ++w) {
    WarpState& ws = g_warps[size_t(w)];
    ws.size = std::min(32, nthreads - 32 * w);
    ws.live = ws.size;
    ws.arrived = 0;
    ws.gen = 0;
    ws.pending = nullptr;
  }
  g_fibers.resize(size_t(nthreads));
  for (int t = 0; t < nthreads; ++t) {
    Fiber& f = g_fibers[size_t(t)];
    f.idx = uint3{unsigned(t) % bd.x, (unsigned(t) / bd.x) % bd.y, unsigned(t) / (bd.x * bd.y)};
    f.tid = t;
    f.warp = t / 32;
    f.lane = t % 32;
    f.done = false;
    f.wait = kNone;
    f.xphase = 0;
    f.cp_open.clear();
    f.cp_groups.clear();
    init_fiber(f, t);
  }
  if (g_smem_bytes) std::memset(g_smem, 0xFF, g_smem_bytes);  // shared memory starts as garbage
  g_live_fibers = nthreads;
  Fiber& first = g_fibers[0];
  g_cur = &first;
  g_thread_idx = first.idx;
  zt_emu_switch(&g_sched_sp, first.sp);  // returns when every fiber of the block is done
  g_cur = nullptr;
}

void warp_barrier(const char* what) {
  Fiber* f = g_cur;
  WarpState& w = g_warps[size_t(f->warp)];
  if (w.arrived == 0) w.pending = what;
  else if (w.pending != what && std::strcmp(w.pending, what) != 0)
    fatal("divergent warp: lanes of warp %d reached different warp-collective instructions (%s and %s)", f->warp,
          w.pending, what);
  if (++w.arrived >= w.live) {
    w.pending = nullptr;
    release(w.gen, w.arrived);
    return;
  }
  f->wait = kWarp;
  f->wait_gen = w.gen;
  yield_to_scheduler();
}

}  // namespace

unsigned char* dynamic_smem() { return g_smem; }
size_t dynamic_smem_bytes() { return g_smem_bytes; }

void device_fault(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  char buf[1024];
  std::vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  fatal("%s (thread (%u,%u,%u) of block (%u,%u,%u))", buf, g_thread_idx.x, g_thread_idx.y, g_thread_idx.z,
        g_block_idx.x, g_block_idx.y, g_block_idx.z);
}

void syncthreads() {
  if (!g_cur) fatal("__syncthreads outside a kernel");
  Fiber* f = g_cur;
  if (++g_block.arrived >= g_block.live) {
    release(g_block.gen, g_block.arrived);
    return;
  }
  f->wait = kBlock;
  f->wait_gen = g_block.gen;
  yield_to_scheduler();
}

void syncwarp(unsigned mask) {
  if (!g_cur) fatal("__syncwarp outside a kernel");
  if (mask != 0xffffffffu) device_fault("__syncwarp with a partial mask (0x%08x) is not emulated", mask);
  warp_barrier("__syncwarp");
}

const unsigned char* warp_allgather(const void* mine, size_t bytes, unsigned mask, const char* what) {
  if (!g_cur) fatal("%s outside a kernel", what);
  Fiber* f = g_cur;
  WarpState& w = g_warps[size_t(f->warp)];
  if (mask != 0xffffffffu) device_fault("%s with a partial mask (0x%08x) is not emulated", what, mask);
  if (w.size != 32 || w.live != 32)
    device_fault("%s needs all 32 lanes of the warp (warp %d has %d threads, %d still running): undefined on a GPU",
                 what, f->warp, w.size, w.live);
  const int ph = f->xphase;
  f->xphase ^= 1;
  std::memcpy(w.slots[ph][f->lane], mine, bytes);
  warp_barrier(what);
  return &w.slots[ph][0][0];
}

// ---- tensor cores: mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 ------------------------------
// PTX ISA fragment layouts (g = lane / 4, q = lane % 4; the lower 16 bits of a register hold the
// lower column / k index):
//   A (16x16, row): a0 = A[g][2q, 2q+1]  a1 = A[g+8][2q, 2q+1]  a2 = A[g][2q+8, +9]  a3 = A[g+8][2q+8, +9]
//   B (16x8, col):  b0 = B[2q, 2q+1][g]  b1 = B[2q+8, 2q+9][g]
//   C/D (16x8):     d0, d1 = D[g][2q, 2q+1]   d2, d3 = D[g+8][2q, 2q+1]
// The products of bf16 values are exact in fp32; the sum is done here in fp32, k in order (the
// hardware's internal accumulation order and precision are not specified: see README).
namespace {
float bf16_half(uint32_t reg, int hi) {
  const uint32_t bits = hi ? (reg & 0xFFFF0000u) : (reg << 16);
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}
}  // namespace

void mma_m16n8k16_bf16_f32(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  struct Frag {
    uint32_t a[4], b[2];
  } mine{{a[0], a[1], a[2], a[3]}, {b0, b1}};
  const unsigned char* s = warp_allgather(&mine, sizeof mine, 0xffffffffu, "mma.sync.m16n8k16");
  auto frag = [&](int lane) -> const Frag& { return *reinterpret_cast<const Frag*>(s + 32 * lane); };
  auto A = [&](int r, int k) {
    const Frag& f = frag((r % 8) * 4 + (k % 8) / 2);
    return bf16_half(f.a[(r >= 8 ? 1 : 0) + (k >= 8 ? 2 : 0)], k % 2);
  };
  auto B = [&](int k, int n) {
    const Frag& f = frag(n * 4 + (k % 8) / 2);
    return bf16_half(f.b[k >= 8 ? 1 : 0], k % 2);
  };
  const int lane = g_cur->lane, g = lane / 4, q = lane % 4;
  for (int e = 0; e < 4; ++e) {
    const int r = g + 8 * (e >> 1), n = 2 * q + (e & 1);
    float acc = d[e];
    for (int k = 0; k < 16; ++k) acc = std::fmaf(A(r, k), B(k, n), acc);
    d[e] = acc;
  }
}

// ---- ldmatrix.sync.aligned.m8n8.x4(.trans).shared.b16 -----------------------------------------------
// Lane l gives the address of row l % 8 of matrix l / 8 (16 bytes, 16-byte aligned, shared memory).
// Register i of lane l: elements (row l / 4, columns 2 (l % 4), +1) of matrix i; with .trans,
// elements (rows 2 (l % 4), +1, column l / 4).
void ldmatrix_x4(uint32_t (&r)[4], const void* row, bool trans) {
  const char* what = trans ? "ldmatrix.x4.trans" : "ldmatrix.x4";
  const uintptr_t p = reinterpret_cast<uintptr_t>(row);
  if (p % 16) device_fault("%s: row address %p is not 16-byte aligned", what, row);
  if (p < uintptr_t(g_smem) || p + 16 > uintptr_t(g_smem) + g_smem_bytes)
    device_fault("%s: row address %p is not inside the block's dynamic shared memory [%p, +%zu)", what, row,
                 (void*)g_smem, g_smem_bytes);
  const unsigned char* s = warp_allgather(&row, sizeof row, 0xffffffffu, what);
  auto addr = [&](int lane) { return *reinterpret_cast<const uint16_t* const*>(s + 32 * lane); };
  const int l = g_cur->lane;
  for (int i = 0; i < 4; ++i) {
    uint16_t lo, hi;
    if (!trans) {
      const uint16_t* rp = addr(8 * i + l / 4);
      lo = rp[2 * (l % 4)];
      hi = rp[2 * (l % 4) + 1];
    } else {
      lo = addr(8 * i + 2 * (l % 4))[l / 4];
      hi = addr(8 * i + 2 * (l % 4) + 1)[l / 4];
    }
    r[i] = uint32_t(lo) | (uint32_t(hi) << 16);
  }
}

// ---- cp.async: the copy is only performed when a wait_group covering it completes ------------------
void cp_async(void* dst, const void* src, int bytes, bool valid) {
  const uintptr_t d = reinterpret_cast<uintptr_t>(dst), s = reinterpret_cast<uintptr_t>(src);
  if (d % unsigned(bytes) || s % unsigned(bytes))
    device_fault("cp.async of %d bytes: dst %p / src %p not %d-byte aligned", bytes, dst, src, bytes);
  if (d < uintptr_t(g_smem) || d + unsigned(bytes) > uintptr_t(g_smem) + g_smem_bytes)
    device_fault("cp.async: dst %p is not inside the block's dynamic shared memory", dst);
  if (valid && !g_heap.find(s)) device_fault("cp.async: src %p is not device memory (%s)", src, describe_addr(s).c_str());
  g_cur->cp_open.push_back(CpCopy{dst, src, bytes, valid});
}
void cp_async_commit() {
  g_cur->cp_groups.push_back(std::move(g_cur->cp_open));
  g_cur->cp_open.clear();
}
void cp_async_wait_group(int n) {
  auto& groups = g_cur->cp_groups;
  while (int(groups.size()) > n) {
    for (const CpCopy& c : groups.front()) {
      if (c.valid) std::memcpy(c.dst, c.src, size_t(c.bytes));
      else std::memset(c.dst, 0, size_t(c.bytes));
    }
    groups.pop_front();
  }
}

// ---- launch ---------------------------------------------------------------------------------------------
void launch(const void* kernel, const LaunchCfg& cfg, const Access* acc, size_t nacc, void (*body)(void*),
            void* ctx) {
  init();
  const dim3 g = cfg.grid, b = cfg.block;
  const unsigned long long threads = 1ull * b.x * b.y * b.z;
  auto bad = [&](const char* why) {
    std::fprintf(stderr, "zt-emu: launch of %s <<<(%u,%u,%u), (%u,%u,%u), %zu>>> refused: %s\n", cfg.name, g.x, g.y,
                 g.z, b.x, b.y, b.z, cfg.smem, why);
    set_last_error(cudaErrorInvalidConfiguration);
  };
  if (threads == 0 || threads > 1024 || b.x > 1024 || b.y > 1024 || b.z > 64)
    return bad("block shape (at most 1024 threads; x, y <= 1024, z <= 64)");
  if (g.x == 0 || g.y == 0 || g.z == 0 || g.x > 2147483647u || g.y > 65535 || g.z > 65535)
    return bad("grid shape (x < 2^31, y and z <= 65535, none 0)");
  size_t limit = kDefaultSmemLimit;
  auto it = g_max_dyn_smem.find(kernel);
  if (it != g_max_dyn_smem.end()) limit = size_t(it->second);
  if (cfg.smem > limit) {
    std::fprintf(stderr, "zt-emu: %zu bytes of dynamic shared memory > %zu allowed for this kernel\n", cfg.smem, limit);
    set_last_error(cudaErrorInvalidValue);
    return;
  }
  if (!valid_stream(cfg.stream)) {
    std::fprintf(stderr, "zt-emu: launch of %s on an invalid stream\n", cfg.name);
    set_last_error(cudaErrorInvalidResourceHandle);
    return;
  }
  std::string what = std::string("kernel ") + cfg.name;
  Stream& st = *lookup(cfg.stream);
  const uint64_t seq = issue(st, what);
  std::vector<Alloc*> opened;
  for (size_t i = 0; i < nacc; ++i) {
    const uintptr_t p = reinterpret_cast<uintptr_t>(acc[i].ptr);
    Alloc* a = g_heap.find(p);
    if (!a) {
      if (g_heap.contains(p))
        fatal("%s: pointer argument %zu (%p) is %s", what.c_str(), i, acc[i].ptr, describe_addr(p).c_str());
      fatal("%s: pointer argument %zu (%p) is a host pointer: a kernel can only use device memory", what.c_str(), i,
            acc[i].ptr);
    }
    check_and_record(st, seq, p, a->ptr + a->bytes, acc[i].write, what,
                     "a pointer argument (to the end of its allocation)", Extent::from_pointer);
    if (std::find(opened.begin(), opened.end(), a) == opened.end()) {
      open_alloc(*a);
      opened.push_back(a);
    }
  }
  // Dynamic shared memory: one buffer, 128-byte aligned, reused block after block.
  g_smem_bytes = cfg.smem;
  if (g_smem_store.size() < cfg.smem + 128) g_smem_store.resize(cfg.smem + 128);
  g_smem = reinterpret_cast<unsigned char*>((reinterpret_cast<uintptr_t>(g_smem_store.data()) + 127) / 128 * 128);
  g_block_dim = b;
  g_grid_dim = g;
  g_body = body;
  g_body_ctx = ctx;
  g_op = what;
  g_in_kernel = true;
  for (unsigned z = 0; z < g.z; ++z)
    for (unsigned y = 0; y < g.y; ++y)
      for (unsigned x = 0; x < g.x; ++x) {
        g_block_idx = uint3{x, y, z};
        run_block(int(threads));
      }
  g_in_kernel = false;
  g_op = "host code";
  for (Alloc* a : opened) close_alloc(*a);
}

}  // namespace zt_emu

// =====================================================================================================
// The CUDA runtime API (the subset the backend and the tests call)
// =====================================================================================================
using namespace zt_emu;

namespace {
cudaError_t fail(cudaError_t e) {
  set_last_error(e);
  return e;
}
double now_ms() {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
bool no_device() {
  const char* e = std::getenv("ZT_EMU_NO_DEVICE");
  return e && *e && *e != '0';
}
// Devices this process sees: ZT_EMU_DEVICES (default 1), as a host with that many GPUs would show
// them. They are one emulated device whatever its index: each process has its own memory, so ranks
// on "different GPUs" (multi-rank NCCL, nccl.cpp) are as separate as on a real host.
int device_count() {
  if (no_device()) return 0;
  const char* e = std::getenv("ZT_EMU_DEVICES");
  const int n = e && *e ? std::atoi(e) : 1;
  if (n < 1 || n > 64) fatal("ZT_EMU_DEVICES=%s: expected 1 to 64 devices", e);
  return n;
}
int g_device = 0;  // cudaSetDevice's
bool valid_device(int device) { return device >= 0 && device < device_count(); }
}  // namespace

extern "C" {

cudaError_t cudaGetDeviceCount(int* count) {
  init();
  if (no_device()) {
    *count = 0;
    return fail(cudaErrorNoDevice);
  }
  *count = device_count();
  return cudaSuccess;
}
cudaError_t cudaSetDevice(int device) {
  init();
  if (!valid_device(device)) return fail(cudaErrorInvalidDevice);
  g_device = device;
  return cudaSuccess;
}
cudaError_t cudaGetDevice(int* device) {
  *device = g_device;
  return cudaSuccess;
}
cudaError_t cudaGetDeviceProperties(cudaDeviceProp* p, int device) {
  init();
  if (!valid_device(device)) return fail(cudaErrorInvalidDevice);
  std::memset(p, 0, sizeof *p);
  std::snprintf(p->name, sizeof p->name, "zt-emu (CUDA emulated on the CPU, not a GPU)");
  p->major = 9;
  p->minor = 0;
  p->multiProcessorCount = 4;
  p->totalGlobalMem = g_heap.capacity;
  p->warpSize = 32;
  p->maxThreadsPerBlock = 1024;
  p->sharedMemPerBlock = kDefaultSmemLimit;
  p->sharedMemPerBlockOptin = kOptinSmemLimit;
  return cudaSuccess;
}
cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device) {
  init();
  if (!valid_device(device)) return fail(cudaErrorInvalidDevice);
  switch (attr) {
    case cudaDevAttrMultiProcessorCount: *value = 4; return cudaSuccess;
    case cudaDevAttrMaxSharedMemoryPerBlockOptin: *value = int(kOptinSmemLimit); return cudaSuccess;
    case cudaDevAttrComputeCapabilityMajor: *value = 9; return cudaSuccess;
    case cudaDevAttrComputeCapabilityMinor: *value = 0; return cudaSuccess;
    default:
      std::fprintf(stderr, "zt-emu: cudaDeviceGetAttribute(%d) is not emulated\n", int(attr));
      return fail(cudaErrorInvalidValue);
  }
}
cudaError_t cudaMemGetInfo(size_t* free_b, size_t* total) {
  init();
  *total = g_heap.capacity;
  *free_b = g_heap.capacity - std::min(g_heap.capacity, g_heap.used);
  return cudaSuccess;
}

cudaError_t cudaMalloc(void** ptr, size_t bytes) {
  init();
  *ptr = nullptr;
  if (bytes == 0) return cudaSuccess;
  if (g_heap.used + bytes > g_heap.capacity) return fail(cudaErrorMemoryAllocation);
  const size_t rounded = (bytes + 255) / 256 * 256;
  const size_t span_bytes = (rounded + kPage - 1) / kPage * kPage;
  if (g_heap.top + span_bytes + kPage > kHeapReserve) return fail(cudaErrorMemoryAllocation);
  Alloc a;
  a.span = uintptr_t(g_heap.base) + g_heap.top;
  a.span_bytes = span_bytes;
  a.ptr = a.span + span_bytes - rounded;  // ends at the guard page: overruns past 256-byte rounding fault
  a.bytes = bytes;
  g_heap.top += span_bytes + kPage;
  g_heap.used += bytes;
  Alloc& al = g_heap.live.emplace(a.ptr, a).first->second;
  open_alloc(al);
  std::memset(reinterpret_cast<void*>(a.span), 0xFF, span_bytes);  // uninitialised memory reads as NaN
  close_alloc(al);
  *ptr = reinterpret_cast<void*>(a.ptr);
  return cudaSuccess;
}

cudaError_t cudaFree(void* ptr) {
  init();
  if (!ptr) return cudaSuccess;
  auto it = g_heap.live.find(reinterpret_cast<uintptr_t>(ptr));
  if (it == g_heap.live.end())
    fatal("cudaFree(%p): not a pointer returned by cudaMalloc (%s)", ptr,
          describe_addr(reinterpret_cast<uintptr_t>(ptr)).c_str());
  Alloc a = it->second;
  host_waits_all();  // cudaFree synchronises the device
  forget_range(a.span, a.span + a.span_bytes);
  g_heap.used -= a.bytes;
  if (a.slot >= 0) drop_key(it->second);
  g_heap.live.erase(it);
  madvise(reinterpret_cast<void*>(a.span), a.span_bytes, MADV_DONTNEED);
  g_heap.freed.emplace_back(a.span, a.span + a.span_bytes);
  return cudaSuccess;
}

cudaError_t cudaMallocHost(void** ptr, size_t bytes) {
  init();
  *ptr = std::aligned_alloc(4096, (bytes + 4095) / 4096 * 4096);
  return *ptr ? cudaSuccess : fail(cudaErrorMemoryAllocation);
}
cudaError_t cudaFreeHost(void* ptr) {
  host_waits_all();
  std::free(ptr);
  return cudaSuccess;
}

namespace {
cudaError_t memcpy_op(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, cudaStream_t stream,
                      const char* fn) {
  init();
  if (bytes == 0) return cudaSuccess;
  Where wd, ws;
  switch (kind) {
    case cudaMemcpyHostToDevice: ws = Where::host, wd = Where::device; break;
    case cudaMemcpyDeviceToHost: ws = Where::device, wd = Where::host; break;
    case cudaMemcpyDeviceToDevice: ws = Where::device, wd = Where::device; break;
    case cudaMemcpyHostToHost: ws = Where::host, wd = Where::host; break;
    case cudaMemcpyDefault: ws = Where::any, wd = Where::any; break;
    default: return fail(cudaErrorInvalidMemcpyDirection);
  }
  static const char* names[] = {"HostToHost", "HostToDevice", "DeviceToHost", "DeviceToDevice", "Default"};
  const std::string what = std::string(fn) + "(" + names[int(kind)] + ", " + std::to_string(bytes) + " bytes)";
  OpScope op(stream, what, {{src, bytes, false, ws, "src"}, {dst, bytes, true, wd, "dst"}});
  std::memmove(dst, src, bytes);
  return cudaSuccess;
}
cudaError_t memset_op(void* dst, int value, size_t bytes, cudaStream_t stream, const char* fn) {
  init();
  if (bytes == 0) return cudaSuccess;
  OpScope op(stream, std::string(fn) + "(" + std::to_string(bytes) + " bytes)",
             {{dst, bytes, true, Where::device, "dst"}});
  std::memset(dst, value, bytes);
  return cudaSuccess;
}
}  // namespace

cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind) {
  const cudaError_t rc = memcpy_op(dst, src, bytes, kind, nullptr, "cudaMemcpy");
  host_waits_for(legacy().vc);  // returns when the copy is done
  return rc;
}
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, cudaStream_t stream) {
  return memcpy_op(dst, src, bytes, kind, stream, "cudaMemcpyAsync");
}
cudaError_t cudaMemset(void* dst, int value, size_t bytes) { return memset_op(dst, value, bytes, nullptr, "cudaMemset"); }
cudaError_t cudaMemsetAsync(void* dst, int value, size_t bytes, cudaStream_t stream) {
  return memset_op(dst, value, bytes, stream, "cudaMemsetAsync");
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned int flags) {
  init();
  legacy();
  const int id = int(g_streams.size());
  g_streams.push_back(Stream{id, (flags & cudaStreamNonBlocking) == 0});
  Stream* st = &g_streams.back();
  // A unique, never dereferenced handle value.
  static uintptr_t next = 0x5eed0000;
  next += 0x10;
  g_stream_handles[next] = st;
  *s = reinterpret_cast<cudaStream_t>(next);
  return cudaSuccess;
}
cudaError_t cudaStreamCreate(cudaStream_t* s) { return cudaStreamCreateWithFlags(s, cudaStreamDefault); }
cudaError_t cudaStreamDestroy(cudaStream_t s) {
  Stream* st = lookup(s);
  if (!st || s == nullptr) return fail(cudaErrorInvalidResourceHandle);
  // As on the GPU, destroy returns at once; deferred work stays with the stream (events recorded
  // on it still find it), and an NCCL comm aborted or never completed leaves it unfinished.
  st->alive = false;  // its clock stays: work it issued is still ordered by events recorded on it
  g_stream_handles.erase(reinterpret_cast<uintptr_t>(s));
  return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t s) {
  Stream* st = lookup(s);
  if (!st) return fail(cudaErrorInvalidResourceHandle);
  finish_deferred(*st, UINT64_MAX, true);
  host_waits_for(st->vc);
  return cudaSuccess;
}
cudaError_t cudaDeviceSynchronize() {
  for (Stream& st : g_streams) finish_deferred(st, UINT64_MAX, true);
  host_waits_all();
  return cudaSuccess;
}
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned int) {
  Stream* st = lookup(s);
  if (!st || !e) return fail(cudaErrorInvalidResourceHandle);
  Event* ev = reinterpret_cast<Event*>(e);
  // Deferred work before the event is finished now, by the host (work after it on s must see it).
  if (ev->recorded) finish_deferred(g_streams[size_t(ev->stream)], ev->deferred_upto, true);
  merge(st->vc, ev->vc);  // an event never recorded: no dependency (as on the GPU)
  return cudaSuccess;
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned int flags) {
  init();
  Event* ev = new Event;
  ev->timing = (flags & cudaEventDisableTiming) == 0;
  *e = reinterpret_cast<cudaEvent_t>(ev);
  return cudaSuccess;
}
cudaError_t cudaEventCreate(cudaEvent_t* e) { return cudaEventCreateWithFlags(e, cudaEventDefault); }
cudaError_t cudaEventDestroy(cudaEvent_t e) {
  delete reinterpret_cast<Event*>(e);
  return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
  Stream* st = lookup(s);
  if (!st || !e) return fail(cudaErrorInvalidResourceHandle);
  Event* ev = reinterpret_cast<Event*>(e);
  issue(*st, "cudaEventRecord", false);
  ev->deferred_upto = st->deferred.empty() ? 0 : st->deferred.back().id;
  ev->vc = st->vc;
  ev->recorded = true;
  ev->stream = st->id;
  ev->t = now_ms();
  return cudaSuccess;
}
cudaError_t cudaEventSynchronize(cudaEvent_t e) {
  if (!e) return fail(cudaErrorInvalidResourceHandle);
  Event* ev = reinterpret_cast<Event*>(e);
  if (ev->recorded) finish_deferred(g_streams[size_t(ev->stream)], ev->deferred_upto, true);
  host_waits_for(ev->vc);
  return cudaSuccess;
}
cudaError_t cudaEventQuery(cudaEvent_t e) {
  if (!e) return fail(cudaErrorInvalidResourceHandle);
  Event* ev = reinterpret_cast<Event*>(e);
  // Everything but deferred work (collectives waiting for their peers) completes at issue.
  if (ev->recorded && !finish_deferred(g_streams[size_t(ev->stream)], ev->deferred_upto, false))
    return cudaErrorNotReady;
  host_waits_for(ev->vc);
  return cudaSuccess;
}
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t a, cudaEvent_t b) {
  Event* ea = reinterpret_cast<Event*>(a);
  Event* eb = reinterpret_cast<Event*>(b);
  if (!ea || !eb || !ea->timing || !eb->timing) return fail(cudaErrorInvalidResourceHandle);
  *ms = float(eb->t - ea->t);
  return cudaSuccess;
}

cudaError_t cudaFuncSetAttribute(const void* func, cudaFuncAttribute attr, int value) {
  if (attr != cudaFuncAttributeMaxDynamicSharedMemorySize) {
    std::fprintf(stderr, "zt-emu: cudaFuncSetAttribute(%d) is not emulated\n", int(attr));
    return fail(cudaErrorInvalidValue);
  }
  if (value < 0 || size_t(value) > kOptinSmemLimit) return fail(cudaErrorInvalidValue);
  g_max_dyn_smem[func] = value;
  return cudaSuccess;
}

cudaError_t cudaGetLastError() {
  const cudaError_t e = g_last_error;
  g_last_error = cudaSuccess;
  return e;
}
cudaError_t cudaPeekAtLastError() { return g_last_error; }

const char* cudaGetErrorName(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
    case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
    case cudaErrorNoDevice: return "cudaErrorNoDevice";
    case cudaErrorInvalidResourceHandle: return "cudaErrorInvalidResourceHandle";
    case cudaErrorInvalidMemcpyDirection: return "cudaErrorInvalidMemcpyDirection";
    case cudaErrorNotReady: return "cudaErrorNotReady";
    default: return "cudaError (emulated)";
  }
}
const char* cudaGetErrorString(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorMemoryAllocation: return "out of memory (emulated device)";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorNoDevice: return "no CUDA-capable device is detected (ZT_EMU_NO_DEVICE)";
    default: return "error reported by the emulator (see the zt-emu line above)";
  }
}

}  // extern "C"
