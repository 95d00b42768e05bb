#include "autoplan/device_plan.h"

#include <algorithm>
#include <cstdio>
#include <tuple>

#include "autoplan/ranking.h"
#include "runtime/device.h"
#include "runtime/error.h"
#if ZT_HAVE_CUDA
#include "runtime/cuda_context.h"
#endif

namespace zt::autoplan {

uint64_t device_bytes_per_rank(Comm& comm) {
  uint64_t mine = 0;
#if ZT_HAVE_CUDA
  ZT_REQUIRE(device::available(), "plan: device \"cuda\" but no CUDA device is visible: the planner sizes a CUDA plan "
                                  "against the GPU it will run on; run it there, or size a plan here with ./train "
                                  "estimate --set device=cuda");
  const int gpus = device::count(), gpu = comm.local_rank() % gpus;
  cuda::Context::select(gpu);
  (void)cuda::Context::get();
  comm.barrier();  // every context exists before anyone counts
  int sharing = 0;
  for (int r = 0; r < comm.local_world(); ++r) sharing += r % gpus == gpu;
  const uint64_t share = uint64_t(device::free_bytes()) / uint64_t(sharing);
  mine = share > kDeviceReserve ? share - kDeviceReserve : 0;
#else
  throw Error("plan: device \"cuda\" but this build has no CUDA backend");
#endif
  for (uint64_t x : comm.all_gather_u64(mine)) mine = std::min(mine, x);
  return mine;
}

namespace {

// The memory ladder's order (docs/plans.md: a smaller micro-batch first, then selective, then
// block recomputation, then a higher stage, then offload): a candidate is taken only where every
// one before it does not fit, as a run climbing the ladder would.
auto ladder_key(const Choice& c) {
  const int offload = c.params_offloaded ? 2 : c.optimizer_offloaded ? 1 : 0;
  const int recompute = c.policy == "none" ? 0 : c.policy == "selective" ? 1 : c.every > 1 ? 2 : 3;
  return std::make_tuple(offload, c.stage, recompute, -c.micro_batch, !c.overlap, -c.bucket_mb);
}

void print_memory_table(const std::vector<const Candidate*>& rows, int world) {
  std::printf("  #  stage  offload        recompute  B x GA   bucket  overlap |  device/rank    host/rank   nvme/rank\n");
  int i = 0;
  for (const Candidate* c : rows) {
    const Choice& ch = c->choice;
    char bucket[32] = "-";
    if (world > 1) std::snprintf(bucket, sizeof bucket, "%.2f", ch.bucket_mb);
    std::printf("%3d  %5d  %-13s  %-9s  %2d x %-3d %6s  %-7s | %12s %12s %11s\n", ++i, ch.stage, ch.offload().c_str(),
                ch.recompute().c_str(), ch.micro_batch, ch.grad_accum, bucket, world > 1 ? (ch.overlap ? "on" : "off") : "-",
                mib(double(c->device)).c_str(), mib(double(c->host)).c_str(), mib(double(c->nvme)).c_str());
  }
}

}  // namespace

int plan_for_device(const PlanRequest& req, const PlanInputs& in, const std::vector<Candidate>& all,
                    std::vector<Candidate*> fit, Comm& comm) {
  const int world = in.world, local = in.local;
  const bool root = comm.rank() == 0, on_device = true;
  const HostMemory& avail = in.avail;
  const uint64_t device_avail = in.device_avail;
  const std::string &backend = in.backend, &out = in.out, &report = in.report;
  const long global = in.global;
  if (fit.empty() && on_device) {
    const auto least = std::min_element(all.begin(), all.end(), [](auto& a, auto& b) { return a.device < b.device; });
    throw Error("plan: no candidate fits: the smallest needs " + mib(double(least->device)) + " of GPU memory per rank (" +
                least->choice.label() + ") and " + mib(double(least->host)) + " host memory per rank x " +
                std::to_string(local) + " rank(s) on this host; available: " + mib(double(device_avail)) +
                " per rank on the GPU (free, less " + mib(double(kDeviceReserve)) + " kept), " +
                (avail.bytes ? mib(double(avail.bytes)) : "unknown") + " host (" + avail.source + ")");
  }
  std::stable_sort(fit.begin(), fit.end(), [](const Candidate* a, const Candidate* b) {
    return ladder_key(a->choice) < ladder_key(b->choice);
  });
  const Candidate& best = *fit[0];
  if (root) {
    std::printf("\n");
    std::vector<const Candidate*> rows(fit.begin(), fit.begin() + std::min<size_t>(fit.size(), size_t(req.show)));
    print_memory_table(rows, world);
    if (fit.size() > rows.size()) std::printf("  ... %zu more that fit (all in %s)\n", fit.size() - rows.size(), report.c_str());
    std::printf("\nchosen: %s: the first rung of the memory ladder that fits (docs/plans.md); on the CUDA backend the "
                "planner sizes memory only and predicts no step time (no rates are measured for it)\n",
                best.choice.label().c_str());
    nlohmann::json cands = nlohmann::json::array();
    for (const Candidate* c : fit)
      cands.push_back({{"choice", c->choice.to_json()}, {"device_bytes_per_rank", c->device},
                       {"host_bytes_per_rank", c->host}, {"nvme_bytes_per_rank", c->nvme}});
    const nlohmann::json rep = {{"base", req.base},
                                {"world", world},
                                {"global_batch", global},
                                {"backend", backend},
                                {"chosen_by", "memory ladder"},
                                {"available_device_bytes_per_rank", device_avail},
                                {"device_reserve_bytes", kDeviceReserve},
                                {"available_host_bytes", avail.bytes},
                                {"ranks_per_host", local},
                                {"runtime_overhead_bytes", kRuntimeOverhead},
                                {"candidates", cands}};
    write_plan_and_report(out, best.resolved, report, rep);
    std::printf("wrote %s (run it: %s./train %s) and %s\n", out.c_str(),
                world > 1 ? ("mpirun -np " + std::to_string(world) + " ").c_str() : "", out.c_str(), report.c_str());
  }
  comm.barrier();  // the files exist when any rank returns
  return 0;
}

}  // namespace zt::autoplan
