// The run's output files: refused up front without writing anything, directories created only
// when the run starts, an earlier run moved aside, the final weights never half-written.
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
#include "temp_dir_test.h"
#include "train/outputs.h"

namespace fs = std::filesystem;

namespace {
const std::string kBase = std::string(ZT_SOURCE_DIR) + "/plans/base.json";

class Outputs : public TempDirTest {
 protected:
  Outputs() : TempDirTest("zt_outputs") {}
  zt::Plan plan(const std::string& log, const std::string& weights = "") const {
    return zt::load_plan(kBase, {"run.log=" + log, "run.final_weights=" + weights}, false);
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
  std::string e = error_of([&] { zt::check_run_outputs(plan(path("run/m.jsonl"), path("d")), 100); });
  EXPECT_EQ(e.rfind("run.final_weights: " + path("d") + " is a directory", 0), 0u) << e;
  e = error_of([&] { zt::check_run_outputs(plan(path("run/m.jsonl"), path("fifo")), 100); });
  EXPECT_EQ(e.rfind("run.final_weights: " + path("fifo") + " is not a regular file (a FIFO)", 0), 0u) << e;
  e = error_of([&] { zt::check_run_outputs(plan(path("d")), 0); });
  EXPECT_EQ(e.rfind("run.log: " + path("d") + " is a directory", 0), 0u) << e;
  e = error_of([&] { zt::check_run_outputs(plan(path("run/plan.json")), 0); });
  EXPECT_EQ(e.rfind("run.log: " + path("run/plan.json") + " is where the resolved plan is written", 0), 0u) << e;
  e = error_of([&] { zt::check_run_outputs(plan(path("run/m.jsonl"), path("run/w.bin")), uint64_t(1) << 62); });
  EXPECT_EQ(e.rfind("run.final_weights: " + path("run/w.bin") + " needs 4194304.00 TiB but " + dir_.string() + " has only",
                    0),
            0u)
      << e;
  EXPECT_EQ(listing(), before);  // probe files removed, no directory created
}

TEST_F(Outputs, DirectoriesAreCreatedWhenTheRunStartsAndSymlinksFollowed) {
  const zt::Plan p = plan(path("run/a/m.jsonl"), path("w/b/final.bin"));
  const zt::RunOutputs out = zt::check_run_outputs(p, 100);
  EXPECT_FALSE(fs::exists(path("run")));
  EXPECT_FALSE(fs::exists(path("w")));
  EXPECT_EQ(zt::open_run_outputs(p, out), "");
  EXPECT_TRUE(fs::is_directory(path("w/b")));
  EXPECT_EQ(out.plan_json, path("run/a/plan.json"));
  EXPECT_NE(slurp(out.plan_json).find("\"final_weights\""), std::string::npos);

  std::ofstream(path("real.bin")) << "old";
  fs::create_symlink(path("real.bin"), path("link.bin"));
  const zt::RunOutputs linked = zt::check_run_outputs(plan(path("run/a/m.jsonl"), path("link.bin")), 100);
  EXPECT_EQ(linked.final_weights, fs::canonical(path("real.bin")).string());
}

TEST_F(Outputs, EarlierRunMovesAsideTogether) {
  const zt::Plan p = plan(path("run/m.jsonl"));
  zt::RunOutputs out = zt::check_run_outputs(p, 0);
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
  std::string e = error_of([&] {
    zt::write_by_rename("run.final_weights", path("w.bin"), [](const std::string& tmp) {
      std::ofstream(tmp) << "half";
      throw zt::Error("cannot write " + tmp + ": No space left on device");
    });
  });
  EXPECT_EQ(e, "run.final_weights: cannot write " + path("w.bin.tmp") + ": No space left on device");
  EXPECT_FALSE(fs::exists(path("w.bin.tmp")));
  EXPECT_EQ(slurp(path("w.bin")), "previous weights");

  // The rename itself fails (a non-empty directory has the name): the temporary goes too.
  fs::create_directories(path("taken/x"));
  e = error_of([&] {
    zt::write_by_rename("run.final_weights", path("taken"), [](const std::string& tmp) { std::ofstream(tmp) << "w"; });
  });
  EXPECT_EQ(e.rfind("run.final_weights: cannot rename " + path("taken.tmp"), 0), 0u) << e;
  EXPECT_FALSE(fs::exists(path("taken.tmp")));

  zt::write_by_rename("run.final_weights", path("w.bin"), [](const std::string& tmp) { std::ofstream(tmp) << "new"; });
  EXPECT_EQ(slurp(path("w.bin")), "new");
  EXPECT_FALSE(fs::exists(path("w.bin.tmp")));
}

}  // namespace
