// The device interface of a build without the CUDA backend: nothing is available.
#include "runtime/device.h"

#if !ZT_HAVE_CUDA
namespace zt::device {
namespace {
[[noreturn]] void no_cuda() {
  throw Error("this build has no CUDA backend (configure with nvcc installed, or -DZT_CUDA=ON)");
}
}  // namespace
bool built_with_cuda() { return false; }
int count() { return 0; }
bool available() { return false; }
std::string describe() { return ""; }
size_t free_bytes() { return 0; }
size_t total_bytes() { return 0; }
void* alloc(size_t) { no_cuda(); }
void free(void*) {}
void* alloc_pinned(size_t) { no_cuda(); }
void free_pinned(void*) {}
void memset0(void*, size_t) { no_cuda(); }
void copy_to_device(void*, const void*, size_t) { no_cuda(); }
void copy_to_host(void*, const void*, size_t) { no_cuda(); }
void synchronize() {}
}  // namespace zt::device
#endif
