// `train plan` as a pipeline (docs/autoplan.md): each step is a file of src/autoplan/ named for it.
#include "autoplan/planner.h"

#include <cstdio>
#include <exception>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "autoplan/calibrate.h"
#include "autoplan/candidates.h"
#include "autoplan/device_plan.h"
#include "autoplan/engine_runs.h"
#include "autoplan/plan_inputs.h"
#include "autoplan/probes.h"
#include "autoplan/ranking.h"
#include "autoplan/rates.h"
#include "autoplan/validation.h"
#include "runtime/launcher.h"

namespace zt::autoplan {

int plan_command(const PlanRequest& req, Comm& comm) {
  const PlanInputs in = check_inputs(req, comm);
  const int world = in.world;
  const bool root = comm.rank() == 0;
  std::map<std::string, long> dropped;  // candidates the plan's checks refuse, by reason
  std::vector<Candidate> all = size_candidates(req, in, comm, dropped);
  std::vector<Candidate*> fit = fitting(all);
  print_fit(req, in, all.size(), fit.size(), dropped, root);
  if (in.on_device) return plan_for_device(req, in, all, fit, comm);
  if (fit.empty()) refuse_no_fit(all, in);

  // The probe and --validate runs' directories go beside --out (run_steps), and go on every exit.
  const std::string out_dir = std::filesystem::path(in.out).parent_path().string();
  const RunDirSignals run_dir_signals;

  // Calibrate what the candidates that fit need, every rank at once.
  const Plan& base = in.base;
  const int threads = base.run.threads > 0 ? base.run.threads : threads_per_rank(this_launch(), affinity_cpus(), in.local);
  std::vector<std::string> notes;
  Calibration cal(comm, in.cache, threads, req.version, world > 1 ? comm_key(base) : "", notes);
  // What was measured before a failure (a probe run refused, a signal's exception) is kept.
  struct SaveOnThrow {
    Calibration& cal;
    const int pending = std::uncaught_exceptions();
    ~SaveOnThrow() {
      if (std::uncaught_exceptions() > pending) try {
          cal.save();
        } catch (...) {  // the failure itself is the message
        }
    }
  } save_on_throw{cal};
  if (root)
    for (const std::string& n : notes) std::fprintf(n.rfind("warning:", 0) == 0 ? stderr : stdout, "%s\n", n.c_str());
  Measurements m = measure_candidates(in, fit, cal, comm, out_dir, threads);
  for (Candidate* c : fit) price(c, m, in.cache);
  rank(fit);
  print_ranking(req, in, fit, root);

  write_outputs(req, in, all, fit, dropped, m, cal, threads, root);
  if (root) std::printf("wrote %s (run it: %s./train %s) and %s\n", in.out.c_str(),
                        world > 1 ? ("mpirun -np " + std::to_string(world) + " ").c_str() : "", in.out.c_str(),
                        in.report.c_str());
  if (validate(req, in, fit, comm, out_dir)) write_outputs(req, in, all, fit, dropped, m, cal, threads, root);
  return 0;
}

}  // namespace zt::autoplan
