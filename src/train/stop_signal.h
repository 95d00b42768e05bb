// SIGTERM / SIGINT / SIGUSR1 during training (docs/design.md §3.7): the handler only sets a flag; the loop
// finishes the step it is in, the ranks agree that one of them was asked to stop, save a
// checkpoint and return, and the process exits 0. Installed only while a run with checkpoint.dir
// trains (elsewhere the signals keep their default: end the process). A second signal of the same
// kind ends the process at once. SIGUSR1 is there for mpirun: Open MPI forwards it to every rank
// (ess_base_forward_signals), while SIGTERM to mpirun ends the job after odls_base_sigkill_timeout.
#pragma once
#include <string>

#include "comm/comm.h"

namespace zt {

class StopSignals {
 public:
  explicit StopSignals(bool install);  // install = false: does nothing
  ~StopSignals();
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;
  static int received();  // the signal number, 0 when none came
  // Collective: whether any rank received one; "" or which signal and rank ("SIGTERM on rank 1").
  static std::string agree(Comm& comm);
  static void reset();    // tests run several trainings in one process

 private:
  bool installed_ = false;
};

}  // namespace zt
