// Plan values at their edges (issue 23): recompute.every up to INT_MAX, the communication settings
// as plan keys with ZT_COMM_* overrides, and JSON null in plan files and --set.
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <climits>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "comm/comm.h"
#include "model/recompute.h"
#include "plan/plan.h"
#include "runtime/error.h"
#include "zero/estimate.h"

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

const std::string kSrc = ZT_SOURCE_DIR;

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const zt::Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected zt::Error, nothing was thrown";
  return "";
}

zt::Plan plan_with(const std::vector<std::string>& sets) { return zt::load_plan(kSrc + "/plans/base.json", sets, false); }

// A plan file in a fresh directory, removed at the end of the test.
struct PlanFiles {
  fs::path dir;
  PlanFiles() {
    static std::atomic<int> n{0};
    dir = fs::temp_directory_path() / ("zt_plan_edges_" + std::to_string(::getpid()) + "_" + std::to_string(n++));
    fs::create_directories(dir);
  }
  ~PlanFiles() {
    std::error_code ec;
    fs::remove_all(dir, ec);
  }
  std::string write(const std::string& name, const std::string& text) const {
    std::ofstream((dir / name).string()) << text;
    return (dir / name).string();
  }
};

// Sets (or, with nullptr, unsets) one environment variable for the life of the object.
struct ScopedEnv {
  std::string name;
  ScopedEnv(const char* n, const char* value) : name(n) {
    if (value)
      ::setenv(n, value, 1);
    else
      ::unsetenv(n);
  }
  ~ScopedEnv() { ::unsetenv(name.c_str()); }
};

}  // namespace

// ---- recompute.every ---------------------------------------------------------------------------

// (l + every - 1) / every overflowed for every near 2^31: block 0 was recomputed but counted as
// kept, so activations and the kept-slot indices were wrong (losses differed from none).
TEST(RecomputeEvery, RecomputedBlocksAreCountedWithoutOverflow) {
  for (const int every : {1, 2, 3, 7, 8, 9, INT_MAX - 6, INT_MAX - 4, INT_MAX - 1, INT_MAX}) {
    const zt::Recompute rc = zt::Recompute::from("block", every);
    int recomputed = 0;
    for (int l = 0; l <= 9; ++l) {
      EXPECT_EQ(rc.blocks_recomputed_before(l), recomputed) << "every " << every << ", l " << l;
      recomputed += rc.recomputes_block(l);
    }
  }
  EXPECT_EQ(zt::Recompute::from("block", INT_MAX).blocks_recomputed_before(65536), 1);
  EXPECT_EQ(zt::Recompute::from("none", 1).blocks_recomputed_before(65536), 0);
}

// every >= n_layer recomputes block 0 only: the estimate is the every = n_layer arithmetic, never
// more than none's. Past INT_MAX the plan refuses it.
TEST(RecomputeEvery, EveryPastTheLayersEstimatesAsEveryNLayer) {
  auto activations = [](const std::vector<std::string>& sets) {
    std::vector<std::string> s = sets;
    s.push_back("model.n_layer=6");
    return zt::estimate_plan(plan_with(s), 1).recompute.activation_bytes;
  };
  const uint64_t none = activations({});
  const uint64_t at_l = activations({"recompute.policy=block", "recompute.every=6"});
  EXPECT_LE(at_l, none);
  // Before: every in [2^31 - 5, 2^31 - 3] made (6 + every - 1) / every wrap to -1, so 7 of 6 layers
  // were counted as kept (more than none); the others counted block 0 as kept.
  std::vector<int64_t> everies = {7, 1073741824};
  for (int64_t e = INT_MAX - 7; e <= INT_MAX; ++e) everies.push_back(e);
  for (const int64_t every : everies) {
    SCOPED_TRACE(every);
    EXPECT_EQ(activations({"recompute.policy=block", "recompute.every=" + std::to_string(every)}), at_l);
  }
  EXPECT_EQ(error_of([] { plan_with({"recompute.policy=block", "recompute.every=2147483648"}); }),
            "plan: recompute.every: must be <= 2147483647, got 2147483648");
  EXPECT_EQ(error_of([] { plan_with({"recompute.policy=block", "recompute.every=9223372036854775807"}); }),
            "plan: recompute.every: must be <= 2147483647, got 9223372036854775807");
}

// ---- communication settings ---------------------------------------------------------------------

TEST(CommSettings, DefaultsAreWrittenInBaseJson) {
  const json& c = zt::base_plan_json()["comm"];
  EXPECT_EQ(c["thread"], true);
  EXPECT_EQ(c["collectives"], "ring");
  EXPECT_EQ(c["inflight"], 2);
  EXPECT_EQ(c["poll_us"], 50);
  // ... and they are the comm layer's own defaults.
  const zt::CommOptions o;
  EXPECT_EQ(o.thread, c["thread"].get<bool>());
  EXPECT_EQ(zt::comm_collectives_name(o.collectives), c["collectives"].get<std::string>());
  EXPECT_EQ(o.inflight, c["inflight"].get<int>());
  EXPECT_EQ(o.poll_us, c["poll_us"].get<int>());
  const zt::Plan p = plan_with({"comm.thread=false", "comm.collectives=mpi_blocking", "comm.inflight=0", "comm.poll_us=100000"});
  EXPECT_FALSE(p.comm.thread);
  EXPECT_EQ(p.comm.collectives, "mpi_blocking");
  EXPECT_EQ(p.comm.inflight, 0);
  EXPECT_EQ(p.comm.poll_us, 100000);
  EXPECT_EQ(p.resolved["comm"]["inflight"], 0);
}

TEST(CommSettings, PlanValuesAreValidated) {
  const struct {
    const char* set;
    const char* error;
  } cases[] = {
      {"comm.inflight=-1", "plan: comm.inflight: must be >= 0, got -1"},
      {"comm.inflight=1025", "plan: comm.inflight: must be <= 1024, got 1025"},
      {"comm.inflight=99999999999", "plan: comm.inflight: must be <= 1024, got 99999999999"},
      {"comm.inflight=abc", "--set comm.inflight=abc: expected an integer, got string \"abc\""},
      {"comm.inflight=2.5", "--set comm.inflight=2.5: expected an integer, got number 2.5"},
      {"comm.poll_us=-1", "plan: comm.poll_us: must be >= 0, got -1"},
      {"comm.poll_us=100001", "plan: comm.poll_us: must be <= 100000, got 100001"},
      {"comm.collectives=tuned", "plan: comm.collectives: must be \"ring\", \"mpi\" or \"mpi_blocking\", got \"tuned\""},
      {"comm.ring=false",
       "--set comm.ring=false: unknown key \"comm.ring\" (allowed keys in \"comm\": backend, collectives, fault_skip_rank, "
       "fault_skip_step, inflight, poll_us, thread, timeout_s)"},
      {"comm.thread=yes", "--set comm.thread=yes: expected true or false, got string \"yes\""},
  };
  for (const auto& c : cases) EXPECT_EQ(error_of([&] { plan_with({c.set}); }), c.error);
}

// The variables override the plan's values; anything but a valid value is refused in one line
// naming the variable, and nothing is applied then.
TEST(CommSettings, EnvironmentOverridesAreParsedStrictly) {
  ScopedEnv t("ZT_COMM_THREAD", nullptr), r("ZT_COMM_COLLECTIVES", nullptr), i("ZT_COMM_INFLIGHT", nullptr),
      p("ZT_COMM_POLL_US", nullptr);
  zt::CommOptions o;
  EXPECT_TRUE(zt::apply_comm_env(o).empty());
  const struct {
    const char* name;
    const char* value;
    const char* error;
  } bad[] = {
      {"ZT_COMM_INFLIGHT", "abc", "ZT_COMM_INFLIGHT=abc: expected an integer from 0 (no limit) to 1024"},
      {"ZT_COMM_INFLIGHT", "-1", "ZT_COMM_INFLIGHT=-1: expected an integer from 0 (no limit) to 1024"},
      {"ZT_COMM_INFLIGHT", "99999999999", "ZT_COMM_INFLIGHT=99999999999: expected an integer from 0 (no limit) to 1024"},
      {"ZT_COMM_INFLIGHT", "1025", "ZT_COMM_INFLIGHT=1025: expected an integer from 0 (no limit) to 1024"},
      {"ZT_COMM_INFLIGHT", " 3", "ZT_COMM_INFLIGHT= 3: expected an integer from 0 (no limit) to 1024"},
      {"ZT_COMM_POLL_US", "abc",
       "ZT_COMM_POLL_US=abc: expected an integer from 0 (yield between polls) to 100000"},
      {"ZT_COMM_POLL_US", "-1", "ZT_COMM_POLL_US=-1: expected an integer from 0 (yield between polls) to 100000"},
      {"ZT_COMM_POLL_US", "1e3", "ZT_COMM_POLL_US=1e3: expected an integer from 0 (yield between polls) to 100000"},
      {"ZT_COMM_COLLECTIVES", "0", "ZT_COMM_COLLECTIVES=0: expected \"ring\", \"mpi\" or \"mpi_blocking\""},
      {"ZT_COMM_THREAD", "2", "ZT_COMM_THREAD=2: expected 0 (off) or 1 (on)"},
  };
  for (const auto& b : bad) {
    SCOPED_TRACE(std::string(b.name) + "=" + b.value);
    ScopedEnv ok("ZT_COMM_COLLECTIVES", std::string(b.name) == "ZT_COMM_COLLECTIVES" ? b.value : "mpi");  // a valid one alongside
    ScopedEnv e(b.name, b.value);
    zt::CommOptions before;
    zt::CommOptions got = before;
    EXPECT_EQ(error_of([&] { zt::apply_comm_env(got); }), b.error);
    EXPECT_EQ(got.collectives, before.collectives);  // nothing applied
  }
  ScopedEnv t2("ZT_COMM_THREAD", "0"), r2("ZT_COMM_COLLECTIVES", "mpi_blocking"), i2("ZT_COMM_INFLIGHT", "0"), p2("ZT_COMM_POLL_US", "100000");
  const std::vector<zt::CommEnvOverride> used = zt::apply_comm_env(o);
  ASSERT_EQ(used.size(), 4u);
  EXPECT_EQ(used[2].variable, "ZT_COMM_INFLIGHT");
  EXPECT_EQ(used[2].value, "0");
  EXPECT_EQ(used[2].field, "inflight");
  EXPECT_FALSE(o.thread);
  EXPECT_EQ(o.collectives, zt::CommCollectives::mpi_blocking);
  EXPECT_EQ(o.inflight, 0);
  EXPECT_EQ(o.poll_us, 100000);
  ScopedEnv empty("ZT_COMM_INFLIGHT", "");  // set but empty: not an override
  zt::CommOptions d;
  EXPECT_EQ(zt::apply_comm_env(d).size(), 3u);
  EXPECT_EQ(d.inflight, 2);
}

// ---- JSON null ------------------------------------------------------------------------------------

// null means "unset" (the default) where the default is "" (off unless given); elsewhere it is
// refused naming the key. --set checkpoint.dir=null used to be a directory named "null".
TEST(PlanNull, UnsetsKeysThatAreOffByDefault) {
  for (const char* key : {"checkpoint.dir", "run.final_weights", "run.trace", "model.init"}) {
    SCOPED_TRACE(key);
    const zt::Plan p = plan_with({std::string(key) + "=somewhere", std::string(key) + "=null"});
    const std::string section = std::string(key).substr(0, std::string(key).find('.'));
    const std::string leaf = std::string(key).substr(section.size() + 1);
    EXPECT_EQ(p.resolved[section][leaf], "");
  }
  EXPECT_EQ(plan_with({"checkpoint.dir=null"}).checkpoint.dir, "");
  EXPECT_EQ(plan_with({"checkpoint.dir=\"null\""}).checkpoint.dir, "null");  // a path named null, quoted
  PlanFiles f;
  f.write("parent.json", R"({"checkpoint": {"dir": "runs/ck"}, "run": {"trace": "t.json"}})");
  const std::string child = f.write("child.json", R"({"extends": "parent.json", "checkpoint": {"dir": null}})");
  const zt::Plan p = zt::load_plan(child, {}, false);
  EXPECT_EQ(p.checkpoint.dir, "");
  EXPECT_EQ(p.run.trace, "t.json");
  EXPECT_EQ(p.resolved["checkpoint"]["dir"], "");
  // JSON built by hand, as plan_from_json takes it.
  json j = json::object();
  j["run"]["final_weights"] = nullptr;
  EXPECT_EQ(zt::plan_from_json(j, false).run.final_weights, "");
}

TEST(PlanNull, IsRefusedWhereTheDefaultIsAValue) {
  EXPECT_EQ(error_of([] { plan_with({"run.log=null"}); }),
            "--set run.log=null: null (unset) is accepted only by keys that are off by default (\"\"); give a string "
            "(the default is \"runs/base/metrics.jsonl\")");
  EXPECT_EQ(error_of([] { plan_with({"zero.stage=null"}); }),
            "--set zero.stage=null: null (unset) is accepted only by keys that are off by default (\"\"); give an "
            "integer (the default is 0)");
  PlanFiles f;
  const std::string plan = f.write("p.json", R"({"offload": {"nvme_dir": null}})");
  EXPECT_EQ(error_of([&] { zt::load_plan(plan, {}, false); }),
            "plan: offload.nvme_dir: null (unset) is accepted only by keys that are off by default (\"\"); give a "
            "string (the default is \"runs/swap\") (in " + plan + ")");
  const std::string section = f.write("s.json", R"({"checkpoint": null})");
  EXPECT_EQ(error_of([&] { zt::load_plan(section, {}, false); }),
            "plan: checkpoint: expected an object (a section), got null (in " + section + ")");
}
