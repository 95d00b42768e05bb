// SIGTERM / SIGINT / SIGHUP / SIGUSR1 during training (docs/design.md §3.7). With checkpoint.dir, the
// handler only sets a flag; the loop finishes the step it is in, the ranks agree that one of them was
// asked to stop, save a checkpoint and return, and the process exits 0. A signal that arrives during
// a periodic save makes that save the last: the ranks agree again after it, so a scheduler's
// KillWait need allow one save, not a step and a second one. A second signal ends the process at
// once; during a save it abandons the save instead (its temporary directory removed, the lock
// released, exit 1), so nothing half-written is left. SIGUSR1 is there for mpirun: Open MPI forwards
// it to every rank (ess_base_forward_signals), while SIGTERM to mpirun ends the job after
// odls_base_sigkill_timeout.
//
// Without checkpoint.dir, SIGTERM, SIGINT and SIGHUP keep their default action (the process ends; swap
// files have no name on disk, so nothing is left, offload/swap_file.h), and SIGUSR1, which asks for
// a checkpoint, is ignored with a warning: there is nowhere to save it, and ending the run because
// of it would throw away what the run did so far.
#pragma once
#include <string>

#include "comm/comm.h"

namespace zt {

class StopSignals {
 public:
  // can_save: checkpoint.dir is set. warn: print the warning for SIGUSR1 without it (rank 0 only,
  // since mpirun forwards the signal to every rank).
  StopSignals(bool can_save, bool warn);
  ~StopSignals();
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;
  static int received();  // the signal number, 0 when none came (always 0 without checkpoint.dir)
  // Collective: whether any rank received one; "" or which signal and rank ("SIGTERM on rank 1").
  static std::string agree(Comm& comm);
  static void reset();    // tests run several trainings in one process
  static int count();     // stop signals received so far (a second one included)
  // Tests (ZT_FAULT_PAUSE_IN_SAVE): returns once more than `seen` stop signals came, or after max_s.
  static void wait_for_signal(int seen, double max_s);

  // Marks a save in progress, during which a second signal abandons the save rather than killing
  // the process mid-write; check() (at each piece the save writes) throws when one came.
  class Saving {
   public:
    Saving();
    ~Saving();
    Saving(const Saving&) = delete;
    Saving& operator=(const Saving&) = delete;
    static void check();
  };

 private:
  bool can_save_ = false;
};

}  // namespace zt
