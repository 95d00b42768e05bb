// Tracked memory (docs/design.md §3.5): every long-lived buffer is allocated through a MemoryTracker
// with a tier (where it lives) and a category (what it is for). The tracker keeps current and
// peak bytes per (tier, category), so the memory table printed at start and in the summary is
// what was really allocated, not an estimate. Buffers are allocated once, before the first
// step; nothing is allocated inside a step.
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

namespace zt {

enum class Tier : int { device = 0, pinned, host, nvme, count };
enum class Category : int { params = 0, grads, master, optimizer, activations, comm, staging, count };

const char* tier_name(Tier t);
const char* category_name(Category c);

class MemoryTracker;

// Owning handle to one tracked allocation; frees and untracks on destruction.
class Allocation {
 public:
  Allocation() = default;
  Allocation(Allocation&& o) noexcept { *this = std::move(o); }
  Allocation& operator=(Allocation&& o) noexcept;
  Allocation(const Allocation&) = delete;
  Allocation& operator=(const Allocation&) = delete;
  ~Allocation() { reset(); }

  void reset();
  void* data() const { return ptr_; }
  size_t bytes() const { return bytes_; }
  template <class T> T* as() const { return static_cast<T*>(ptr_); }

 private:
  friend class MemoryTracker;
  MemoryTracker* owner_ = nullptr;
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
  Tier tier_ = Tier::host;
  Category cat_ = Category::params;
};

class MemoryTracker {
 public:
  static constexpr size_t kAlign = 64;  // cache line; also enough for AVX-512 loads

  // Zero-filled allocation on the host or the CUDA device. `name` appears in out-of-memory messages
  // (DeviceOutOfMemory for the device, carrying this table). `align` (a power of two, at least
  // kAlign) is for host buffers that O_DIRECT reads into (4096). Tier::nvme takes no memory: the
  // bytes are counted (they live in a swap file, docs/design.md §3.6) and data() is nullptr.
  Allocation alloc(size_t bytes, Tier tier, Category cat, const std::string& name, size_t align = kAlign);

  size_t current(Tier t, Category c) const { return cur_[idx(t, c)]; }
  size_t peak(Tier t, Category c) const { return peak_[idx(t, c)]; }
  size_t current_total(Tier t) const;
  size_t peak_total(Tier t) const;

  // Human-readable table of current (and peak) bytes, one row per category, one column per
  // tier that has any allocation.
  std::string table(bool with_peak) const;
  // {"host": {"params": bytes, ...}, ...} of peaks, for the metrics summary line.
  nlohmann::json peak_json() const;

 private:
  friend class Allocation;
  void release(Allocation& a);
  static size_t idx(Tier t, Category c) { return size_t(t) * size_t(Category::count) + size_t(c); }
  static constexpr size_t N = size_t(Tier::count) * size_t(Category::count);
  std::array<size_t, N> cur_{};
  std::array<size_t, N> peak_{};
};

// Peak resident set size of this process so far (VmHWM in /proc/self/status), in bytes; 0 where
// the kernel does not report it. Everything resident counts, tracked or not: test/zero/memory_formulas.py
// holds it against the tracked total plus a fixed runtime overhead.
size_t process_peak_rss_bytes();

// "1.50 MiB"-style formatting used by every memory table.
std::string format_bytes(double bytes);

// Host memory this process can still take before the kernel's OOM killer steps in: MemAvailable
// from /proc/meminfo, capped by the cgroup memory limit when one is set (a container sees the
// host's MemAvailable). ZT_MEM_AVAILABLE_BYTES replaces both (tests fake a small machine with it).
// bytes == 0 when nothing could be read (not Linux): the caller skips its check.
struct HostMemory {
  uint64_t bytes = 0;
  std::string source;  // what the number is, for messages: "MemAvailable in /proc/meminfo", ...
};
HostMemory host_memory_available();

}  // namespace zt
