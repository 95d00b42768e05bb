// A missing recv ends every rank with a diagnosis (comm.h "Point to point"): run by
// test/comm/p2p_hang_probe.sh as `mpirun --oversubscribe -np 3 ./zt_p2p_hang_probe` under `timeout 30`.
// The world splits into the group "ring" in reverse order (group rank g = world rank 2 - g). Group
// rank 0 (world rank 2) sends to group rank 2 (world rank 0), which never posts the recv; ranks 0
// and 1 wait in the group's barrier instead. The sender's send times out naming the op, the peer and
// the group; the others' barrier times out (the sender never reaches it); each aborts the job (3).
#include <cstdio>
#include <exception>
#include <memory>
#include <vector>

#include "comm/comm.h"

int main() {
  zt::CommOptions opts;
  opts.timeout_s = 3;
  std::unique_ptr<zt::Comm> world, ring;
  try {
    world = zt::make_mpi_comm(opts);
    ring = world->split(0, world->world() - world->rank(), "ring");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "p2p_hang_probe: %s\n", e.what());
    return 1;
  }
  std::vector<float> buf(1000, 1.0f);
  try {
    ring->begin_step(0);
    if (ring->rank() == 0) ring->wait(ring->send(buf.data(), 4 * buf.size(), 2));
    ring->barrier();
  } catch (const zt::CommTimeout& e) {
    std::fprintf(stderr, "p2p_hang_probe rank %d: error: %s\n", world->rank(), e.what());
    world->abort_all(3);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "p2p_hang_probe rank %d: unexpected error: %s\n", world->rank(), e.what());
    world->abort_all(4);
  }
  std::fprintf(stderr, "p2p_hang_probe rank %d: the send and the barrier returned (unexpected)\n", world->rank());
  return 0;
}
