// The CUDA device as seen by host code that must also build without CUDA (memory tracker, trainer,
// plan checks). With the CUDA backend these call the runtime (device.cu); without it
// (device_nocuda.cpp) available() is false and everything else throws.
#pragma once
#include <cstddef>
#include <string>

#include "runtime/error.h"

namespace zt {

// cudaMalloc failed. The trainer adds the memory table and the next step of the escalation ladder.
struct DeviceOutOfMemory : OutOfMemory {
  using OutOfMemory::OutOfMemory;
};

namespace device {

bool built_with_cuda();
// CUDA devices visible to this process (0: no driver, no GPU, or no CUDA backend).
int count();
// A CUDA device is visible and usable (driver present, at least one GPU).
bool available();
// "NVIDIA H100 80GB HBM3 (sm_90, 132 SMs, 79.1 GiB)"; "" if none.
std::string describe();
// Bytes free on the current device right now.
size_t free_bytes();
// The current device's size in bytes (0 without the CUDA backend).
size_t total_bytes();
void* alloc(size_t bytes);  // throws DeviceOutOfMemory
void free(void* p);
// Page-locked host memory (cudaMallocHost), for buffers that asynchronous copies read and write
// (Tier::pinned). Throws OutOfMemory.
void* alloc_pinned(size_t bytes);
void free_pinned(void* p);
void memset0(void* p, size_t bytes);
void copy_to_device(void* dst, const void* src, size_t bytes);
void copy_to_host(void* dst, const void* src, size_t bytes);
void synchronize();

}  // namespace device
}  // namespace zt
