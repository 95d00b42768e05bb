#include "runtime/memory.h"

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iomanip>
#include <sstream>

#include "runtime/device.h"
#include "runtime/checked.h"
#include "runtime/error.h"

namespace zt {

const char* tier_name(Tier t) {
  switch (t) {
    case Tier::device: return "device";
    case Tier::pinned: return "pinned";
    case Tier::host: return "host";
    case Tier::nvme: return "nvme";
    default: return "?";
  }
}

const char* category_name(Category c) {
  switch (c) {
    case Category::params: return "params";
    case Category::grads: return "grads";
    case Category::master: return "master";
    case Category::optimizer: return "optimizer";
    case Category::activations: return "activations";
    case Category::comm: return "comm";
    case Category::staging: return "staging";
    default: return "?";
  }
}

size_t process_peak_rss_bytes() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("VmHWM:", 0) == 0) return size_t(std::strtoull(line.c_str() + 6, nullptr, 10)) * 1024;  // "VmHWM:  1234 kB"
  return 0;
}

std::string format_bytes(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (b >= 1024.0 && u < 4) { b /= 1024.0; ++u; }
  std::ostringstream os;
  os << std::fixed << std::setprecision(u == 0 ? 0 : 2) << b << " " << units[u];
  return os.str();
}

Allocation& Allocation::operator=(Allocation&& o) noexcept {
  if (this != &o) {
    reset();
    owner_ = o.owner_; ptr_ = o.ptr_; bytes_ = o.bytes_; tier_ = o.tier_; cat_ = o.cat_;
    o.owner_ = nullptr; o.ptr_ = nullptr; o.bytes_ = 0;
  }
  return *this;
}

void Allocation::reset() {
  if (owner_) owner_->release(*this);
  owner_ = nullptr; ptr_ = nullptr; bytes_ = 0;
}

Allocation MemoryTracker::alloc(size_t bytes, Tier tier, Category cat, const std::string& name, size_t align) {
  ZT_ASSERT(align >= kAlign && (align & (align - 1)) == 0);
  Allocation a;
  size_t rounded = checked_round_up(bytes, align, "memory: buffer " + name);
  if (rounded == 0) rounded = align;
  void* p = nullptr;
  if (tier == Tier::nvme) {
    // Counted only: the swap file that holds it belongs to its owner (zero/store.cpp).
  } else if (tier == Tier::device) {
    try {
      p = device::alloc(rounded);  // cudaMalloc: 256-byte aligned
    } catch (const DeviceOutOfMemory& e) {
      std::ostringstream os;
      // One line (failures print one line); the full table was printed at start.
      os << e.what() << " (allocating " << format_bytes(double(bytes)) << " for " << name << ", with "
         << format_bytes(double(current_total(Tier::device))) << " already tracked on the device); ";
      throw DeviceOutOfMemory(os.str());
    }
    device::memset0(p, rounded);
  } else if (tier == Tier::pinned) {
    // Page-locked (CUDA backend only): the host side of asynchronous device copies (comm/host_mirror_comm.h).
    p = device::alloc_pinned(rounded);  // 4 KiB aligned
    ZT_ASSERT(reinterpret_cast<uintptr_t>(p) % align == 0);
    std::memset(p, 0, rounded);
  } else {
    p = std::aligned_alloc(align, rounded);
    if (p == nullptr)
      throw OutOfMemory("out of host memory allocating " + format_bytes(double(bytes)) + " for " + name + ", with " +
                            format_bytes(double(current_total(Tier::host))) + " already tracked on the host; ");
    std::memset(p, 0, rounded);
  }
  a.owner_ = this; a.ptr_ = p; a.bytes_ = bytes; a.tier_ = tier; a.cat_ = cat;
  size_t i = idx(tier, cat);
  cur_[i] += bytes;
  if (cur_[i] > peak_[i]) peak_[i] = cur_[i];
  return a;
}

void MemoryTracker::release(Allocation& a) {
  cur_[idx(a.tier_, a.cat_)] -= a.bytes_;
  if (a.tier_ == Tier::device) device::free(a.ptr_);
  else if (a.tier_ == Tier::pinned) device::free_pinned(a.ptr_);
  else if (a.tier_ == Tier::host) std::free(a.ptr_);
}

size_t MemoryTracker::current_total(Tier t) const {
  size_t s = 0;
  for (int c = 0; c < int(Category::count); ++c) s += current(t, Category(c));
  return s;
}

size_t MemoryTracker::peak_total(Tier t) const {
  size_t s = 0;
  for (int c = 0; c < int(Category::count); ++c) s += peak(t, Category(c));
  return s;
}

std::string MemoryTracker::table(bool with_peak) const {
  std::ostringstream os;
  std::vector<Tier> tiers;
  for (int t = 0; t < int(Tier::count); ++t)
    if (peak_total(Tier(t)) > 0) tiers.push_back(Tier(t));
  if (tiers.empty()) tiers.push_back(Tier::host);
  os << std::left << std::setw(13) << "category";
  for (Tier t : tiers) os << std::right << std::setw(with_peak ? 24 : 13) << (std::string(tier_name(t)) + (with_peak ? " (peak)" : ""));
  os << "\n";
  auto cell = [&](size_t cur, size_t pk) {
    std::string s = format_bytes(double(cur));
    if (with_peak) s += " (" + format_bytes(double(pk)) + ")";
    return s;
  };
  for (int c = 0; c < int(Category::count); ++c) {
    bool any = false;
    for (Tier t : tiers) any |= peak(t, Category(c)) > 0;
    if (!any) continue;
    os << std::left << std::setw(13) << category_name(Category(c));
    for (Tier t : tiers) os << std::right << std::setw(with_peak ? 24 : 13) << cell(current(t, Category(c)), peak(t, Category(c)));
    os << "\n";
  }
  os << std::left << std::setw(13) << "total";
  for (Tier t : tiers) os << std::right << std::setw(with_peak ? 24 : 13) << cell(current_total(t), peak_total(t));
  os << "\n";
  return os.str();
}

nlohmann::json MemoryTracker::peak_json() const {
  nlohmann::json j = nlohmann::json::object();
  for (int t = 0; t < int(Tier::count); ++t) {
    if (peak_total(Tier(t)) == 0) continue;
    nlohmann::json row = nlohmann::json::object();
    for (int c = 0; c < int(Category::count); ++c)
      if (peak(Tier(t), Category(c)) > 0) row[category_name(Category(c))] = peak(Tier(t), Category(c));
    row["total"] = peak_total(Tier(t));
    j[tier_name(Tier(t))] = row;
  }
  return j;
}

namespace {

// First number in the file (cgroup limit files hold one, or "max" for none); 0 if unreadable.
uint64_t read_number(const std::string& path) {
  std::ifstream f(path);
  uint64_t v = 0;
  return (f >> v) ? v : 0;
}

// The memory limit of this process's cgroup (v2 memory.max, v1 memory.limit_in_bytes), 0 if none.
// Only the limit, not limit minus usage: usage counts page cache the kernel would reclaim, and a
// refusal must never come from that. Inside a container the cgroup is usually mounted at the root.
uint64_t cgroup_limit() {
  std::ifstream f("/proc/self/cgroup");
  std::string line;
  uint64_t limit = 0;
  auto consider = [&](uint64_t v) {
    // v1 reports "no limit" as a huge page-aligned number.
    if (v > 0 && v < (uint64_t(1) << 60) && (limit == 0 || v < limit)) limit = v;
  };
  while (std::getline(f, line)) {
    const size_t a = line.find(':'), b = line.find(':', a + 1);
    if (a == std::string::npos || b == std::string::npos) continue;
    const std::string controllers = line.substr(a + 1, b - a - 1), path = line.substr(b + 1);
    if (controllers.empty()) {
      consider(read_number("/sys/fs/cgroup" + path + "/memory.max"));
      consider(read_number("/sys/fs/cgroup/memory.max"));
    } else if (("," + controllers + ",").find(",memory,") != std::string::npos) {
      consider(read_number("/sys/fs/cgroup/memory" + path + "/memory.limit_in_bytes"));
      consider(read_number("/sys/fs/cgroup/memory/memory.limit_in_bytes"));
    }
  }
  return limit;
}

}  // namespace

HostMemory host_memory_available() {
  HostMemory m;
  if (const char* fake = std::getenv("ZT_MEM_AVAILABLE_BYTES")) {
    char* end = nullptr;
    errno = 0;
    const unsigned long long v = std::strtoull(fake, &end, 10);
    ZT_REQUIRE(*fake != '\0' && *end == '\0' && errno == 0 && fake[0] != '-',
               "ZT_MEM_AVAILABLE_BYTES: \"" << fake << "\" is not a number of bytes (unset it to use /proc/meminfo)");
    m.bytes = v;
    m.source = "ZT_MEM_AVAILABLE_BYTES";
    return m;
  }
  std::ifstream f("/proc/meminfo");
  std::string line;
  while (std::getline(f, line)) {  // "MemAvailable:   23522832 kB"
    std::istringstream is(line);
    std::string key;
    uint64_t kib = 0;
    if (is >> key >> kib && key == "MemAvailable:") {
      m.bytes = kib * 1024;
      m.source = "MemAvailable in /proc/meminfo";
      break;
    }
  }
  const uint64_t limit = cgroup_limit();
  if (limit > 0 && (m.bytes == 0 || limit < m.bytes)) {
    m.bytes = limit;
    m.source = "the memory limit of this process's cgroup";
  }
  return m;
}

}  // namespace zt
