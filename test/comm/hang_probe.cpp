// Fault-injection probe for the collective timeout: rank 1 skips its first collective of step 0.
// Run by test/comm/hang_probe.sh: `mpirun --oversubscribe -np 3 ./hang_probe` under `timeout 30`;
// the job must end on its own (CommTimeout -> abort_all(3)) with the diagnostic, well before 30 s.
#include <cstdio>
#include <exception>
#include <vector>

#include "comm/comm.h"

int main() {
  zt::CommOptions opts;
  opts.timeout_s = 3;
  opts.fault_skip_rank = 1;
  opts.fault_skip_step = 0;
  std::unique_ptr<zt::Comm> comm;
  try {
    comm = zt::make_mpi_comm(opts);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "hang_probe: %s\n", e.what());
    return 1;
  }
  const int rank = comm->rank();
  std::vector<float> buf(1000, 1.0f);
  try {
    comm->begin_step(0);
    comm->wait(comm->all_reduce(buf.data(), buf.size()));
    comm->wait(comm->all_reduce(buf.data(), buf.size()));
  } catch (const zt::CommTimeout& e) {
    std::fprintf(stderr, "hang_probe rank %d: error: %s\n", rank, e.what());
    comm->abort_all(3);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "hang_probe rank %d: unexpected error: %s\n", rank, e.what());
    comm->abort_all(4);
  }
  // Not reached: ranks 0 and 2 wait in #1 (skipped by rank 1), rank 1 waits in #2.
  std::fprintf(stderr, "hang_probe rank %d: both all-reduces returned (unexpected); last collectives:\n%s", rank,
               comm->log_dump(4).c_str());
  return 0;
}
