#include "train/stop_signal.h"

#include <signal.h>

#include "runtime/error.h"

namespace zt {

namespace {
volatile sig_atomic_t g_signal = 0;
struct sigaction g_old_term, g_old_int;

extern "C" void on_stop_signal(int sig) { g_signal = sig; }
}  // namespace

StopSignals::StopSignals(bool install) {
  if (!install) return;
  struct sigaction sa = {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  ZT_CHECK_ERRNO(::sigaction(SIGTERM, &sa, &g_old_term) == 0, "sigaction(SIGTERM)");
  ZT_CHECK_ERRNO(::sigaction(SIGINT, &sa, &g_old_int) == 0, "sigaction(SIGINT)");
  installed_ = true;
}

StopSignals::~StopSignals() {
  if (!installed_) return;
  ::sigaction(SIGTERM, &g_old_term, nullptr);
  ::sigaction(SIGINT, &g_old_int, nullptr);
}

int StopSignals::received() { return g_signal; }
void StopSignals::reset() { g_signal = 0; }

}  // namespace zt
