// zerotrain entry point: CLI -> Plan -> Trainer. Reads as a table of contents; the work is in src/.
//
//   ./train PLAN.json [--set a.b=v ...]     train one rank on the plan
//
// Every failure is a zt::Error caught here: one line on stderr, exit code 1.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "plan/plan.h"
#include "runtime/error.h"
#include "train/trainer.h"

namespace {

// The resolved plan is printed, and written beside the metrics log so a run can be repeated
// exactly (./train runs/x/plan.json). Only after validation: bad input writes nothing.
void publish_plan(const zt::Plan& plan) {
  std::printf("plan %s (resolved):\n%s\n\n", plan.source.c_str(), plan.resolved.dump(2).c_str());
  const std::filesystem::path log_path(plan.run.log);
  const std::filesystem::path dir = log_path.has_parent_path() ? log_path.parent_path() : ".";
  std::filesystem::create_directories(dir);
  const std::filesystem::path out = dir / "plan.json";
  std::ofstream f(out);
  f << plan.resolved.dump(2) << "\n";
  ZT_REQUIRE(f, "cannot write the resolved plan to " << out.string());
}

int run(int argc, char** argv) {
  CLI::App app{"zerotrain: train GPT-2 from a JSON plan (see README.md and plans/)"};
  app.set_version_flag("--version", "zerotrain " ZT_VERSION);
  std::string plan_path;
  std::vector<std::string> overrides;
  app.add_option("plan", plan_path, "plan file (JSON); defaults come from plans/base.json")->required();
  app.add_option("--set", overrides, "override a plan field, e.g. --set optim.lr=3e-4 --set run.steps=100")
      ->type_name("KEY=VALUE");
  app.footer("Multi-rank training, ZeRO stages, offload and checkpoints are not available in this build yet;\n"
             "plans that ask for them are rejected with a message naming the field.");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }

  const zt::Plan plan = zt::load_plan(plan_path, overrides);
  publish_plan(plan);
  const zt::TrainResult r = zt::train(plan);
  return r.steps == plan.run.steps ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const zt::Error& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "error: %s\n", e.what());
  } catch (const std::exception& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "error: %s\n", e.what());
  }
  return 1;
}
