#include "autoplan/plan_inputs.h"

#include <algorithm>
#include <filesystem>
#include <vector>

#include "autoplan/calibrate.h"
#include "autoplan/device_plan.h"
#include "autoplan/ranking.h"
#include "model/config.h"
#include "offload/nvme_dir.h"
#include "runtime/error.h"
#include "runtime/output_path.h"
#include "train/backend_choice.h"
#include "train/inputs.h"

namespace zt::autoplan {

PlanInputs check_inputs(const PlanRequest& req, Comm& comm) {
  const int world = req.world;
  ZT_REQUIRE(comm.world() == world, "plan: --world " << world << " but " << comm.world() << " rank(s) were launched: the "
                                    << "planner measures the link and the cores as the ranks will share them, so run it "
                                    << "with the ranks it plans for" << (world > 1 ? ": mpirun -np " + std::to_string(world) + " ./train plan ..." : ""));
  ZT_REQUIRE(req.show >= 1 && req.show <= 100000, "plan: --show must be 1-100000 rows, got " << req.show);
  ZT_REQUIRE(req.validate_steps >= 2 && req.validate_steps <= 1000,
             "plan: --validate-steps must be 2-1000 (the first step is not timed), got " << req.validate_steps);
  ZT_REQUIRE(req.validate_rounds >= 1 && req.validate_rounds <= 10,
             "plan: --validate-rounds must be 1-10, got " << req.validate_rounds);
  ZT_REQUIRE(!req.out.empty(), "plan: --out FILE is required: where the chosen plan is written");

  Plan base = load_plan(req.base, req.overrides, /*check_files=*/false);
  if (!req.comm.is_null()) {  // the settings the ranks run (ZT_COMM_* applied): every candidate gets them
    nlohmann::json j = base.resolved;
    j["comm"] = req.comm;
    Plan with_comm = plan_from_json(j, false);
    with_comm.source = base.source;
    with_comm.files = base.files;  // the extends chain: inputs no output may replace
    base = std::move(with_comm);
  }
  const std::string backend = planned_backend(base, world);
  // The cost model is calibrated on the CPU backend only; on the CUDA backend the planner sizes
  // memory and predicts nothing (docs/autoplan.md, "On the CUDA backend").
  const bool on_device = backend.rfind("cpu-", 0) != 0;
  ZT_REQUIRE(backend != "cpu-bf16", "plan: precision.compute \"bf16\" on the CPU backend is not planned yet (its "
                                    "probes time fp32 products and its count has no bf16 workspace); plan with "
                                    "precision.compute \"fp32\", then train the chosen plan with \"bf16\"");
  ZT_REQUIRE(!on_device || req.validate == 0,
             "plan: --validate compares predicted with measured step times, and on the CUDA backend nothing is "
             "predicted (no rates are measured for it): train the chosen plan itself");

  // --validate trains: its data must be there before anything is measured.
  if (req.validate != 0) (void)plan_from_json(base.resolved, /*check_files=*/true);

  // Every output is checked before anything is measured (runtime/output_path.h).
  const std::string cache = req.calibration.empty() ? default_cache_path() : req.calibration;
  // The cache is read and rewritten: an output, so that neither it nor --out can be an input or each other.
  OutputPaths paths;
  register_plan_inputs(paths, base);
  paths.output("--calibration", cache);
  const std::string out = paths.output("--out", req.out);
  const std::string report = paths.output("--out (its report)", report_path(req.out));
  // --out's directory, made now (the check found where it can be), not after a minute of probes.
  {
    std::error_code ec;
    const std::filesystem::path dir = std::filesystem::path(out).parent_path();
    if (!dir.empty()) std::filesystem::create_directories(dir, ec);
    ZT_REQUIRE(!ec, "plan: --out " << req.out << ": cannot create its directory " << dir.string() << ": " << ec.message());
  }

  // A base made for a world of its own (batch.world: a plan this command wrote) keeps that world's batch.
  const long global = req.global_batch > 0 ? req.global_batch
                                           : long(base.batch.micro_batch) * base.batch.grad_accum *
                                                 (base.batch.world > 0 ? base.batch.world : world);
  ZT_REQUIRE(global % world == 0, "plan: the global batch of " << global << " sequences does not divide among " << world
                                                               << " ranks: give --global-batch a multiple of " << world);
  const long per_rank = global / world;
  ZT_REQUIRE(per_rank <= 4096, "plan: " << per_rank << " sequences per rank per step is past what the planner searches (4096)");

  // What this host offers (docs/autoplan.md, "Fitting").
  // The least any rank has (ranks on other hosts, or a ZT_MEM_AVAILABLE_BYTES set for one rank):
  // every rank must find the same candidates fit, or their probes would differ and wait on each other.
  HostMemory avail = host_memory_available();
  for (uint64_t x : comm.all_gather_u64(avail.bytes))
    if (x && (avail.bytes == 0 || x < avail.bytes)) avail.bytes = x;
  const int local = comm.local_world();
  bool nvme = true, direct = true;
  uint64_t nvme_free = 0;
  std::string nvme_why;
  if (!on_device) offload::check_nvme_free_override();
  if (!on_device) try {
      const offload::NvmeDir d = offload::check_nvme_dir(base.offload.nvme_dir, 0, "");
      nvme_free = d.free_bytes;
      direct = d.direct;
    } catch (const Error& e) {
      nvme = false;
      nvme_why = e.what();
    }
  {
    const std::vector<uint64_t> ok = comm.all_gather_u64(nvme ? 1 : 0), free = comm.all_gather_u64(nvme_free),
                                dio = comm.all_gather_u64(direct ? 1 : 0);
    for (size_t r = 0; r < ok.size(); ++r) {
      if (nvme && !ok[r]) nvme = false, nvme_why = "not on rank " + std::to_string(r);
      nvme_free = std::min(nvme_free, free[r]);
      direct = direct && dio[r];
    }
  }
  const uint64_t device_avail = on_device ? device_bytes_per_rank(comm) : 0;

  // The least any candidate can hold, by arithmetic before sizing each one (at 65536 layers sizing
  // the candidates took minutes, then found none fit): every candidate keeps the fp32 weights,
  // gradients and two AdamW moments somewhere, at best sharded over the ranks (stage 3), in host
  // memory or the swap files.
  if (!on_device && avail.bytes > 0) {
    const double C = base.model.n_embd, psi = double(base.model.n_layer) * 12 * C * C +
                                              double(GPTConfig::pad_vocab(base.model.vocab_size)) * C;
    const double least = 16 * psi / world * local, room = double(avail.bytes) + (nvme ? double(nvme_free) : 0);
    if (least > room)
      throw Error("plan: no candidate fits: " + std::to_string(base.model.n_layer) + " layers of " +
                  std::to_string(base.model.n_embd) + " channels hold at least " + mib(psi * 4) +
                  " of fp32 weights, and their gradients and two AdamW moments as much each: at least " +
                  mib(least) + " on this host at best sharded over " + std::to_string(world) + " rank(s) (" +
                  std::to_string(local) + " here); available: " + mib(double(avail.bytes)) + " host (" + avail.source +
                  ")" + (nvme ? " and " + mib(double(nvme_free)) + " in " + base.offload.nvme_dir : ", no offload (" + nvme_why + ")"));
  }
  return {world,     std::move(base), backend, on_device, cache,     out,       report,   global, per_rank,
          avail,     local,           nvme,    direct,    nvme_free, nvme_why,  device_avail};
}

}  // namespace zt::autoplan
