#include "train/same_plan.h"

#include <sstream>
#include <vector>

#include "comm/comm.h"
#include "runtime/error.h"

namespace zt {
namespace {

// The four settings in one word, so that every rank can name what rank r runs (inflight at most
// kMaxCommInflight < 2^11, poll_us at most kMaxCommPollUs < 2^17).
uint64_t pack_comm(const CommSection& c) {
  const uint64_t coll = uint64_t(parse_comm_collectives("comm.collectives", c.collectives));
  return coll | uint64_t(c.thread ? 1 : 0) << 2 | uint64_t(c.inflight) << 3 | uint64_t(c.poll_us) << 14;
}

std::string comm_text(uint64_t p) {
  std::ostringstream os;
  os << "collectives " << comm_collectives_name(CommCollectives(p & 3)) << ", thread " << (p >> 2 & 1) << ", inflight "
     << (p >> 3 & 2047) << ", poll_us " << (p >> 14);
  return os.str();
}

}  // namespace

void check_same_plan_everywhere(const Plan& plan, const std::string& version, Comm& comm, const std::string& also) {
  // Every rank reaches each refusal below with the same data: one line, from rank 0.
  auto refuse = [&](const std::string& why) { throw AgreedError(why, comm.rank() == 0); };
  // The first collective: a rank that could not start meets the others here (kFailedBeforeComm).
  const std::vector<uint64_t> comms = comm.all_gather_u64(pack_comm(plan.comm));
  for (int r = 0; r < comm.world(); ++r)
    if (comms[size_t(r)] & kFailedBeforeComm) throw AgreedError("rank " + std::to_string(r) + " could not start", false);
  for (int r = 0; r < comm.world(); ++r)
    if (comms[size_t(r)] != comms[0])
      refuse("rank " + std::to_string(r) + " runs a different plan or binary than rank 0: its comm settings (" +
             comm_text(comms[size_t(r)]) + ") are not rank 0's (" + comm_text(comms[0]) +
             "), most likely from the environment: ZT_COMM_THREAD, ZT_COMM_COLLECTIVES, ZT_COMM_INFLIGHT and "
             "ZT_COMM_POLL_US override the plan's comm section, so set them alike for every rank (mpirun -x NAME=VALUE "
             "applies to all) or for none");
  const uint64_t h = plan_hash(plan.resolved.dump() + "|" + version + "|" + also);
  const std::vector<uint64_t> all = comm.all_gather_u64(h);
  for (int r = 0; r < comm.world(); ++r)
    if (all[size_t(r)] != all[0]) {
      std::ostringstream os;
      os << "rank " << r << " runs a different plan or binary than rank 0 (plan+version hash " << std::hex << all[size_t(r)]
         << " vs " << all[0] << "); give every rank the same plan file, --set flags, options, ZT_COMM_* environment (an "
         << "override is part of the plan) and build";
      refuse(os.str());
    }
  const int skip = plan.comm.fault_skip_rank;
  if (skip >= comm.world())
    refuse("plan: comm.fault_skip_rank: " + std::to_string(skip) + " is not a rank of this run (world " +
           std::to_string(comm.world()) + ": ranks 0-" + std::to_string(comm.world() - 1) + "; -1 = off)");
}

}  // namespace zt
