#include "train/stop_signal.h"

#include <signal.h>
#include <unistd.h>

#include <cerrno>

#include "runtime/error.h"

namespace zt {

namespace {
volatile sig_atomic_t g_signal = 0;
volatile sig_atomic_t g_count = 0;    // stop signals received, for the test hook that waits for one
volatile sig_atomic_t g_saving = 0;
volatile sig_atomic_t g_abandon = 0;  // the signal that asked to abandon the save in progress
volatile sig_atomic_t g_warn = 0;
struct sigaction g_old_term, g_old_int, g_old_hup, g_old_usr1;

// A second signal ends the process the default way (a user pressing Ctrl-C twice means it), except
// during a save: killed there, it left a partial .tmp_step directory and the lock file behind, so
// the save is abandoned at its next piece instead (Saving::check) and the run ends through the error
// path, which removes both. One past its last piece completes: it is whole by then.
extern "C" void on_stop_signal(int sig) {
  g_count = g_count + 1;
  if (g_signal == 0) {
    g_signal = sig;
    return;
  }
  if (g_saving) {
    g_abandon = sig;
    return;
  }
  ::signal(sig, SIG_DFL);
  ::raise(sig);
}

constexpr char kNoCheckpointDir[] =
    "warning: SIGUSR1 asks for a checkpoint, but checkpoint.dir is not set: nothing is saved and the run goes on "
    "(SIGTERM, SIGINT or SIGHUP ends it)\n";

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

const char* signal_name(int sig) {
  switch (sig) {
    case SIGINT: return "SIGINT";
    case SIGTERM: return "SIGTERM";
    case SIGHUP: return "SIGHUP";
    case SIGUSR1: return "SIGUSR1";
    default: return "a signal";
  }
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
  // A closed terminal or ssh session: its default action ended the run with nothing saved.
  install(SIGHUP, on_stop_signal, &g_old_hup);
  install(SIGUSR1, on_stop_signal, &g_old_usr1);
}

StopSignals::~StopSignals() {
  ::sigaction(SIGUSR1, &g_old_usr1, nullptr);
  if (!can_save_) return;
  ::sigaction(SIGTERM, &g_old_term, nullptr);
  ::sigaction(SIGINT, &g_old_int, nullptr);
  ::sigaction(SIGHUP, &g_old_hup, nullptr);
}

int StopSignals::received() { return g_signal; }
int StopSignals::count() { return g_count; }

std::string StopSignals::agree(Comm& comm) {
  const uint64_t mine = uint64_t(received());
  const std::vector<uint64_t> all = comm.world() > 1 ? comm.all_gather_u64(mine) : std::vector<uint64_t>{mine};
  for (size_t r = 0; r < all.size(); ++r) {
    if (all[r] == 0) continue;
    return std::string(signal_name(int(all[r]))) + " on rank " + std::to_string(r);
  }
  return "";
}
void StopSignals::reset() { g_signal = g_count = g_saving = g_abandon = 0; }

StopSignals::Saving::Saving() { g_saving = 1; }
StopSignals::Saving::~Saving() { g_saving = 0; }
void StopSignals::wait_for_signal(int seen, double max_s) {
  for (double waited = 0; g_count <= seen && waited < max_s; waited += 0.01) ::usleep(10000);
}

void StopSignals::Saving::check() {
  const int sig = g_abandon;
  ZT_REQUIRE(sig == 0, "checkpoint: save abandoned on a second " << signal_name(sig) << " (the previous checkpoint, if "
                                                                  "any, stays latest; checkpoint.resume \"auto\" "
                                                                  "continues from it)");
}

}  // namespace zt
