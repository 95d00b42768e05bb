#include "train/stop_signal.h"

#include <signal.h>
#include <unistd.h>

#include <cerrno>

#include "runtime/error.h"

namespace zt {

namespace {
volatile sig_atomic_t g_signal = 0;
volatile sig_atomic_t g_warn = 0;
struct sigaction g_old_term, g_old_int, g_old_usr1;

// A second signal ends the process the default way (a user pressing Ctrl-C twice means it).
extern "C" void on_stop_signal(int sig) {
  g_signal = sig;
  ::signal(sig, SIG_DFL);
}

constexpr char kNoCheckpointDir[] =
    "warning: SIGUSR1 asks for a checkpoint, but checkpoint.dir is not set: nothing is saved and the run goes on "
    "(SIGTERM or SIGINT ends it)\n";

// write(2) is async-signal-safe; errno is the interrupted code's.
extern "C" void on_checkpoint_request_without_dir(int) {
  if (!g_warn) return;
  const int saved = errno;
  [[maybe_unused]] const ssize_t n = ::write(STDERR_FILENO, kNoCheckpointDir, sizeof kNoCheckpointDir - 1);
  errno = saved;
}

void install(int sig, void (*handler)(int), struct sigaction* old) {
  struct sigaction sa = {};
  sa.sa_handler = handler;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;  // a blocking call in progress goes on rather than failing with EINTR
  ZT_CHECK_ERRNO(::sigaction(sig, &sa, old) == 0, "sigaction(" << sig << ")");
}
}  // namespace

StopSignals::StopSignals(bool can_save, bool warn) : can_save_(can_save) {
  g_warn = warn;
  if (!can_save) {
    install(SIGUSR1, on_checkpoint_request_without_dir, &g_old_usr1);
    return;
  }
  install(SIGTERM, on_stop_signal, &g_old_term);
  install(SIGINT, on_stop_signal, &g_old_int);
  install(SIGUSR1, on_stop_signal, &g_old_usr1);
}

StopSignals::~StopSignals() {
  ::sigaction(SIGUSR1, &g_old_usr1, nullptr);
  if (!can_save_) return;
  ::sigaction(SIGTERM, &g_old_term, nullptr);
  ::sigaction(SIGINT, &g_old_int, nullptr);
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
