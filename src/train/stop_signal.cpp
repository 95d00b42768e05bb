#include "train/stop_signal.h"

#include <signal.h>

#include "runtime/error.h"

namespace zt {

namespace {
volatile sig_atomic_t g_signal = 0;
struct sigaction g_old_term, g_old_int, g_old_usr1;

// A second signal ends the process the default way (a user pressing Ctrl-C twice means it).
extern "C" void on_stop_signal(int sig) {
  g_signal = sig;
  ::signal(sig, SIG_DFL);
}
}  // namespace

StopSignals::StopSignals(bool install) {
  if (!install) return;
  struct sigaction sa = {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  ZT_CHECK_ERRNO(::sigaction(SIGTERM, &sa, &g_old_term) == 0, "sigaction(SIGTERM)");
  ZT_CHECK_ERRNO(::sigaction(SIGINT, &sa, &g_old_int) == 0, "sigaction(SIGINT)");
  ZT_CHECK_ERRNO(::sigaction(SIGUSR1, &sa, &g_old_usr1) == 0, "sigaction(SIGUSR1)");
  installed_ = true;
}

StopSignals::~StopSignals() {
  if (!installed_) return;
  ::sigaction(SIGTERM, &g_old_term, nullptr);
  ::sigaction(SIGINT, &g_old_int, nullptr);
  ::sigaction(SIGUSR1, &g_old_usr1, nullptr);
}

int StopSignals::received() { return g_signal; }

std::string StopSignals::agree(Comm& comm) {
  const uint64_t mine = uint64_t(received());
  const std::vector<uint64_t> all = comm.world() > 1 ? comm.all_gather_u64(mine) : std::vector<uint64_t>{mine};
  for (size_t r = 0; r < all.size(); ++r) {
    if (all[r] == 0) continue;
    const char* name = all[r] == SIGINT ? "SIGINT" : all[r] == SIGTERM ? "SIGTERM" : all[r] == SIGUSR1 ? "SIGUSR1" : "a signal";
    return std::string(name) + " on rank " + std::to_string(r);
  }
  return "";
}
void StopSignals::reset() { g_signal = 0; }

}  // namespace zt
