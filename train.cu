// zerotrain entry point: CLI -> Plan -> Comm -> Trainer. Reads as a table of contents; the work is in src/.
//
//   ./train PLAN.json [--set a.b=v ...]                 train (one rank, or N under mpirun -np N)
//   ./train estimate PLAN.json --world N [--json]       per-rank memory and bytes per step, no allocation
//   ./train export CKPT --format hdf5|llmc --out FILE    a checkpoint's fp32 weights as one file
//   ./train plan BASE.json --world N --out BEST.json     the fastest plan that fits (under mpirun -np N)
//
// Every failure is a zt::Error caught here: one line on stderr, exit code 1. With several ranks, a
// failure every rank knows of (zt::AgreedError: a bad plan, ranks that disagree) is printed once and
// every rank exits 1; one only the failing rank knows of takes the others down (MPI_Abort) so
// nothing hangs.
#include <cstdio>
#include <functional>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "autoplan/planner.h"
#include "checkpoint/checkpoint.h"
#include "comm/comm.h"
#include "plan/plan.h"
#include "runtime/error.h"
#include "runtime/launcher.h"
#include "runtime/support.h"
#include "train/backend_choice.h"
#include "train/same_plan.h"
#include "train/startup_checks.h"
#include "train/trainer.h"
#include "zero/estimate.h"

namespace {

std::unique_ptr<zt::Comm> g_comm;  // for the error path in main()
// Training and planning ranks that fail before the communicator exists (a bad plan) still meet the
// others at the first collective (check_same_plan_everywhere), so that one line reports it. Not for
// estimate and export, whose ranks never meet.
bool g_meet_on_failure = false;

// The resolved plan is printed at start. The trainer writes it beside the metrics log (so a run
// can be repeated exactly: ./train runs/x/plan.json) once every check has passed: bad input
// writes nothing.
void print_plan(const zt::Plan& plan) {
  std::printf("plan %s (resolved):\n%s\n\n", plan.source.c_str(), plan.resolved.dump(2).c_str());
}

bool launched_several() {
  try {
    return zt::this_launch().world > 1;
  } catch (const std::exception&) {  // its own variables unreadable: the error being reported, maybe
    return false;
  }
}

// A rank that failed before the communicator existed, under a launcher that started several: it
// joins the others' first collective (check_same_plan_everywhere) with its message's hash. Returns
// whether this rank prints the message: the lowest failing rank does, once every failing rank's
// message is the same one, and the ranks that did start stay quiet.
bool meet_after_early_failure(const std::string& msg) {
  try {
    g_comm = zt::make_mpi_comm(zt::CommOptions{});
    if (g_comm->world() < 2) return true;
    const uint64_t mine = zt::kFailedBeforeComm | zt::plan_hash(msg);
    const std::vector<uint64_t> all = g_comm->all_gather_u64(mine);
    for (int r = 0; r < g_comm->world(); ++r)
      if (all[size_t(r)] & zt::kFailedBeforeComm) {
        if (all[size_t(r)] == mine) return r == g_comm->rank();
        return true;  // different failures: each says its own
      }
    return true;
  } catch (const std::exception&) {
    return true;
  }
}

// The plan's comm section as the comm layer takes it (it knows no plan), with the ZT_COMM_*
// overrides applied. What runs is written back into the plan, so that plan.json repeats this run and
// the plan hash every rank compares covers it (ranks disagreeing on the ring or the thread would
// not match their collectives). `notes`: one line per override, printed at start.
zt::CommOptions comm_options(zt::Plan& plan, std::vector<std::string>& notes) {
  zt::CommOptions co;
  co.timeout_s = plan.comm.timeout_s;
  co.fault_skip_rank = plan.comm.fault_skip_rank;
  co.fault_skip_step = plan.comm.fault_skip_step;
  co.thread = plan.comm.thread;
  co.collectives = zt::parse_comm_collectives("comm.collectives", plan.comm.collectives);
  co.inflight = plan.comm.inflight;
  co.poll_us = plan.comm.poll_us;
  for (const zt::CommEnvOverride& o : zt::apply_comm_env(co))
    notes.push_back("environment: " + o.variable + "=" + o.value + " overrides comm." + o.field + " (plan: " +
                    plan.resolved["comm"][o.field].dump() + ")");
  plan.comm.thread = co.thread;
  plan.comm.collectives = zt::comm_collectives_name(co.collectives);
  plan.comm.inflight = co.inflight;
  plan.comm.poll_us = co.poll_us;
  nlohmann::json& c = plan.resolved["comm"];
  c["thread"] = co.thread;
  c["collectives"] = plan.comm.collectives;
  c["inflight"] = co.inflight;
  c["poll_us"] = co.poll_us;
  return co;
}

// The forms ./train takes. CLI11's generated line ("[OPTIONS] [plan] [SUBCOMMAND]") suggested
// ./train PLAN estimate, which is not one of them.
const char* const kTrainForm = "./train PLAN.json [--set KEY=VALUE ...]";
const char* const kEstimateForm =
    "./train estimate PLAN.json [--world N] [--ranks-per-host K] [--json] [--set KEY=VALUE ...]";
const char* const kExportForm = "./train export CHECKPOINT --format hdf5|llmc --out FILE";
const char* const kPlanForm =
    "[mpirun -np N] ./train plan BASE.json --world N --out BEST.json [--global-batch G] [--validate K|all] "
    "[--validate-steps S] [--validate-rounds R] [--calibration FILE] [--show ROWS] [--set KEY=VALUE ...]";

class UsageFormatter : public CLI::Formatter {
 public:
  std::string make_usage(const CLI::App* app, std::string) const override {
    if (app->get_name() == "estimate") return std::string("Usage: ") + kEstimateForm + "\n";
    if (app->get_name() == "export") return std::string("Usage: ") + kExportForm + "\n";
    if (app->get_name() == "plan") return std::string("Usage: ") + kPlanForm + "\n";
    return std::string("Usage: ") + kTrainForm + "\n       " + kEstimateForm + "\n       " + kExportForm +
           "\n       " + kPlanForm + "\n";
  }
};

// A command line CLI11 refused, as the one-line zt::Error every failure is (exit 1; CLI11's own exit
// codes and two-line messages are for --help and --version only).
[[noreturn]] void refuse_command_line(const CLI::ParseError& e) {
  std::string what = e.what();
  for (char& c : what)
    if (c == '\n') c = ' ';
  throw zt::Error("command line: " + what + " (the forms it takes: ./train --help)");
}

int run(int argc, char** argv) {
  CLI::App app{"zerotrain: train GPT-2 from a JSON plan (see README.md and plans/)"};
  app.formatter(std::make_shared<UsageFormatter>());  // before the subcommands, which inherit it
  // Names the backends too: test/cli/bad_input.sh checks it against the build's ZT_HAVE_CUDA.
  app.set_version_flag("--version", std::string("zerotrain " ZT_VERSION) +
                                        (zt::support::device_built("cuda") ? " (CUDA backend: built)"
                                                                           : " (CUDA backend: not built)"));
  std::string plan_path;
  std::vector<std::string> overrides;
  app.add_option("plan", plan_path, "plan file (JSON); defaults come from plans/base.json");
  app.add_option("--set", overrides, "override a plan field, e.g. --set optim.lr=3e-4 --set zero.stage=2")
      ->type_name("KEY=VALUE");

  CLI::App* est = app.add_subcommand("estimate", "per-rank memory (tier x category) and bytes sent per step");
  std::string world_text = "1";  // parsed by zt::parse_world: one clear line for any bad value
  std::string est_plan;          // its own variable: a plan before "estimate" is refused, not taken
  bool as_json = false;
  est->add_option("plan", est_plan, "plan file");
  est->add_option("--world", world_text, "number of ranks, 1-65536 (default 1)")->type_name("N");
  std::string per_host_text = "0";  // 0: not given (zero.shard_group "host" then needs it)
  est->add_option("--ranks-per-host", per_host_text, "ranks on each host, for zero.shard_group \"host\"")
      ->type_name("K");
  est->add_option("--set", overrides, "override a plan field")->type_name("KEY=VALUE");
  est->add_flag("--json", as_json, "print JSON instead of a table");
  CLI::App* exp = app.add_subcommand("export", "a checkpoint's fp32 weights as one file, one tensor at a time");
  std::string ckpt_dir, format, out_path;
  exp->add_option("checkpoint", ckpt_dir, "a step_NNNNNNNN directory, or a checkpoint.dir (its latest)")->required();
  exp->add_option("--format", format, "hdf5 (full tensors by name, as model.h5) or llmc (llm.c model .bin, fp32)")
      ->required();
  exp->add_option("--out", out_path, "output file")->required();
  CLI::App* pln = app.add_subcommand("plan", "the fastest plan that fits this machine, with predicted step times "
                                             "(on the CUDA backend: the memory ladder's first that fits; docs/autoplan.md)");
  zt::autoplan::PlanRequest preq;
  std::string plan_world = "1", validate_text = "0", global_batch_text;
  pln->add_option("plan", preq.base, "base plan file: the model, data, optimizer and global batch to keep");
  pln->add_option("--world", plan_world, "ranks to plan for, launched as mpirun -np N (default 1)")->type_name("N");
  pln->add_option("--out", preq.out, "where the chosen plan goes (its report beside it: NAME.report.json)")->type_name("FILE");
  pln->add_option("--global-batch", global_batch_text, "sequences per optimizer step (default: the base plan's "
                  "micro_batch x grad_accum x N)")->type_name("G");
  pln->add_option("--validate", validate_text, "run the top K candidates (\"all\": every one that fits) and print "
                  "predicted vs measured (default 0)")->type_name("K");
  pln->add_option("--validate-steps", preq.validate_steps, "steps per validation run, the first not timed (default 4)")
      ->type_name("S");
  pln->add_option("--validate-rounds", preq.validate_rounds, "runs per validated candidate, every other round in "
                  "reverse order; its measured time is its fastest run (default 2)")->type_name("R");
  pln->add_option("--calibration", preq.calibration, "calibration cache (default ~/.cache/zerotrain/calibration.json)")
      ->type_name("FILE");
  pln->add_option("--show", preq.show, "rows of the ranked table (default 12)")->type_name("ROWS");
  pln->add_option("--set", overrides, "override a base plan field")->type_name("KEY=VALUE");
  app.footer("Multi-rank: mpirun -np N ./train PLAN.json. comm.backend \"auto\" (NCCL on the CUDA backend with a GPU\n"
             "per rank, else MPI: host-staged where ranks share a GPU), \"nccl\" or \"mpi\"; NCCL ran on one GPU\n"
             "(world 1); across several GPUs it is tested under emulation only.\n"
             "Checkpoints (docs/checkpoints.md): checkpoint.dir (\"\" = none), checkpoint.every (0 = only on "
             "SIGTERM/SIGINT/SIGHUP/SIGUSR1; a second one during a save abandons it), checkpoint.keep (3), checkpoint.resume (\"none\", \"auto\" = latest in checkpoint.dir, "
             "or a path); ./train export CKPT --format hdf5|llmc --out FILE.\n"
             "Activation recomputation: recompute.policy \"none\" (default: keep every activation), \"selective\"\n"
             "(recompute LayerNorm and GELU outputs in backward) or \"block\" (keep each block's input, rerun its\n"
             "forward in backward); recompute.every k (default 1, block only): every k-th block is recomputed.\n"
             "./train estimate prints the activations of each policy and the forward FLOPs recomputed.\n"
             "./train plan BASE.json --world N --out BEST.json (under mpirun -np N): the fastest plan that fits,\n"
             "from rates measured here (cached per machine); --validate K runs the top K (docs/autoplan.md).\n" +
             zt::support::help());
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    refuse_command_line(e);
  }
  // The plan goes after the subcommand; export reads a checkpoint and takes no plan at all.
  ZT_REQUIRE(!(est->parsed() && !plan_path.empty()),
             "command line: the plan goes after \"estimate\": " << kEstimateForm);
  ZT_REQUIRE(!(exp->parsed() && (!plan_path.empty() || !overrides.empty())),
             "command line: export takes no plan or --set, only a checkpoint: " << kExportForm);

  if (est->parsed()) {
    ZT_REQUIRE(!est_plan.empty(), "command line: no plan given: " << kEstimateForm);
    const int world = zt::parse_world(world_text);
    zt::Plan plan = zt::load_plan(est_plan, overrides, /*check_files=*/false);
    // The backend the run would use, with the run's checks, except that a GPU need not be here:
    // planning a GPU run on a machine without one is what estimate is for.
    const std::string backend = zt::planned_backend(plan, world);
    zt::record_backend(plan, backend);
    zt::record_comm_backend(plan, zt::planned_comm_backend(plan, backend, world));
    int per_host = 0;
    if (per_host_text != "0") {
      try {
        per_host = zt::parse_world(per_host_text);
      } catch (const zt::Error&) {  // its message names --world
        throw zt::Error("--ranks-per-host must be an integer between 1 and " + std::to_string(zt::kMaxWorld) +
                        ", got \"" + zt::clip(per_host_text, 30) + "\"");
      }
    }
    const zt::Estimate e = zt::estimate_plan(plan, world, per_host);
    if (as_json)
      std::printf("%s\n", zt::estimate_json(e).dump(2).c_str());
    else
      std::printf("%s", zt::estimate_text(e).c_str());
    return 0;
  }
  if (pln->parsed()) {
    g_meet_on_failure = true;  // its first collective is check_same_plan_everywhere, as training's
    ZT_REQUIRE(plan_path.empty(), "command line: the plan goes after \"plan\": " << kPlanForm);
    ZT_REQUIRE(!preq.base.empty(), "command line: no base plan given: " << kPlanForm);
    preq.world = zt::parse_world(plan_world);
    // As text: CLI11 took 99999999999999999999 as the largest long and the refusal quoted that.
    if (pln->count("--global-batch")) {
      const std::string& g = global_batch_text;
      const bool digits = !g.empty() && g.size() <= 9 && g.find_first_not_of("0123456789") == std::string::npos;
      ZT_REQUIRE(digits && std::stol(g) >= 1,
                 "--global-batch must be a number of sequences, 1 to 999999999, got \"" << zt::clip(g, 30) << "\"");
      preq.global_batch = std::stol(global_batch_text);
    }
    preq.validate = validate_text == "all" ? -1 : 0;
    if (validate_text != "all") {
      const bool digits = !validate_text.empty() && validate_text.size() <= 6 &&
                          validate_text.find_first_not_of("0123456789") == std::string::npos;
      ZT_REQUIRE(digits, "--validate takes a number of candidates or \"all\", got \"" << zt::clip(validate_text, 30) << "\"");
      preq.validate = std::stoi(validate_text);
    }
    preq.overrides = overrides;
    preq.version = ZT_VERSION;
    std::vector<std::string> env_notes;
    zt::Plan base = zt::load_plan(preq.base, overrides, /*check_files=*/false);
    g_comm = zt::make_mpi_comm(comm_options(base, env_notes));
    zt::check_launch(zt::this_launch(), g_comm->world());
    // Before the first probe: ranks that disagree would measure different collectives and wait on
    // each other for as long as the link probe's timeout allows.
    check_same_plan_everywhere(base, ZT_VERSION, *g_comm,
                               "plan " + std::to_string(preq.world) + " " + std::to_string(preq.global_batch) + " " +
                                   std::to_string(preq.validate) + " " + std::to_string(preq.validate_steps) + " " +
                                   std::to_string(preq.validate_rounds));
    if (g_comm->rank() == 0)
      for (const std::string& n : env_notes) std::printf("%s\n", n.c_str());
    preq.comm = base.resolved["comm"];  // what the probes run on, written into the chosen plan
    const int rc = zt::autoplan::plan_command(preq, *g_comm);
    g_comm->barrier();
    return rc;
  }
  if (exp->parsed()) {
    const zt::ckpt::Transfer t = zt::ckpt::export_weights(ckpt_dir, format, out_path);
    std::printf("%s -> %s (%s)\n", t.summary("exported").c_str(), out_path.c_str(), format.c_str());
    return 0;
  }
  ZT_REQUIRE(!plan_path.empty(), "command line: no plan given: " << kTrainForm << " (see ./train --help)");

  g_meet_on_failure = true;
  zt::Plan plan = zt::load_plan(plan_path, overrides);
  std::vector<std::string> env_notes;
  g_comm = zt::make_mpi_comm(comm_options(plan, env_notes));
  zt::check_launch(zt::this_launch(), g_comm->world());
  check_same_plan_everywhere(plan, ZT_VERSION, *g_comm);
  if (plan.batch.world != 0 && plan.batch.world != g_comm->world()) {  // every rank sees it: said once
    std::ostringstream os;
    os << "plan " << plan.source << " is for " << plan.batch.world << " rank(s) (batch.world), but " << g_comm->world()
       << " were launched: its global batch of " << plan.batch.micro_batch << " x " << plan.batch.grad_accum << " x "
       << plan.batch.world << " sequences would change; run it with mpirun -np " << plan.batch.world
       << ", or plan again for " << g_comm->world() << " (./train plan --world " << g_comm->world()
       << "), or --set batch.world=0 to train micro_batch x grad_accum per rank at any world";
    throw zt::AgreedError(os.str(), g_comm->rank() == 0);
  }
  // Refuse what cannot run here before writing anything; the plan written beside the log then
  // names the device, precision and comm backend that run rather than "auto".
  const std::string backend = zt::choose_backend(plan, g_comm->world());
  zt::record_backend(plan, backend);
  zt::record_comm_backend(plan, zt::choose_comm_backend(plan, backend, *g_comm));
  zt::record_shard_group(plan, zt::agreed_mesh(plan, *g_comm).shard);
  if (g_comm->rank() == 0) {
    for (const std::string& w : plan.warnings) std::fprintf(stderr, "warning: plan: %s\n", w.c_str());
    for (const std::string& n : env_notes) std::printf("%s\n", n.c_str());
    print_plan(plan);
  }
  const zt::TrainResult r = zt::train(plan, *g_comm);
  g_comm->barrier();
  return r.steps == plan.run.steps || r.stopped ? 0 : 1;
}

// The one line every failure prints, at most about 2 KiB: a path or value quoted from a plan can be
// any length (a 50 MB run.log made a 52 MB line), and its head (what failed) and tail (what to do)
// are what a reader needs. Cut between UTF-8 characters, never inside one.
std::string error_line(const std::string& msg) {
  constexpr size_t kHead = 1536, kTail = 512;
  if (msg.size() <= kHead + kTail + 64) return msg;
  size_t head = kHead, tail = msg.size() - kTail;
  while (head > 0 && (static_cast<unsigned char>(msg[head]) & 0xC0) == 0x80) --head;
  while (tail < msg.size() && (static_cast<unsigned char>(msg[tail]) & 0xC0) == 0x80) ++tail;
  return msg.substr(0, head) + " [... " + std::to_string(tail - head) + " bytes not shown ...] " + msg.substr(tail);
}

}  // namespace

int main(int argc, char** argv) {
  std::string msg;
  bool agreed = false, print = true;
  try {
    const int rc = run(argc, argv);
    g_comm.reset();
    return rc;
  } catch (const zt::AgreedError& e) {
    msg = e.what();
    agreed = true;
    print = e.print;
  } catch (const std::exception& e) {
    msg = e.what();
  }
  std::fflush(stdout);
  msg = error_line(msg);
  if (!g_comm && g_meet_on_failure && launched_several()) {
    agreed = true;
    print = meet_after_early_failure(msg);
  }
  if (agreed && g_comm && g_comm->world() > 1) {
    if (print && g_comm->rank() == 0) std::fprintf(stderr, "error: %s\n", msg.c_str());
    if (print && g_comm->rank() != 0) std::fprintf(stderr, "error: rank %d: %s\n", g_comm->rank(), msg.c_str());
    std::fflush(stderr);
    g_comm.reset();  // every rank is here: MPI_Finalize, not MPI_Abort
    return 1;
  }
  if (g_comm && g_comm->world() > 1) {
    std::fprintf(stderr, "error: rank %d: %s\n", g_comm->rank(), msg.c_str());
    std::fflush(stderr);
    g_comm->abort_all(1);
  }
  std::fprintf(stderr, "error: %s\n", msg.c_str());
  return 1;
}
