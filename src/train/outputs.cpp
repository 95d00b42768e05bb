#include "train/outputs.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "runtime/error.h"
#include "train/inputs.h"
#include "runtime/trace.h"

namespace zt {

namespace fs = std::filesystem;

namespace {

void create_directories(const std::string& field, const fs::path& dir) {
  if (dir.empty()) return;
  std::error_code ec;
  fs::create_directories(dir, ec);
  ZT_REQUIRE(!ec, field << ": cannot create directory " << dir.string() << ": " << ec.message());
}

fs::path dir_of(const std::string& path) {
  const fs::path p(path);
  return p.has_parent_path() ? p.parent_path() : fs::path(".");
}

// Every rank's trace file in the directory of `trace` (rank 0's), whatever world wrote it: "X.rank<digits>Y".
std::vector<fs::path> trace_files(const std::string& trace) {
  std::vector<fs::path> found;
  const std::string name = fs::path(trace).filename().string();
  const size_t at = name.rfind(".rank0");
  if (at == std::string::npos) return found;
  const std::string head = name.substr(0, at + 5), tail = name.substr(at + 6);
  std::error_code ec;
  for (const fs::directory_entry& e : fs::directory_iterator(dir_of(trace), ec)) {
    const std::string n = e.path().filename().string();
    if (n.size() <= head.size() + tail.size() || n.compare(0, head.size(), head) != 0 ||
        n.compare(n.size() - tail.size(), tail.size(), tail) != 0)
      continue;
    const std::string digits = n.substr(head.size(), n.size() - head.size() - tail.size());
    if (digits.find_first_not_of("0123456789") == std::string::npos) found.push_back(e.path());
  }
  return found;
}

}  // namespace

RunOutputs check_run_outputs(const Plan& plan, uint64_t final_weights_bytes, int world) {
  OutputPaths paths;
  register_plan_inputs(paths, plan);

  RunOutputs out;
  // Logs and traces are moved aside, never written into: the path itself, not a symlink's target.
  paths.output("run.log", plan.run.log);
  out.log = plan.run.log;
  out.plan_json = (dir_of(out.log) / "plan.json").string();
  ZT_REQUIRE(fs::path(out.log).filename() != "plan.json",
             "run.log: " << plan.run.log << " is where the resolved plan is written; name the log otherwise "
                         << "(e.g. metrics.jsonl)");
  paths.output("run.log (the resolved plan beside it)", out.plan_json);
  // checkpoint.dir must take new files now, not at the first save hours later, and be this run's.
  out.checkpoint = ckpt::open_checkpoint_dir(plan.checkpoint);
  if (!plan.run.final_weights.empty())
    out.final_weights = paths.output("run.final_weights", plan.run.final_weights, final_weights_bytes);
  if (!plan.run.trace.empty()) {
    std::vector<fs::path> mine;  // file names: every rank's trace is in the one directory
    for (int r = 0; r < world; ++r) {
      paths.output("run.trace", Tracer::rank_path(plan.run.trace, r));
      mine.push_back(fs::path(Tracer::rank_path(plan.run.trace, r)).filename());
    }
    out.trace = Tracer::rank_path(plan.run.trace, 0);
    // An earlier run's traces of ranks this run lacks are moved aside too (open_run_outputs): never
    // an input either.
    for (const fs::path& p : trace_files(out.trace))
      if (std::find(mine.begin(), mine.end(), p.filename()) == mine.end())
        paths.output("run.trace (an earlier run's, to be moved aside)", p.string());
  }
  return out;
}

RunOutputs check_rank_outputs(const Plan& plan, int rank) {
  RunOutputs out;
  if (!plan.run.trace.empty()) {
    out.trace = Tracer::rank_path(plan.run.trace, rank);
    check_output_path("run.trace", out.trace);
  }
  return out;
}

std::string open_run_outputs(const Plan& plan, const RunOutputs& out) {
  create_directories("run.log", dir_of(out.log));
  if (!out.final_weights.empty()) create_directories("run.final_weights", dir_of(out.final_weights));
  if (!out.trace.empty()) create_directories("run.trace", dir_of(out.trace));

  // An earlier run's log, plan and traces move aside together (same N), never overwritten: the new
  // run cannot know whether they matter, and a stale trace.rank1.json must not join this run's.
  std::string moved;
  std::vector<fs::path> earlier;
  for (const fs::path& p : {fs::path(out.log), fs::path(out.plan_json)}) {
    std::error_code ec;
    if (fs::exists(fs::symlink_status(p, ec))) earlier.push_back(p);
  }
  if (!out.trace.empty())
    for (const fs::path& p : trace_files(out.trace)) earlier.push_back(p);
  if (!earlier.empty()) {
    auto aside = [](const fs::path& p, int n) { return fs::path(p.string() + "." + std::to_string(n)); };
    int n = 1;
    for (;; ++n) {
      bool free = true;
      for (const fs::path& p : earlier) {
        std::error_code ec;
        if (fs::exists(fs::symlink_status(aside(p, n), ec))) free = false;
      }
      if (free) break;
    }
    std::ostringstream os;
    os << "run.log: an earlier run's files in " << dir_of(out.log).string() << " were moved aside:";
    for (size_t i = 0; i < earlier.size(); ++i) {
      const fs::path to = aside(earlier[i], n);
      std::error_code ec;
      fs::rename(earlier[i], to, ec);
      ZT_REQUIRE(!ec, "run.log: cannot move the earlier " << earlier[i].string() << " aside to " << to.string() << ": "
                                                          << ec.message());
      const bool beside = dir_of(earlier[i].string()) == dir_of(out.log);
      os << (i ? ", " : " ") << (beside ? earlier[i].filename() : earlier[i]).string() << " -> " << to.filename().string();
    }
    moved = os.str();
  }

  std::ofstream f(out.plan_json);
  f << plan.resolved.dump(2) << "\n";
  f.flush();
  ZT_REQUIRE(f, "run.log: cannot write the resolved plan to " << out.plan_json << ": " << std::strerror(errno));
  return moved;
}

}  // namespace zt
