#include "offload/unlink_list.h"

#include <unistd.h>

#include <atomic>
#include <csignal>
#include <cstring>
#include <mutex>

#include "runtime/error.h"

namespace zt::offload {

namespace {

constexpr int kSlots = 64;       // 3 states per rank process; room for several stores in one test process
constexpr size_t kPathMax = 4096;
char g_path[kSlots][kPathMax];
// 0 free, 1 being written (the handler skips it), 2 live.
std::atomic<int> g_state[kSlots];
struct sigaction g_old_term, g_old_int;
std::mutex g_mu;  // register / unregister (never taken in the handler)
bool g_installed = false;

void on_signal(int sig, siginfo_t* info, void* ctx) {
  for (int i = 0; i < kSlots; ++i)
    if (g_state[i].load(std::memory_order_acquire) == 2) unlink(g_path[i]);
  const struct sigaction& old = sig == SIGTERM ? g_old_term : g_old_int;
  if (old.sa_flags & SA_SIGINFO) {
    old.sa_sigaction(sig, info, ctx);
  } else if (old.sa_handler == SIG_IGN) {
    return;
  } else if (old.sa_handler == SIG_DFL) {
    signal(sig, SIG_DFL);
    raise(sig);
  } else {
    old.sa_handler(sig);
  }
}

void install() {
  struct sigaction sa {};
  sa.sa_sigaction = on_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_SIGINFO | SA_RESTART;
  ZT_CHECK_ERRNO(sigaction(SIGTERM, &sa, &g_old_term) == 0, "sigaction(SIGTERM) for the swap-file unlink list");
  ZT_CHECK_ERRNO(sigaction(SIGINT, &sa, &g_old_int) == 0, "sigaction(SIGINT) for the swap-file unlink list");
}

}  // namespace

int register_for_unlink(const std::string& path) {
  std::lock_guard<std::mutex> lock(g_mu);
  ZT_REQUIRE(path.size() < kPathMax, "offload.nvme_dir: swap file path longer than " << kPathMax - 1 << " bytes");
  if (!g_installed) {
    install();
    g_installed = true;
  }
  for (int i = 0; i < kSlots; ++i) {
    if (g_state[i].load(std::memory_order_relaxed) != 0) continue;
    g_state[i].store(1, std::memory_order_relaxed);
    std::memcpy(g_path[i], path.c_str(), path.size() + 1);
    g_state[i].store(2, std::memory_order_release);
    return i;
  }
  fail_at(__FILE__, __LINE__, "internal error: more than 64 swap files registered for unlinking");
}

void unregister_for_unlink(int slot) {
  std::lock_guard<std::mutex> lock(g_mu);
  ZT_ASSERT(slot >= 0 && slot < kSlots);
  g_state[slot].store(0, std::memory_order_release);
}

}  // namespace zt::offload
