#include "comm/comm.h"

namespace zt {

void agree_or_throw(Comm& comm, const std::string& failure, const std::string& what) {
  const std::vector<uint64_t> failed = comm.all_gather_u64(failure.empty() ? 0 : 1);
  for (int r = 0; r < comm.world(); ++r) {
    if (failed[size_t(r)] == 0) continue;
    if (r == comm.rank()) throw AgreedError(failure, true);
    throw AgreedError("rank " + std::to_string(r) + " " + what, false);
  }
}

}  // namespace zt
