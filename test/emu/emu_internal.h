// Emulator internals shared by runtime.cpp, cublaslt.cpp, nccl.cpp and the CUB stand-in.
#pragma once
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <string>

namespace zt_emu {

enum class Where { device, host, any };
struct Range {
  const void* ptr;
  size_t bytes;  // SIZE_MAX: to the end of the allocation (device only)
  bool write;
  Where where;
  const char* what;  // "A", "dst", ... for messages
};

// One piece of device work on `stream` (a copy, a memset, a GEMM, a sort, a collective): checks that
// every device range lies in a live allocation, that every use of memory last touched on another
// stream is ordered by an event or a synchronisation (else reports and aborts), records the
// accesses, and makes the device allocations involved readable/writable by this (host) code until
// the scope ends.
class OpScope {
 public:
  // collective: an NCCL collective, which does not wait for the stream's deferred work (below).
  OpScope(cudaStream_t stream, const std::string& what, std::initializer_list<Range> ranges, bool collective = false);
  ~OpScope();
  OpScope(const OpScope&) = delete;
  OpScope& operator=(const OpScope&) = delete;

 private:
  int nopen_ = 0;
  uintptr_t open_[16];
};

[[noreturn]] void fatal(const char* fmt, ...);
void banner();
bool is_device_ptr(const void* p);
// Bytes from p to the end of its live allocation (0 if p is not in one).
size_t bytes_to_alloc_end(const void* p);
void set_last_error(cudaError_t e);
// Stream handle -> valid? (nullptr = legacy default stream is valid)
bool valid_stream(cudaStream_t s);

// Work `stream` has reached (its accesses recorded by an OpScope) that completes later: an emulated
// NCCL collective whose peers have not sent yet. done(block) tries to finish it (block: until it
// does) and says whether it did. Later work on the stream (but collectives and event records),
// cudaStreamSynchronize, cudaDeviceSynchronize, cudaEventSynchronize and cudaStreamWaitEvent on an
// event recorded after it finish it first, blocking; cudaEventQuery tries it and answers
// cudaErrorNotReady while it is not done, as on the GPU.
void defer(cudaStream_t stream, std::function<bool(bool)> done);
// Opens the allocation holding `ptr` to host code while fn runs (a deferred collective's result).
void with_device_memory(const void* ptr, const std::function<void()>& fn);

}  // namespace zt_emu
