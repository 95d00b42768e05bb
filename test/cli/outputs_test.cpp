// The run's output files: refused up front without writing anything, directories created only
// when the run starts, an earlier run moved aside (its traces too), the final weights never
// half-written; the one output-path check (runtime/output_path.h) against inputs and other outputs.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "plan/plan.h"
#include "runtime/error.h"
#include "temp_dir.h"
#include "runtime/output_path.h"
#include "train/outputs.h"

namespace fs = std::filesystem;

namespace {
const std::string kBase = std::string(ZT_SOURCE_DIR) + "/plans/base.json";

class Outputs : public TempDirTest {
 protected:
  Outputs() : TempDirTest("zt_outputs") {}
  zt::Plan plan(const std::string& log, const std::string& weights = "", const std::string& trace = "") const {
    return zt::load_plan(kBase, {"run.log=" + log, "run.final_weights=" + weights, "run.trace=" + trace}, false);
  }
  static zt::RunOutputs check(const zt::Plan& p, uint64_t bytes, int world = 1) {
    return zt::check_run_outputs(p, bytes, world);
  }
  // Files in the test directory whose name begins with `prefix`.
  std::vector<std::string> named(const std::string& prefix) const {
    std::vector<std::string> v;
    for (const auto& e : fs::directory_iterator(dir_))
      if (e.path().filename().string().rfind(prefix, 0) == 0) v.push_back(e.path().filename().string());
    std::sort(v.begin(), v.end());
    return v;
  }
  std::vector<std::string> listing() const {
    std::vector<std::string> v;
    for (const auto& e : fs::recursive_directory_iterator(dir_)) v.push_back(e.path().string());
    std::sort(v.begin(), v.end());
    return v;
  }
  // The message of the zt::Error that f throws ("" if none).
  template <class F>
  static std::string error_of(F f) {
    try {
      f();
    } catch (const zt::Error& e) {
      return e.what();
    }
    return "";
  }
};

std::string slurp(const std::string& p) {
  std::ifstream f(p);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

TEST_F(Outputs, RefusesWhatIsNotARegularFileAndWritesNothing) {
  fs::create_directories(path("d"));
  ASSERT_EQ(mkfifo(path("fifo").c_str(), 0600), 0);
  const auto before = listing();
  std::string e = error_of([&] { check(plan(path("run/m.jsonl"), path("d")), 100); });
  EXPECT_EQ(e.rfind("run.final_weights: " + path("d") + " is a directory", 0), 0u) << e;
  e = error_of([&] { check(plan(path("run/m.jsonl"), path("fifo")), 100); });
  EXPECT_EQ(e.rfind("run.final_weights: " + path("fifo") + " is not a regular file (a FIFO)", 0), 0u) << e;
  e = error_of([&] { check(plan(path("d")), 0); });
  EXPECT_EQ(e.rfind("run.log: " + path("d") + " is a directory", 0), 0u) << e;
  e = error_of([&] { check(plan(path("run/plan.json")), 0); });
  EXPECT_EQ(e.rfind("run.log: " + path("run/plan.json") + " is where the resolved plan is written", 0), 0u) << e;
  e = error_of([&] { check(plan(path("run/m.jsonl"), path("run/w.bin")), uint64_t(1) << 62); });
  EXPECT_EQ(e.rfind("run.final_weights: " + path("run/w.bin") + " needs 4194304.00 TiB but " + dir_.string() + " has only",
                    0),
            0u)
      << e;
  EXPECT_EQ(listing(), before);  // probe files removed, no directory created
}

TEST_F(Outputs, DirectoriesAreCreatedWhenTheRunStartsAndSymlinksFollowed) {
  const zt::Plan p = plan(path("run/a/m.jsonl"), path("w/b/final.bin"));
  const zt::RunOutputs out = check(p, 100);
  EXPECT_FALSE(fs::exists(path("run")));
  EXPECT_FALSE(fs::exists(path("w")));
  EXPECT_EQ(zt::open_run_outputs(p, out), "");
  EXPECT_TRUE(fs::is_directory(path("w/b")));
  EXPECT_EQ(out.plan_json, path("run/a/plan.json"));
  EXPECT_NE(slurp(out.plan_json).find("\"final_weights\""), std::string::npos);

  std::ofstream(path("real.bin")) << "old";
  fs::create_symlink(path("real.bin"), path("link.bin"));
  const zt::RunOutputs linked = check(plan(path("run/a/m.jsonl"), path("link.bin")), 100);
  EXPECT_EQ(linked.final_weights, fs::canonical(path("real.bin")).string());
}

TEST_F(Outputs, EarlierRunMovesAsideTogether) {
  const zt::Plan p = plan(path("run/m.jsonl"));
  zt::RunOutputs out = check(p, 0);
  zt::open_run_outputs(p, out);
  std::ofstream(path("run/m.jsonl")) << "first\n";
  const std::string first_plan = slurp(path("run/plan.json"));
  std::ofstream(path("run/plan.json.1")) << "someone else's\n";  // .1 taken for one of the pair: both go to .2
  const std::string moved = zt::open_run_outputs(p, out);
  EXPECT_NE(moved.find("m.jsonl -> m.jsonl.2, plan.json -> plan.json.2"), std::string::npos) << moved;
  EXPECT_EQ(slurp(path("run/m.jsonl.2")), "first\n");
  EXPECT_EQ(slurp(path("run/plan.json.2")), first_plan);
  EXPECT_EQ(slurp(path("run/plan.json.1")), "someone else's\n");
  EXPECT_FALSE(fs::exists(path("run/m.jsonl")));  // the new run's log is opened by the trainer
}

TEST_F(Outputs, FinalWeightsNeverHalfWritten) {
  std::ofstream(path("w.bin")) << "previous weights";
  std::ofstream(path("w.bin.tmp")) << "someone else's";  // not ours: never written nor removed
  std::string e = error_of([&] {
    zt::write_by_rename("run.final_weights", path("w.bin"), [](const std::string& tmp) {
      std::ofstream(tmp) << "half";
      throw zt::Error("cannot write " + tmp + ": No space left on device");
    });
  });
  EXPECT_EQ(e.rfind("run.final_weights: cannot write " + path("w.bin.tmp."), 0), 0u) << e;
  EXPECT_EQ(named("w.bin"), (std::vector<std::string>{"w.bin", "w.bin.tmp"}));
  EXPECT_EQ(slurp(path("w.bin")), "previous weights");

  // What was checked changed during the run (a directory, a FIFO took the name): not replaced,
  // the finished result kept beside it and named.
  fs::create_directories(path("taken/x"));
  ASSERT_EQ(mkfifo(path("fifo").c_str(), 0600), 0);
  for (const char* name : {"taken", "fifo"}) {
    e = error_of([&] {
      zt::write_by_rename("run.final_weights", path(name), [](const std::string& tmp) { std::ofstream(tmp) << "w"; });
    });
    EXPECT_EQ(e.rfind("run.final_weights: " + path(name) + " changed during the run (it is ", 0), 0u) << e;
    const std::vector<std::string> kept = named(std::string(name) + ".tmp.");
    ASSERT_EQ(kept.size(), 1u);
    EXPECT_NE(e.find("the result is kept in " + path(kept[0])), std::string::npos) << e;
  }
  EXPECT_TRUE(fs::is_directory(path("taken/x")));
  EXPECT_TRUE(fs::is_fifo(path("fifo")));

  zt::write_by_rename("run.final_weights", path("w.bin"), [](const std::string& tmp) { std::ofstream(tmp) << "new"; });
  EXPECT_EQ(slurp(path("w.bin")), "new");
  EXPECT_EQ(slurp(path("w.bin.tmp")), "someone else's");
  EXPECT_EQ(named("w.bin"), (std::vector<std::string>{"w.bin", "w.bin.tmp"}));
}

TEST_F(Outputs, NeverAnInputNorAnotherOutput) {
  std::ofstream(path("in.bin")) << "input";
  fs::create_hard_link(path("in.bin"), path("alias.bin"));  // another name, the same file
  fs::create_directories(path("ckpt/step_1"));
  std::ofstream(path("ckpt/step_1/rank_00000.h5")) << "shard";
  zt::OutputPaths paths;
  paths.input("model.init", path("in.bin"));
  paths.input("the checkpoint", path("ckpt/step_1"));
  std::string e = error_of([&] { paths.output("out", path("alias.bin")); });
  EXPECT_EQ(e, "out: " + path("alias.bin") + " is one of this command's inputs (model.init: " + path("in.bin") +
                   "); write it elsewhere");
  e = error_of([&] { paths.output("out", path("ckpt/step_1/new/x.bin")); });  // new, inside an input
  EXPECT_EQ(e.rfind("out: " + path("ckpt/step_1/new/x.bin") + " is inside one of this command's inputs (the checkpoint", 0),
            0u)
      << e;
  EXPECT_EQ(paths.output("a", path("new/x.bin")), path("new/x.bin"));
  e = error_of([&] { paths.output("b", path("new/sub/../x.bin")); });  // neither exists: canonical parent + name
  EXPECT_EQ(e, "b: " + path("new/sub/../x.bin") + " is also where a goes; give each output its own path");
  EXPECT_EQ(slurp(path("in.bin")), "input");
}

// `dir/` that does not exist yet was accepted, and the write at the end (after every step of a run)
// left the result in a hidden dir/.tmp.XXXXXX after saying the directory "changed during the run".
TEST_F(Outputs, APathSpelledAsADirectoryIsRefusedUpFront) {
  const auto before = listing();
  for (const std::string& p : {path("new") + "/", path("new") + "/.", path("new") + "/.."}) {
    std::string e = error_of([&] { check(plan(path("run/m.jsonl"), p), 100); });
    EXPECT_EQ(e.rfind("run.final_weights: " + p + " ends in \"", 0), 0u) << e;
    EXPECT_NE(e.find("it names a directory, not a file"), std::string::npos) << e;
    e = error_of([&] { zt::check_output_path("--out", p); });
    EXPECT_EQ(e.rfind("--out: " + p + " ends in \"", 0), 0u) << e;
  }
  EXPECT_EQ(listing(), before);
}

// Every file of the plan's "extends" chain is an input: a parent plan.json beside run.log was
// moved aside to plan.json.1 as "an earlier run's files".
TEST_F(Outputs, APlanItExtendsIsAnInput) {
  fs::create_directories(path("run"));
  std::ofstream(path("run/plan.json")) << "{\"extends\": \"" << kBase << "\"}\n";
  std::ofstream(path("child.json")) << "{\"extends\": \"run/plan.json\"}\n";
  const zt::Plan p = zt::load_plan(path("child.json"), {"run.log=" + path("run/m.jsonl")}, false);
  EXPECT_EQ(p.files, (std::vector<std::string>{path("child.json"), path("run/plan.json"), kBase}));
  const std::string e = error_of([&] { check(p, 0); });
  EXPECT_EQ(e, "run.log (the resolved plan beside it): " + path("run/plan.json") +
                   " is one of this command's inputs (a plan it extends: " + path("run/plan.json") + "); write it elsewhere");
  EXPECT_FALSE(fs::exists(path("run/plan.json.1")));
}

// A plan and its report: a failure while writing either replaces neither (the planner once wrote
// the plan, then failed on the report: a new plan beside an old report, or none).
TEST_F(Outputs, FilesWrittenTogetherAreAllReplacedOrNone) {
  std::ofstream(path("best.json")) << "old plan";
  std::ofstream(path("best.report.json")) << "old report";
  const std::string e = error_of([&] {
    zt::write_by_rename(std::vector<zt::FileToWrite>{
        {"--out (its report)", path("best.report.json"), nullptr, "new report"},
        {"--out", path("best.json"), [](const std::string& tmp) {
           std::ofstream(tmp) << "half";
           throw zt::Error("cannot write: No space left on device");
         }, ""}});
  });
  EXPECT_EQ(e, "--out: cannot write: No space left on device; none of " + path("best.report.json") + ", " +
                   path("best.json") + " was replaced");
  EXPECT_EQ(slurp(path("best.json")), "old plan");
  EXPECT_EQ(slurp(path("best.report.json")), "old report");
  EXPECT_EQ(named("best"), (std::vector<std::string>{"best.json", "best.report.json"}));  // no temporary file left
  zt::write_by_rename(std::vector<zt::FileToWrite>{{"--out (its report)", path("best.report.json"), nullptr, "new report"},
                                                   {"--out", path("best.json"), nullptr, "new plan"}});
  EXPECT_EQ(slurp(path("best.json")), "new plan");
  EXPECT_EQ(slurp(path("best.report.json")), "new report");
}

TEST_F(Outputs, EarlierTracesMoveAsideWithTheLog) {
  // An earlier 2-rank run's traces; this run has one rank: both move aside, so a glob of
  // trace.rank*.json finds only this run's file.
  fs::create_directories(path("run"));
  for (const char* f : {"run/m.jsonl", "run/trace.rank0.json", "run/trace.rank1.json", "run/trace.rank0.json.bak"})
    std::ofstream(path(f)) << f;
  const zt::Plan p = plan(path("run/m.jsonl"), "", path("run/trace.json"));
  const zt::RunOutputs out = check(p, 0);
  EXPECT_EQ(out.trace, path("run/trace.rank0.json"));
  const std::string moved = zt::open_run_outputs(p, out);
  EXPECT_NE(moved.find("trace.rank1.json -> trace.rank1.json.1"), std::string::npos) << moved;
  EXPECT_EQ(slurp(path("run/trace.rank0.json.1")), "run/trace.rank0.json");
  EXPECT_EQ(slurp(path("run/trace.rank1.json.1")), "run/trace.rank1.json");
  EXPECT_EQ(slurp(path("run/trace.rank0.json.bak")), "run/trace.rank0.json.bak");  // not a rank's trace: left alone
  EXPECT_FALSE(fs::exists(path("run/trace.rank1.json")));
}

}  // namespace
