// Plan loading and validation: "extends" chains, deep merge, --set overrides, schema checks with
// suggestions, ranges, combinations, options this build does not support, data-file checks.
#include <gtest/gtest.h>
#include <omp.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "plan/plan.h"
#include "runtime/device.h"
#include "runtime/error.h"
#include "train/backend_choice.h"
#include "zero/estimate.h"

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

// A fresh directory under the system temp dir, removed at the end of the test.
struct TempDir {
  fs::path path;
  TempDir() {
    static std::atomic<int> counter{0};
    path = fs::temp_directory_path() /
           ("zt_plan_test_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  std::string write(const std::string& name, const std::string& text) const {
    fs::path p = path / name;
    fs::create_directories(p.parent_path());
    std::ofstream(p) << text;
    return p.string();
  }
};

// The zt::Error message thrown by f, or a test failure when nothing (or something else) is thrown.
std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const zt::Error& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "expected zt::Error, got another exception: " << e.what();
    return e.what();
  }
  ADD_FAILURE() << "expected zt::Error, nothing was thrown";
  return "";
}

std::string plan_error(const json& j) {
  return error_of([&] { zt::plan_from_json(j, false); });
}

// The base plan with one field replaced.
json base_with(const std::string& section, const std::string& key, const json& value) {
  json j = zt::base_plan_json();
  if (section.empty())
    j[key] = value;
  else
    j[section][key] = value;
  return j;
}

const std::string kSrc = ZT_SOURCE_DIR;

}  // namespace

// ---- the shipped plans ----------------------------------------------------------------------------

TEST(PlanBase, EmbeddedBaseMatchesPlansBaseJson) {
  std::ifstream f(kSrc + "/plans/base.json");
  ASSERT_TRUE(f.good());
  EXPECT_EQ(zt::base_plan_json(), json::parse(f));
}

TEST(PlanBase, BaseValidatesAsIs) {
  zt::Plan p = zt::plan_from_json(zt::base_plan_json(), false);
  EXPECT_EQ(p.model.n_layer, 4);
  EXPECT_EQ(p.model.vocab_size, 50257);
  EXPECT_DOUBLE_EQ(p.optim.beta1, 0.9);
  EXPECT_DOUBLE_EQ(p.optim.beta2, 0.95);
  EXPECT_DOUBLE_EQ(p.optim.eps, 1e-8);
  EXPECT_EQ(p.zero.stage, 0);
  EXPECT_EQ(p.run.seed, 1337u);
  EXPECT_EQ(p.device, "auto");
  EXPECT_EQ(p.resolved, zt::base_plan_json());
}

TEST(PlanBase, BaseFileResolves) {
  zt::Plan p = zt::load_plan(kSrc + "/plans/base.json", {}, false);
  EXPECT_EQ(p.resolved, zt::base_plan_json());
  EXPECT_EQ(p.source, kSrc + "/plans/base.json");
}

TEST(PlanShipped, DefaultResolvesAndValidates) {
  zt::Plan p = zt::load_plan(kSrc + "/plans/default.json", {}, false);
  EXPECT_EQ(p.run.log, "runs/default/metrics.jsonl");
  EXPECT_GE(p.run.steps, 1);
  EXPECT_FALSE(p.resolved.contains("extends"));
}

TEST(PlanShipped, Gpt2_124mResolvesAndValidates) {
  zt::Plan p = zt::load_plan(kSrc + "/plans/gpt2-124m.json", {}, false);
  EXPECT_EQ(p.model.n_layer, 12);
  EXPECT_EQ(p.model.n_head, 12);
  EXPECT_EQ(p.model.n_embd, 768);
  EXPECT_EQ(p.model.seq_len, 1024);
  EXPECT_EQ(p.model.vocab_size, 50257);
  // Inherited from default.json.
  zt::Plan d = zt::load_plan(kSrc + "/plans/default.json", {}, false);
  EXPECT_EQ(p.run.steps, d.run.steps);
  EXPECT_FALSE(p.resolved.contains("extends"));
}

// Every shipped plan must at least resolve and pass the schema, range and combination checks;
// a plan for a feature this build lacks may only fail with the "not supported" message.
TEST(PlanShipped, EveryPlanInPlansDirIsValid) {
  int n = 0;
  for (const auto& entry : fs::directory_iterator(kSrc + "/plans")) {
    if (entry.path().extension() != ".json") continue;
    ++n;
    SCOPED_TRACE(entry.path().string());
    try {
      zt::load_plan(entry.path().string(), {}, false);
    } catch (const zt::Error& e) {
      EXPECT_NE(std::string(e.what()).find("is not supported by this build yet"), std::string::npos) << e.what();
    }
  }
  EXPECT_GE(n, 3);
}

// ---- extends ------------------------------------------------------------------------------------

TEST(PlanExtends, ChainAndDeepMerge) {
  TempDir d;
  d.write("c.json", R"({"optim": {"lr": 0.001, "weight_decay": 0.0}, "model": {"n_layer": 2}})");
  d.write("b.json", R"({"extends": "c.json", "optim": {"eps": 1e-6}, "batch": {"grad_accum": 3}})");
  std::string a = d.write("a.json", R"({"extends": "b.json", "optim": {"lr": 0.002}, "run": {"steps": 7}})");
  json r = zt::resolve_plan(a, {});
  EXPECT_FALSE(r.contains("extends"));
  EXPECT_DOUBLE_EQ(r["optim"]["lr"].get<double>(), 0.002);           // a over c
  EXPECT_DOUBLE_EQ(r["optim"]["eps"].get<double>(), 1e-6);           // from b
  EXPECT_DOUBLE_EQ(r["optim"]["weight_decay"].get<double>(), 0.0);   // from c
  EXPECT_EQ(r["optim"]["betas"], json::parse("[0.9, 0.95]"));        // from the base
  EXPECT_EQ(r["optim"]["schedule"], "cosine");                       // from the base
  EXPECT_EQ(r["model"]["n_layer"], 2);
  EXPECT_EQ(r["model"]["n_head"], 4);
  EXPECT_EQ(r["batch"]["grad_accum"], 3);
  EXPECT_EQ(r["batch"]["micro_batch"], 8);
  EXPECT_EQ(r["run"]["steps"], 7);
  zt::Plan p = zt::plan_from_json(r, false);
  EXPECT_EQ(p.model.n_layer, 2);
  EXPECT_DOUBLE_EQ(p.optim.lr, 0.002);
}

TEST(PlanExtends, PathsAreRelativeToTheNamingFile) {
  TempDir d;
  d.write("shared/parent.json", R"({"run": {"steps": 11}})");
  d.write("shared/mid.json", R"({"extends": "parent.json", "run": {"seed": 5}})");
  std::string a = d.write("plans/sub/a.json", R"({"extends": "../../shared/mid.json"})");
  zt::Plan p = zt::load_plan(a, {}, false);
  EXPECT_EQ(p.run.steps, 11);
  EXPECT_EQ(p.run.seed, 5u);
  EXPECT_EQ(p.source, a);
}

TEST(PlanExtends, ExplicitBaseJsonUsesEmbeddedDefaultsWhenAbsent) {
  TempDir d;
  std::string a = d.write("a.json", R"({"extends": "base.json", "run": {"steps": 3}})");
  json r = zt::resolve_plan(a, {});
  json expect = zt::base_plan_json();
  expect["run"]["steps"] = 3;
  EXPECT_EQ(r, expect);
}

TEST(PlanExtends, CycleIsRejectedAndNamed) {
  TempDir d;
  std::string a = d.write("a.json", R"({"extends": "b.json"})");
  d.write("b.json", R"({"extends": "c.json"})");
  d.write("c.json", R"({"extends": "a.json"})");
  std::string e = error_of([&] { zt::resolve_plan(a, {}); });
  EXPECT_NE(e.find("\"extends\" cycle"), std::string::npos) << e;
  EXPECT_NE(e.find("a.json -> "), std::string::npos) << e;
  EXPECT_NE(e.find("b.json -> "), std::string::npos) << e;
  EXPECT_NE(e.find("c.json -> "), std::string::npos) << e;
}

TEST(PlanExtends, SelfCycleIsRejected) {
  TempDir d;
  std::string a = d.write("self.json", R"({"extends": "self.json"})");
  std::string e = error_of([&] { zt::resolve_plan(a, {}); });
  EXPECT_NE(e.find("\"extends\" cycle"), std::string::npos) << e;
  EXPECT_NE(e.find("self.json -> "), std::string::npos) << e;
}

TEST(PlanExtends, DiamondIsNotACycle) {
  // The same parent used twice along different branches is fine: b and the leaf both extend
  // nothing circular.
  TempDir d;
  d.write("p.json", R"({"run": {"steps": 9}})");
  d.write("b.json", R"({"extends": "p.json"})");
  std::string a = d.write("a.json", R"({"extends": "b.json"})");
  EXPECT_EQ(zt::resolve_plan(a, {})["run"]["steps"], 9);
}

TEST(PlanExtends, MissingParentNamesBothFiles) {
  TempDir d;
  std::string a = d.write("a.json", R"({"extends": "nope.json"})");
  std::string e = error_of([&] { zt::resolve_plan(a, {}); });
  EXPECT_NE(e.find("nope.json: cannot open"), std::string::npos) << e;
  EXPECT_NE(e.find("extended by " + a), std::string::npos) << e;
}

TEST(PlanExtends, ExtendsMustBeAString) {
  TempDir d;
  std::string a = d.write("a.json", R"({"extends": 3})");
  std::string e = error_of([&] { zt::resolve_plan(a, {}); });
  EXPECT_NE(e.find("\"extends\": expected a non-empty string"), std::string::npos) << e;
}

// ---- files --------------------------------------------------------------------------------------

TEST(PlanFile, MissingFile) {
  std::string e = error_of([&] { zt::resolve_plan("/nonexistent/dir/plan.json", {}); });
  EXPECT_EQ(e.rfind("plan /nonexistent/dir/plan.json: cannot open", 0), 0u) << e;
}

TEST(PlanFile, MalformedJsonNamesFileAndLine) {
  TempDir d;
  std::string a = d.write("bad.json", "{\n  \"run\": {\n    \"steps\": 10,\n  }\n}\n");
  std::string e = error_of([&] { zt::resolve_plan(a, {}); });
  EXPECT_EQ(e.rfind("plan " + a + ": malformed JSON at line 4, column", 0), 0u) << e;
}

TEST(PlanFile, TopLevelMustBeAnObject) {
  TempDir d;
  std::string a = d.write("arr.json", "[1, 2]");
  std::string e = error_of([&] { zt::resolve_plan(a, {}); });
  EXPECT_NE(e.find("expected a JSON object at the top level"), std::string::npos) << e;
}

TEST(PlanFile, UnknownKeyInFileNamesPathFileAndSuggestion) {
  TempDir d;
  std::string a = d.write("a.json", R"({"optim": {"lrr": 0.1}})");
  std::string e = error_of([&] { zt::resolve_plan(a, {}); });
  EXPECT_EQ(e.rfind("plan: unknown key \"optim.lrr\" (did you mean \"optim.lr\"?)", 0), 0u) << e;
  EXPECT_NE(e.find("(in " + a + ")"), std::string::npos) << e;
}

TEST(PlanFile, WrongTypeInParentFileIsCaught) {
  TempDir d;
  d.write("p.json", R"({"batch": {"micro_batch": "8"}})");
  std::string a = d.write("a.json", R"({"extends": "p.json"})");
  std::string e = error_of([&] { zt::resolve_plan(a, {}); });
  EXPECT_EQ(e.rfind("plan: batch.micro_batch: expected an integer, got string \"8\"", 0), 0u) << e;
  EXPECT_NE(e.find("p.json"), std::string::npos) << e;
}

// ---- overrides ----------------------------------------------------------------------------------

TEST(PlanOverrides, TypesThatMatchAreApplied) {
  json r = zt::resolve_plan(kSrc + "/plans/default.json",
                            {"zero.bucket_mb=4", "optim.lr=1e-3", "data.shuffle=false", "optim.schedule=constant",
                             "run.log=\"runs/q/m.jsonl\"", "optim.betas=[0.8,0.9]", "model.n_layer=2",
                             "checkpoint.dir=2024", "device=cpu"});
  EXPECT_EQ(r["zero"]["bucket_mb"], 4);  // integer accepted where the default is a float
  EXPECT_DOUBLE_EQ(r["optim"]["lr"].get<double>(), 1e-3);
  EXPECT_EQ(r["data"]["shuffle"], false);
  EXPECT_EQ(r["optim"]["schedule"], "constant");  // raw text -> string
  EXPECT_EQ(r["run"]["log"], "runs/q/m.jsonl");    // quoted JSON string
  EXPECT_EQ(r["optim"]["betas"], json::parse("[0.8, 0.9]"));
  EXPECT_EQ(r["model"]["n_layer"], 2);
  EXPECT_EQ(r["checkpoint"]["dir"], "2024");  // string field keeps the raw text
  EXPECT_EQ(r["device"], "cpu");
  zt::Plan p = zt::plan_from_json(r, false);
  EXPECT_DOUBLE_EQ(p.zero.bucket_mb, 4.0);
  EXPECT_DOUBLE_EQ(p.optim.beta1, 0.8);
  EXPECT_EQ(p.model.n_layer, 2);
  EXPECT_FALSE(p.data.shuffle);
}

TEST(PlanOverrides, LaterOverrideWins) {
  json r = zt::resolve_plan(kSrc + "/plans/base.json", {"run.steps=5", "run.steps=6"});
  EXPECT_EQ(r["run"]["steps"], 6);
}

TEST(PlanOverrides, TypeMismatchIsRejected) {
  auto e = error_of([&] { zt::resolve_plan(kSrc + "/plans/base.json", {"zero.stage=abc"}); });
  EXPECT_EQ(e, "--set zero.stage=abc: expected an integer, got string \"abc\"");
  e = error_of([&] { zt::resolve_plan(kSrc + "/plans/base.json", {"run.steps=2.5"}); });
  EXPECT_EQ(e, "--set run.steps=2.5: expected an integer, got number 2.5");
  e = error_of([&] { zt::resolve_plan(kSrc + "/plans/base.json", {"data.shuffle=1"}); });
  EXPECT_EQ(e, "--set data.shuffle=1: expected true or false, got integer 1");
  e = error_of([&] { zt::resolve_plan(kSrc + "/plans/base.json", {"optim.betas=[0.9]"}); });
  EXPECT_EQ(e, "--set optim.betas=[0.9]: expected an array of 2 numbers, got array [0.9]");
  e = error_of([&] { zt::resolve_plan(kSrc + "/plans/base.json", {"optim.lr=fast"}); });
  EXPECT_EQ(e, "--set optim.lr=fast: expected a number, got string \"fast\"");
}

TEST(PlanOverrides, UnknownKeyWithSuggestion) {
  auto e = error_of([&] { zt::resolve_plan(kSrc + "/plans/base.json", {"optim.lrr=0.1"}); });
  EXPECT_EQ(e, "--set optim.lrr=0.1: unknown key \"optim.lrr\" (did you mean \"optim.lr\"?)");
  e = error_of([&] { zt::resolve_plan(kSrc + "/plans/base.json", {"zero.stag=2"}); });
  EXPECT_EQ(e, "--set zero.stag=2: unknown key \"zero.stag\" (did you mean \"zero.stage\"?)");
  e = error_of([&] { zt::resolve_plan(kSrc + "/plans/base.json", {"zeroo.stage=2"}); });
  EXPECT_EQ(e, "--set zeroo.stage=2: unknown key \"zeroo\" (did you mean \"zero\"?)");
  e = error_of([&] { zt::resolve_plan(kSrc + "/plans/base.json", {"lr=0.1"}); });
  EXPECT_EQ(e, "--set lr=0.1: unknown key \"lr\" (did you mean \"optim.lr\"?)");
}

TEST(PlanOverrides, MalformedOverrides) {
  auto e = error_of([&] { zt::resolve_plan(kSrc + "/plans/base.json", {"zero.stage"}); });
  EXPECT_NE(e.find("--set zero.stage: expected KEY=VALUE"), std::string::npos) << e;
  e = error_of([&] { zt::resolve_plan(kSrc + "/plans/base.json", {"=3"}); });
  EXPECT_NE(e.find("expected KEY=VALUE"), std::string::npos) << e;
  e = error_of([&] { zt::resolve_plan(kSrc + "/plans/base.json", {"zero=3"}); });
  EXPECT_NE(e.find("\"zero\" is a section"), std::string::npos) << e;
  e = error_of([&] { zt::resolve_plan(kSrc + "/plans/base.json", {"zero.stage.x=3"}); });
  EXPECT_NE(e.find("\"zero.stage\" is a value, not a section"), std::string::npos) << e;
}

TEST(PlanOverrides, OverrideValueIsValidatedLater) {
  json r = zt::resolve_plan(kSrc + "/plans/base.json", {"optim.lr=-0.001"});
  EXPECT_EQ(plan_error(r), "plan: optim.lr: must be > 0, got -0.001");
}

// ---- schema: unknown keys and types -------------------------------------------------------------

TEST(PlanSchema, UnknownKeySuggestsCloseMatch) {
  EXPECT_EQ(plan_error(base_with("optim", "lrr", 0.1)), "plan: unknown key \"optim.lrr\" (did you mean \"optim.lr\"?)");
  EXPECT_EQ(plan_error(base_with("batch", "micro_batch_size", 4)),
            "plan: unknown key \"batch.micro_batch_size\" (did you mean \"batch.micro_batch\"?)");
}

TEST(PlanSchema, UnknownTopLevelKeySuggestsSection) {
  EXPECT_EQ(plan_error(base_with("", "optm", json::object())), "plan: unknown key \"optm\" (did you mean \"optim\"?)");
  EXPECT_EQ(plan_error(base_with("", "lr", 0.1)), "plan: unknown key \"lr\" (did you mean \"optim.lr\"?)");
  EXPECT_EQ(plan_error(base_with("", "micro_batch", 4)),
            "plan: unknown key \"micro_batch\" (did you mean \"batch.micro_batch\"?)");
}

TEST(PlanSchema, KeyInWrongSectionSuggestsTheRightOne) {
  EXPECT_EQ(plan_error(base_with("model", "lr", 0.1)), "plan: unknown key \"model.lr\" (did you mean \"optim.lr\"?)");
}

TEST(PlanSchema, UnknownKeyWithoutCloseMatchListsAllowedKeys) {
  std::string e = plan_error(base_with("zero", "xyzzy", 1));
  EXPECT_EQ(e.rfind("plan: unknown key \"zero.xyzzy\" (allowed keys in \"zero\": ", 0), 0u) << e;
  EXPECT_NE(e.find("bucket_mb"), std::string::npos) << e;
  e = plan_error(base_with("", "qqqqqqq", 1));
  EXPECT_EQ(e.rfind("plan: unknown key \"qqqqqqq\" (allowed top-level keys: ", 0), 0u) << e;
}

TEST(PlanSchema, WrongTypes) {
  EXPECT_EQ(plan_error(base_with("batch", "micro_batch", "8")),
            "plan: batch.micro_batch: expected an integer, got string \"8\"");
  EXPECT_EQ(plan_error(base_with("batch", "micro_batch", 8.5)),
            "plan: batch.micro_batch: expected an integer, got number 8.5");
  EXPECT_EQ(plan_error(base_with("optim", "lr", "0.1")), "plan: optim.lr: expected a number, got string \"0.1\"");
  EXPECT_EQ(plan_error(base_with("data", "shuffle", "yes")), "plan: data.shuffle: expected true or false, got string \"yes\"");
  // null means "unset" only where the default is "" (test_plan_edges.cpp): run.log must be given.
  EXPECT_EQ(plan_error(base_with("run", "log", nullptr)),
            "plan: run.log: null (unset) is accepted only by keys that are off by default (\"\"); give a string "
            "(the default is \"runs/base/metrics.jsonl\")");
  EXPECT_EQ(plan_error(base_with("optim", "betas", json::parse("[0.9, 0.95, 0.99]"))),
            "plan: optim.betas: expected an array of 2 numbers, got array [0.9,0.95,0.99]");
  EXPECT_EQ(plan_error(base_with("optim", "betas", json::parse("[0.9, \"x\"]"))),
            "plan: optim.betas: expected an array of 2 numbers, got array [0.9,\"x\"]");
  EXPECT_EQ(plan_error(base_with("", "model", 5)), "plan: model: expected an object (a section), got integer 5");
  EXPECT_EQ(plan_error(json::array()), "plan: expected a JSON object at the top level, got array []");
}

TEST(PlanSchema, PartialJsonTakesDefaults) {
  zt::Plan p = zt::plan_from_json(json::parse(R"({"model": {"n_layer": 1}})"), false);
  EXPECT_EQ(p.model.n_layer, 1);
  EXPECT_EQ(p.model.n_head, 4);
  EXPECT_EQ(p.resolved["model"]["n_embd"], 128);
}

// ---- ranges -------------------------------------------------------------------------------------

TEST(PlanRanges, NegativeLr) {
  EXPECT_EQ(plan_error(base_with("optim", "lr", -0.001)), "plan: optim.lr: must be > 0, got -0.001");
}

struct RangeCase {
  const char* section;
  const char* key;
  const char* value;  // JSON
  const char* expect;  // exact message
};

TEST(PlanRanges, EveryRangeIsChecked) {
  const RangeCase cases[] = {
      {"model", "n_layer", "0", "plan: model.n_layer: must be >= 1, got 0"},
      {"model", "n_head", "0", "plan: model.n_head: must be >= 1, got 0"},
      {"model", "n_embd", "0", "plan: model.n_embd: must be >= 1, got 0"},
      {"model", "n_embd", "130", "plan: model.n_embd: must be divisible by model.n_head (4), got 130"},
      {"model", "seq_len", "0", "plan: model.seq_len: must be >= 1, got 0"},
      {"model", "vocab_size", "1", "plan: model.vocab_size: must be in [2, 65536] (tokens are stored as uint16), got 1"},
      {"model", "vocab_size", "65537",
       "plan: model.vocab_size: must be in [2, 65536] (tokens are stored as uint16), got 65537"},
      {"model", "n_layer", "3000000000", "plan: model.n_layer: must be <= 65536, got 3000000000"},
      {"data", "train", "\"\"", "plan: data.train: must not be empty"},
      {"data", "val", "\"\"", "plan: data.val: must not be empty"},
      {"batch", "micro_batch", "0", "plan: batch.micro_batch: must be >= 1, got 0"},
      {"batch", "grad_accum", "-1", "plan: batch.grad_accum: must be >= 1, got -1"},
      {"optim", "lr", "0", "plan: optim.lr: must be > 0, got 0"},
      {"optim", "betas", "[1.0, 0.95]", "plan: optim.betas[0]: must be in [0, 1), got 1.0"},
      {"optim", "betas", "[0.9, -0.1]", "plan: optim.betas[1]: must be in [0, 1), got -0.1"},
      {"optim", "eps", "0", "plan: optim.eps: must be > 0, got 0"},
      {"optim", "weight_decay", "-0.1", "plan: optim.weight_decay: must be >= 0, got -0.1"},
      {"optim", "grad_clip", "-1", "plan: optim.grad_clip: must be >= 0, got -1"},
      {"optim", "warmup_steps", "-1", "plan: optim.warmup_steps: must be >= 0, got -1"},
      {"optim", "schedule", "\"linear\"", "plan: optim.schedule: must be \"cosine\" or \"constant\", got \"linear\""},
      {"optim", "min_lr_ratio", "1.5", "plan: optim.min_lr_ratio: must be in [0, 1], got 1.5"},
      {"precision", "compute", "\"fp16\"",
       "plan: precision.compute: must be \"auto\", \"fp32\" or \"bf16\", got \"fp16\""},
      {"zero", "stage", "4", "plan: zero.stage: must be 0, 1, 2 or 3, got 4"},
      {"zero", "stage", "-1", "plan: zero.stage: must be 0, 1, 2 or 3, got -1"},
      {"zero", "bucket_mb", "0", "plan: zero.bucket_mb: must be > 0, got 0"},
      {"zero", "prefetch_units", "-1", "plan: zero.prefetch_units: must be >= 0, got -1"},
      {"recompute", "policy", "\"full\"",
       "plan: recompute.policy: must be \"none\", \"selective\" or \"block\", got \"full\""},
      {"recompute", "every", "0", "plan: recompute.every: must be >= 1, got 0"},
      {"recompute", "every", "2",
       "plan: recompute.every: only applies to recompute.policy \"block\" (got policy \"none\" with every 2)"},
      {"offload", "optimizer", "\"gpu\"",
       "plan: offload.optimizer: must be \"none\", \"cpu\" or \"nvme\", got \"gpu\""},
      {"offload", "params", "\"disk\"", "plan: offload.params: must be \"none\", \"cpu\" or \"nvme\", got \"disk\""},
      {"checkpoint", "every", "-5", "plan: checkpoint.every: must be >= 0, got -5"},
      {"checkpoint", "keep", "0", "plan: checkpoint.keep: must be >= 1, got 0"},
      {"checkpoint", "resume", "\"\"",
       "plan: checkpoint.resume: must be \"none\", \"auto\" or the path of a checkpoint, got \"\""},
      {"run", "steps", "0", "plan: run.steps: must be >= 1, got 0"},
      {"run", "eval_every", "-1", "plan: run.eval_every: must be >= 0, got -1"},
      {"run", "eval_batches", "0", "plan: run.eval_batches: must be >= 1, got 0"},
      {"run", "sample_every", "-1", "plan: run.sample_every: must be >= 0, got -1"},
      {"run", "sample_tokens", "0", "plan: run.sample_tokens: must be >= 1, got 0"},
      {"run", "log_every", "0", "plan: run.log_every: must be >= 1, got 0"},
      {"run", "seed", "-1", "plan: run.seed: must be >= 0, got -1"},
      {"run", "threads", "-2", "plan: run.threads: must be >= 0, got -2"},
      {"run", "log", "\"\"", "plan: run.log: must not be empty"},
      {"", "device", "\"tpu\"", "plan: device: must be \"auto\", \"cpu\" or \"cuda\", got \"tpu\""},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(std::string(c.section) + "." + c.key + " = " + c.value);
    std::string e = plan_error(base_with(c.section, c.key, json::parse(c.value)));
    EXPECT_EQ(e.rfind(c.expect, 0), 0u) << e;  // the message starts with the expected text
  }
}

TEST(PlanRanges, RecomputePoliciesAreAccepted) {
  for (const char* policy : {"none", "selective", "block"}) {
    json j = zt::base_plan_json();
    j["recompute"]["policy"] = policy;
    const zt::Plan p = zt::plan_from_json(j, false);
    EXPECT_EQ(p.recompute.policy, policy);
    EXPECT_EQ(p.recompute.every, 1);  // the default
  }
  json j = zt::base_plan_json();
  j["recompute"]["policy"] = "block";
  j["recompute"]["every"] = 3;
  EXPECT_EQ(zt::plan_from_json(j, false).recompute.every, 3);
}

TEST(PlanRanges, BoundaryValuesAreAccepted) {
  json j = zt::base_plan_json();
  j["model"]["vocab_size"] = 65536;
  j["optim"]["betas"] = json::parse("[0.0, 0.999]");
  j["optim"]["min_lr_ratio"] = 0;
  j["optim"]["weight_decay"] = 0;
  j["optim"]["grad_clip"] = 0;
  j["run"]["seed"] = 18446744073709551615ull;
  j["run"]["eval_every"] = 0;
  j["precision"]["compute"] = "fp32";
  j["device"] = "cpu";
  zt::Plan p = zt::plan_from_json(j, false);
  EXPECT_EQ(p.model.vocab_size, 65536);
  EXPECT_EQ(p.run.seed, 18446744073709551615ull);
}

// ---- combinations -------------------------------------------------------------------------------

TEST(PlanCombinations, ParamOffloadNeedsStage3) {
  json j = base_with("offload", "params", "cpu");
  EXPECT_EQ(plan_error(j),
            "plan: offload.params: \"cpu\" requires zero.stage 3 (only sharded parameters can be offloaded), got "
            "zero.stage 0");
}

TEST(PlanCombinations, NvmeNeedsADirectory) {
  json j = base_with("offload", "optimizer", "nvme");
  j["zero"]["stage"] = 2;
  j["offload"]["nvme_dir"] = "";
  EXPECT_EQ(plan_error(j), "plan: offload.nvme_dir: must be set when offload.optimizer is \"nvme\"");
}

// docs/design.md §3.6: what is offloaded is a rank's shard; values not built say so, and why.
TEST(PlanCombinations, OffloadRefusalsGiveTheReason) {
  struct Case {
    std::vector<std::string> sets;
    std::string expect;  // message prefix
  };
  const Case cases[] = {
      {{"offload.optimizer=nvme"},
       "plan: offload.optimizer: \"nvme\" requires zero.stage 1, 2 or 3: offload streams a rank's shard"},
      {{"offload.optimizer=cpu", "device=cpu", "zero.stage=2"},
       "plan: offload.optimizer: \"cpu\" changes nothing on the CPU backend, which already keeps everything in host "
       "memory"},
      {{"offload.params=cpu", "zero.stage=3", "device=cpu"},
       "plan: offload.params: \"cpu\" changes nothing on the CPU backend, which already keeps everything in host memory"},
      {{"offload.params=nvme", "zero.stage=2"},
       "plan: offload.params: \"nvme\" requires zero.stage 3 (only sharded parameters can be offloaded), got zero.stage 2"},
      {{"offload.optimizer=nvme", "zero.stage=1", "offload.buffer_count=1"},
       "plan: offload.buffer_count: must be >= 2, got 1"},
      {{"offload.optimizer=nvme", "zero.stage=1", "offload.subgroup_mb=0"}, "plan: offload.subgroup_mb: must be > 0"},
      {{"offload.optimizer=nvme", "zero.stage=1", "offload.queue_depth=0"}, "plan: offload.queue_depth: must be >= 1"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.sets.front());
    const std::string e = error_of([&] { zt::load_plan(kSrc + "/plans/base.json", c.sets, false); });
    EXPECT_EQ(e.rfind(c.expect, 0), 0u) << e;
  }
  if (zt::device::built_with_cuda()) {  // the CUDA backend's AdamW on the host: stages 1-3
    const std::string e = error_of(
        [&] { zt::load_plan(kSrc + "/plans/base.json", {"offload.optimizer=cpu", "device=cuda", "zero.stage=0"}, false); });
    EXPECT_EQ(e.rfind("plan: offload.optimizer: \"cpu\" requires zero.stage 1, 2 or 3", 0), 0u) << e;
    const zt::Plan c = zt::load_plan(kSrc + "/plans/base.json", {"offload.optimizer=cpu", "device=cuda", "zero.stage=1"}, false);
    EXPECT_EQ(c.offload.optimizer, "cpu");
    // The pinned parameter shard with the optimizer anywhere: on the device, on the CPU, on disk.
    for (const char* opt : {"none", "cpu", "nvme"}) {
      const zt::Plan q = zt::load_plan(
          kSrc + "/plans/base.json",
          {"offload.params=cpu", std::string("offload.optimizer=") + opt, "device=cuda", "zero.stage=3"}, false);
      EXPECT_EQ(q.offload.optimizer, opt);
    }
    // The parameter shard on disk with the optimizer anywhere too.
    for (const char* opt : {"none", "cpu", "nvme"}) {
      const zt::Plan q = zt::load_plan(
          kSrc + "/plans/base.json",
          {"offload.params=nvme", std::string("offload.optimizer=") + opt, "device=cuda", "zero.stage=3"}, false);
      EXPECT_EQ(q.offload.params, "nvme");
      EXPECT_EQ(q.offload.optimizer, opt);
    }
    const zt::Plan both = zt::load_plan(kSrc + "/plans/base.json",
                                        {"offload.params=cpu", "offload.optimizer=cpu", "device=cuda", "zero.stage=3"}, false);
    EXPECT_EQ(both.offload.params, "cpu");
  }
  const zt::Plan p = zt::load_plan(kSrc + "/plans/base.json", {"offload.optimizer=nvme", "zero.stage=1"}, false);
  EXPECT_EQ(p.offload.nvme_dir, "runs/swap");
  EXPECT_EQ(p.offload.queue_depth, 1024);
  EXPECT_EQ(p.offload.buffer_count, 3);
  EXPECT_EQ(p.offload.subgroup_mb, 4.0);
}

TEST(PlanCombinations, CheckpointingNeedsADirectory) {
  std::string e = plan_error(base_with("checkpoint", "every", 100));
  EXPECT_EQ(e.rfind("plan: checkpoint.dir: must be set when checkpoint.every > 0", 0), 0u) << e;
  e = plan_error(base_with("checkpoint", "resume", "auto"));
  EXPECT_EQ(e.rfind("plan: checkpoint.dir: must be set when checkpoint.resume is \"auto\"", 0), 0u) << e;
}

// ---- options this build does not support yet ----------------------------------------------------

TEST(PlanUnsupported, EveryUnsupportedOptionIsRejected) {
  struct Case {
    std::vector<std::string> sets;  // --set overrides
    std::string expect;             // message prefix
  };
  const Case cases[] = {
      {{"precision.compute=bf16", "precision.master_weights=false"},
       zt::device::built_with_cuda()
           ? "plan: precision.master_weights: false is not supported by this build yet (supported: true"
           : "plan: precision.compute: \"bf16\" is not supported by this build yet (supported: \"auto\", \"fp32\""},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.sets.front());
    std::string e = error_of([&] { zt::load_plan(kSrc + "/plans/base.json", c.sets, false); });
    EXPECT_EQ(e.rfind(c.expect, 0), 0u) << e;
    EXPECT_EQ(e.find("implemented"), std::string::npos) << e;
  }
}

// The CUDA backend is part of every build that found nvcc; without it, cuda and bf16 are refused.
TEST(PlanUnsupported, CudaDependsOnTheBuild) {
  for (const std::vector<std::string>& sets :
       {std::vector<std::string>{"device=cuda"}, std::vector<std::string>{"device=cuda", "precision.compute=bf16"},
        std::vector<std::string>{"precision.compute=bf16"}}) {
    SCOPED_TRACE(sets.back());
    if (zt::device::built_with_cuda()) {
      EXPECT_NO_THROW(zt::load_plan(kSrc + "/plans/base.json", sets, false));
    } else {
      const std::string e = error_of([&] { zt::load_plan(kSrc + "/plans/base.json", sets, false); });
      EXPECT_NE(e.find("is not supported by this build yet"), std::string::npos) << e;
    }
  }
  // bf16 on the CPU is a wrong combination in every build.
  const std::string e =
      error_of([&] { zt::load_plan(kSrc + "/plans/base.json", {"device=cpu", "precision.compute=bf16"}, false); });
  EXPECT_EQ(e.rfind("plan: precision.compute: \"bf16\" needs device \"cuda\"", 0), 0u) << e;
}

TEST(PlanUnsupported, SupportedValuesPass) {
  zt::Plan p = zt::load_plan(kSrc + "/plans/base.json",
                             {"zero.stage=3", "offload.optimizer=nvme", "offload.params=nvme", "checkpoint.every=0",
                              "checkpoint.resume=none", "precision.compute=fp32", "device=cpu"},
                             false);
  EXPECT_EQ(p.precision.compute, "fp32");
  EXPECT_EQ(p.device, "cpu");
}

// ---- data files ---------------------------------------------------------------------------------

TEST(PlanFiles, DataFilesMustExist) {
  TempDir d;
  const std::string dir = d.path.string();
  std::vector<std::string> sets = {"data.train=" + dir + "/train_*.bin", "data.val=" + dir + "/val.bin",
                                   "data.tokenizer=" + dir + "/tok.bin"};
  auto err = [&](std::vector<std::string> extra = {}) {
    std::vector<std::string> all = sets;
    all.insert(all.end(), extra.begin(), extra.end());
    return error_of([&] { zt::load_plan(kSrc + "/plans/base.json", all, true); });
  };

  EXPECT_EQ(err(), "plan: data.train: no files match \"" + dir +
                       "/train_*.bin\" (run scripts/prepare_data first, or make train)");
  d.write("train_000.bin", "x");
  d.write("train_001.bin", "x");
  EXPECT_EQ(err(), "plan: data.val: no files match \"" + dir + "/val.bin\" (run scripts/prepare_data first, or make train)");
  d.write("val.bin", "x");
  std::string e = err();
  EXPECT_EQ(e.rfind("plan: data.tokenizer: file not found: \"" + dir + "/tok.bin\"", 0), 0u) << e;
  d.write("tok.bin", "x");
  e = err({"model.init=" + dir + "/model.bin"});
  EXPECT_EQ(e.rfind("plan: model.init: file not found: \"" + dir + "/model.bin\"", 0), 0u) << e;
  d.write("model.bin", "x");

  sets.push_back("model.init=" + dir + "/model.bin");
  zt::Plan p = zt::load_plan(kSrc + "/plans/base.json", sets, true);
  EXPECT_EQ(p.model.init, dir + "/model.bin");
  // No tokenizer is fine (no samples).
  sets.push_back("data.tokenizer=\"\"");
  EXPECT_NO_THROW(zt::load_plan(kSrc + "/plans/base.json", sets, true));
}

TEST(PlanFiles, NotCheckedWithoutCheckFiles) {
  EXPECT_NO_THROW(zt::load_plan(kSrc + "/plans/base.json", {"data.train=/nonexistent/train_*.bin"}, false));
}

// ---- suggest_key --------------------------------------------------------------------------------

TEST(PlanSuggest, CloseMatches) {
  const std::vector<std::string> keys = {"lr", "betas", "eps", "weight_decay", "grad_clip", "warmup_steps"};
  EXPECT_EQ(zt::suggest_key("lrr", keys), "lr");
  EXPECT_EQ(zt::suggest_key("LR", keys), "lr");
  EXPECT_EQ(zt::suggest_key("beta", keys), "betas");
  EXPECT_EQ(zt::suggest_key("weightdecay", keys), "weight_decay");
  EXPECT_EQ(zt::suggest_key("warmup", keys), "warmup_steps");
  EXPECT_EQ(zt::suggest_key("momentum", keys), "");
  EXPECT_EQ(zt::suggest_key("x", keys), "");
  EXPECT_EQ(zt::suggest_key("lr", {}), "");
}

// ---- robustness: nesting, long values, duplicate keys, sizes, machine limits ----------------------

namespace {

std::string repeat(const std::string& s, int n) {
  std::string out;
  out.reserve(s.size() * size_t(n));
  for (int i = 0; i < n; ++i) out += s;
  return out;
}

// The resolved base plan with overrides, validated without looking for data files.
zt::Plan plan_with(const std::vector<std::string>& sets) { return zt::load_plan(kSrc + "/plans/base.json", sets, false); }

}  // namespace

// 100,000 levels of nesting used to overflow the stack (the error message dumped the value
// recursively). The parser refuses as soon as it goes past the limit, whatever the nesting is
// made of, closed or not.
TEST(PlanRobust, DeepNestingIsRefusedEarly) {
  TempDir d;
  const int n = 100000;
  const std::string arrays = repeat("[", n) + repeat("]", n);
  const struct {
    const char* name;
    std::string text;
  } cases[] = {
      {"top.json", arrays},
      {"betas.json", "{\"optim\": {\"betas\": " + arrays + "}}"},
      {"objects.json", "{\"model\": {\"init\": " + repeat("{\"a\": ", n) + "1" + repeat("}", n) + "}}"},
      {"unclosed.json", "{\"optim\": {\"betas\": " + repeat("[", n)},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    const std::string path = d.write(c.name, c.text);
    const std::string e = error_of([&] { zt::resolve_plan(path, {}); });
    EXPECT_EQ(e, "plan " + path + ": JSON nested deeper than 64 levels (a plan nests 3 levels at most)");
  }
}

TEST(PlanRobust, NestingLimitIsExactly64) {
  TempDir d;
  // The top-level object, "optim" and "betas" are 3 levels; 61 more arrays make 64 (allowed, so
  // the schema check answers), 62 more make 65 (refused by the parser).
  const std::string ok = d.write("64.json", "{\"optim\": {\"betas\": " + repeat("[", 62) + repeat("]", 62) + "}}");
  std::string e = error_of([&] { zt::resolve_plan(ok, {}); });
  EXPECT_EQ(e.rfind("plan: optim.betas: expected an array of 2 numbers, got array [[[", 0), 0u) << e;
  const std::string deep = d.write("65.json", "{\"optim\": {\"betas\": " + repeat("[", 63) + repeat("]", 63) + "}}");
  e = error_of([&] { zt::resolve_plan(deep, {}); });
  EXPECT_EQ(e, "plan " + deep + ": JSON nested deeper than 64 levels (a plan nests 3 levels at most)");
}

TEST(PlanRobust, DeepOverrideValueIsRefused) {
  const std::string value = repeat("[", 50000) + repeat("]", 50000);
  const std::string e = error_of([&] { zt::resolve_plan(kSrc + "/plans/base.json", {"optim.betas=" + value}); });
  EXPECT_EQ(e.rfind("--set optim.betas=[[[[", 0), 0u) << e.substr(0, 200);
  EXPECT_NE(e.find("...: value nested deeper than 64 levels"), std::string::npos) << e.substr(0, 200);
  EXPECT_LT(e.size(), 200u);
}

// An error message quotes at most a short prefix of any value, key or override.
TEST(PlanRobust, ErrorMessagesQuoteAShortPrefix) {
  const std::string big(100000, 'x');
  const std::string base = kSrc + "/plans/base.json";
  std::string e = error_of([&] { plan_with({"device=" + big}); });
  EXPECT_EQ(e.rfind("plan: device: must be \"auto\", \"cpu\" or \"cuda\", got \"xxxxx", 0), 0u) << e.substr(0, 200);
  EXPECT_LT(e.size(), 200u);
  e = error_of([&] { zt::resolve_plan(base, {"optim.lr=" + big}); });
  EXPECT_EQ(e.rfind("--set optim.lr=xxxxx", 0), 0u) << e.substr(0, 200);
  EXPECT_NE(e.find("...: expected a number, got string \"xxxxx"), std::string::npos) << e.substr(0, 200);
  EXPECT_LT(e.size(), 200u);
  e = error_of([&] { zt::resolve_plan(base, {"optim." + big + "=1"}); });
  EXPECT_NE(e.find("unknown key \"optim.xxxxx"), std::string::npos) << e.substr(0, 200);
  EXPECT_LT(e.size(), 300u);
  TempDir d;
  const std::string key_file = d.write("key.json", "{\"optim\": {\"" + big + "\": 1}}");
  e = error_of([&] { zt::resolve_plan(key_file, {}); });
  EXPECT_NE(e.find("unknown key \"optim.xxxxx"), std::string::npos) << e.substr(0, 200);
  EXPECT_LT(e.size(), 300u + key_file.size());
  e = error_of([&] { zt::load_plan(base, {"data.train=/nonexistent/" + big}, true); });
  EXPECT_EQ(e.rfind("plan: data.train: no files match \"/nonexistent/xxxxx", 0), 0u) << e.substr(0, 200);
  EXPECT_LT(e.size(), 200u);
}

TEST(PlanRobust, DuplicateKeysAreRefusedWithTheirPath) {
  TempDir d;
  const struct {
    const char* name;
    const char* text;
    const char* key;
  } cases[] = {
      {"leaf.json", R"({"optim": {"lr": 0.1, "lr": 0.2}})", "optim.lr"},
      {"same_value.json", R"({"run": {"steps": 5, "log": "x.jsonl", "steps": 5}})", "run.steps"},
      {"section.json", R"({"model": {"n_layer": 2}, "model": {"n_head": 2}})", "model"},
      {"in_array.json", R"({"optim": {"betas": [0.9, {"a": 1, "a": 2}]}})", "optim.betas[1].a"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    const std::string path = d.write(c.name, c.text);
    EXPECT_EQ(error_of([&] { zt::resolve_plan(path, {}); }),
              "plan " + path + ": duplicate key \"" + c.key + "\" (a key may appear only once in an object)");
  }
  // In a parent plan: the parent is named.
  const std::string parent = d.write("parent.json", R"({"zero": {"stage": 1, "stage": 2}})");
  const std::string child = d.write("child.json", R"({"extends": "parent.json"})");
  EXPECT_EQ(error_of([&] { zt::resolve_plan(child, {}); }),
            "plan " + parent + ": duplicate key \"zero.stage\" (a key may appear only once in an object)");
  // The same key in different objects is no duplicate (this fails on the schema instead).
  const std::string twins = d.write("twins.json", R"({"optim": {"betas": [{"a": 1}, {"a": 2}]}})");
  std::string e = error_of([&] { zt::resolve_plan(twins, {}); });
  EXPECT_EQ(e.rfind("plan: optim.betas: expected an array of 2 numbers", 0), 0u) << e;
  // In a --set value.
  e = error_of([&] { zt::resolve_plan(kSrc + "/plans/base.json", {R"(optim.betas={"a": 1, "a": 2})"}); });
  EXPECT_EQ(e, R"(--set optim.betas={"a": 1, "a": 2}: duplicate key "a" in the value)");
}

// The kernels count rows (micro_batch x seq_len) and layer widths (4 x n_embd) in 32-bit ints.
TEST(PlanSizes, KernelIntLimitsAreCheckedInThePlan) {
  std::string e = error_of([&] { plan_with({"model.seq_len=65536", "batch.micro_batch=1000000"}); });
  EXPECT_EQ(e, "plan: batch.micro_batch: micro_batch x model.seq_len = 65536000000 tokens per micro-step; the "
               "kernels count them in 32 bits (at most 2147483647)");
  EXPECT_NO_THROW(plan_with({"model.seq_len=65536", "batch.micro_batch=32767"}));  // 2147418112 tokens
  e = error_of([&] { plan_with({"model.n_embd=2147483646", "model.n_head=2"}); });
  EXPECT_EQ(e, "plan: model.n_embd: must be <= 536870911 (the MLP width 4 x n_embd is a 32-bit int in the kernels), "
               "got 2147483646");
  EXPECT_NO_THROW(plan_with({"model.n_embd=536870908"}));
  e = error_of([&] { plan_with({"model.n_layer=65537"}); });
  EXPECT_EQ(e, "plan: model.n_layer: must be <= 65536, got 65537");
  EXPECT_NO_THROW(plan_with({"model.n_layer=65536"}));
}

// Sizes past 2^64 used to wrap into small, wrong numbers in `train estimate`.
TEST(PlanSizes, EstimateRefusesSizesPast64Bits) {
  std::string e = error_of([&] {
    zt::estimate_plan(plan_with({"model.n_layer=65536", "model.n_embd=16384", "model.seq_len=65536",
                                 "batch.micro_batch=32767"}),
                      1);
  });
  EXPECT_EQ(e.rfind("model: activation memory (", 0), 0u) << e;
  EXPECT_NE(e.find("does not fit in 64 bits"), std::string::npos) << e;
  e = error_of([&] { zt::estimate_plan(plan_with({"model.n_layer=65536", "model.n_embd=536870908"}), 1); });
  EXPECT_EQ(e.rfind("model: parameter count (", 0), 0u) << e;
  EXPECT_NE(e.find("does not fit in 64 bits"), std::string::npos) << e;
  // 2 layers of 12 x 536870908^2 parameters fit in 64 bits as a count, but not as fp32 bytes.
  e = error_of([&] { zt::estimate_plan(plan_with({"model.n_layer=2", "model.n_embd=536870908"}), 1); });
  EXPECT_NE(e.find("does not fit in 64 bits"), std::string::npos) << e;
  EXPECT_EQ(e.find("internal error"), std::string::npos) << e;
}

// The checks change no number that fits: pinned from the estimate before they were added. Since
// then (docs/design.md §3.11): fcproj is kept by no layer (one layer of scratch: 11 x 25,165,824
// fewer), and the classifier runs in auto chunks of 2128 positions (logits 8192 x 50304 x 4 =
// 1,648,361,472 -> 2128 x 50304 x 4 = 428,187,648; + log-sum-exp and running sum, 2 x 8192 x 4),
// so activations 7,468,122,112 -> 5,971,189,760 at every stage; at stage 3 the split embedding's
// units are gathered once more for their gradients: sent + 7/8 x 4 x Pe (Pe = 39,419,904 padded
// embedding elements) = 1,431,034,752 -> 1,569,004,416.
TEST(PlanSizes, EstimateNumbersUnchangedForSizesThatFit) {
  const struct {
    std::vector<std::string> sets;
    int world;
    json memory;
    uint64_t bytes_per_step;
  } cases[] = {
      {{"zero.stage=0"}, 8,
       {{"activations", 5971189760ull}, {"grads", 497903616}, {"optimizer", 995807232}, {"params", 497903616},
        {"total", 7962804224ull}},
       871331328},
      {{"zero.stage=1"}, 8,
       {{"activations", 5971189760ull}, {"grads", 560141568}, {"optimizer", 124475904}, {"params", 497903616},
        {"total", 7153710848ull}},
       871331328},
      {{"zero.stage=2"}, 8,
       {{"activations", 5971189760ull}, {"comm", 241194240}, {"grads", 62237952}, {"optimizer", 124475904},
        {"params", 497903616}, {"total", 6897001472ull}},
       871331328},
      // Stage 3 since the embedding is six block-sized row chunks (docs/design.md §3.9): comm =
      // 4 x (2 staging buckets of a block + final norm, 7,089,408 each, their 1/8 receive, and 2
      // gather slots of a block, 7,087,872); sent = (3Ψ + 5 blocks) 7/8 x 4. Before: one
      // embedding-sized gather slot and gradient staging, comm 427225344, total 8144299264, sent
      // 1444966656; before that, two embedding-sized slots, comm 556553472, total 8273627392.
      {{"zero.stage=3"}, 8,
       {{"activations", 5971189760ull}, {"comm", 120507648}, {"grads", 62237952}, {"optimizer", 124475904},
        {"params", 62237952}, {"total", 6340649216ull}},
       1569004416},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.sets.front());
    std::vector<std::string> sets = c.sets;
    sets.push_back("batch.micro_batch=8");
    const zt::Estimate est = zt::estimate_plan(zt::load_plan(kSrc + "/plans/gpt2-124m.json", sets, false), c.world);
    EXPECT_EQ(zt::estimate_json(est)["memory"]["host"], c.memory);
    EXPECT_EQ(est.bytes_per_step, c.bytes_per_step);
  }
  // Huge but representable: 2.4e18 bytes of activations, exactly (2.5e18 while fcproj was kept).
  const zt::Estimate big = zt::estimate_plan(
      plan_with({"model.n_layer=1000", "model.n_embd=16384", "model.seq_len=65536", "batch.micro_batch=32767",
                 "zero.stage=3"}),
      4);
  EXPECT_EQ(big.by_tier_category.at({zt::Tier::host, zt::Category::activations}), 2395216873901522944ull);
  EXPECT_EQ(big.tier_total(zt::Tier::host), 2395229834723033088ull);
  // 3Ψ x 3/4 x 4 = 9Ψ, Ψ = 3,223,336,419,328: wte is smaller than a block here, so the embedding
  // stays one unit, and backward's lookup no longer gathers it (before: 9Ψ + 3 P0 = 29015721541632).
  EXPECT_EQ(big.bytes_per_step, 29010027773952ull);
}

TEST(PlanSizes, WorldArgument) {
  EXPECT_EQ(zt::parse_world("1"), 1);
  EXPECT_EQ(zt::parse_world("65536"), 65536);
  for (const std::string bad : {"0", "-1", "65537", "3000000000", "99999999999999999999999", "abc", "", "1.5", "8x"}) {
    SCOPED_TRACE(bad);
    EXPECT_EQ(error_of([&] { zt::parse_world(bad); }),
              "--world must be an integer between 1 and 65536, got \"" + bad + "\"");
  }
  EXPECT_NE(error_of([&] { zt::estimate_plan(plan_with({}), 0); }).find("between 1 and 65536"), std::string::npos);
  EXPECT_NE(error_of([&] { zt::estimate_plan(plan_with({}), 65537); }).find("between 1 and 65536"), std::string::npos);
  EXPECT_NO_THROW(zt::estimate_plan(plan_with({}), 65536));
}

// ---- settings accepted silently before -----------------------------------------------------------

TEST(PlanRobust, MasterWeightsFalseIsNotSupported) {
  for (const char* compute : {"auto", "fp32"}) {
    SCOPED_TRACE(compute);
    const std::string e =
        error_of([&] { plan_with({"precision.master_weights=false", std::string("precision.compute=") + compute}); });
    EXPECT_EQ(e, "plan: precision.master_weights: false is not supported by this build yet (supported: true; the "
                 "optimizer always updates fp32 weights)");
  }
}

// Warmup longer than the run is legal (short smoke runs of a long plan do it) but worth a warning.
TEST(PlanRobust, WarmupLongerThanTheRunWarns) {
  zt::Plan p = plan_with({"optim.warmup_steps=100", "run.steps=10"});
  ASSERT_EQ(p.warnings.size(), 1u);
  EXPECT_EQ(p.warnings[0], "optim.warmup_steps (100) is larger than run.steps (10): the learning rate never reaches "
                           "optim.lr and the schedule never decays");
  EXPECT_TRUE(plan_with({"optim.warmup_steps=10", "run.steps=10"}).warnings.empty());
  EXPECT_TRUE(plan_with({}).warnings.empty());
}

TEST(PlanMachine, ThreadsFarAboveTheCoresAreRefused) {
  const int cores = omp_get_num_procs();
  const std::vector<std::string> data = {"data.train=" + kSrc + "/data/sample/train_*.bin",
                                         "data.val=" + kSrc + "/data/sample/val.bin", "data.tokenizer="};
  auto with_threads = [&](int t) {
    std::vector<std::string> sets = data;
    sets.push_back("run.threads=" + std::to_string(t));
    return sets;
  };
  EXPECT_NO_THROW(zt::load_plan(kSrc + "/plans/base.json", with_threads(4 * cores), true));
  const std::string e = error_of([&] { zt::load_plan(kSrc + "/plans/base.json", with_threads(4 * cores + 1), true); });
  EXPECT_EQ(e, "plan: run.threads: " + std::to_string(4 * cores + 1) + " is more than 4 x the " +
                   std::to_string(cores) + " cores this process may use (0 = one per core)");
  // Another machine may run the plan: without check_files (estimate) the cores are not consulted.
  EXPECT_NO_THROW(zt::load_plan(kSrc + "/plans/base.json", with_threads(4 * cores + 1), false));
}

// ---- what actually runs -------------------------------------------------------------------------

// bf16 with device "auto" on a machine without a GPU used to train in fp32 while plan.json said bf16.
TEST(PlanBackend, Bf16WithAutoDeviceAndNoGpuIsRefused) {
  if (!zt::device::built_with_cuda() || zt::device::available()) GTEST_SKIP() << "needs a CUDA build without a GPU";
  const std::string e = error_of([&] { zt::choose_backend(plan_with({"precision.compute=bf16"}), 1); });
  EXPECT_EQ(e, "precision.compute: \"bf16\" needs a GPU, and device \"auto\" found none (it would train in fp32 on "
               "the CPU); set precision.compute to \"auto\" or \"fp32\", or run where nvidia-smi lists a GPU");
  EXPECT_EQ(zt::choose_backend(plan_with({}), 1), "cpu-fp32");
}

TEST(PlanBackend, ResolvedPlanRecordsWhatRuns) {
  zt::Plan p = plan_with({});
  zt::record_backend(p, "cpu-fp32");
  EXPECT_EQ(p.device, "cpu");
  EXPECT_EQ(p.precision.compute, "fp32");
  EXPECT_EQ(p.resolved["device"], "cpu");
  EXPECT_EQ(p.resolved["precision"]["compute"], "fp32");
  zt::record_backend(p, "cuda-bf16");
  EXPECT_EQ(p.resolved["device"], "cuda");
  EXPECT_EQ(p.resolved["precision"]["compute"], "bf16");
  zt::record_backend(p, "cuda-fp32");
  EXPECT_EQ(p.resolved["precision"]["compute"], "fp32");
  // The recorded plan is a valid plan that chooses the same backend again.
  zt::record_backend(p, "cpu-fp32");
  EXPECT_EQ(zt::choose_backend(zt::plan_from_json(p.resolved, false), 1), "cpu-fp32");
}

// The CUDA kernels also index positions x channels and batch x heads in 32 bits.
TEST(PlanBackend, CudaIntLimitsAreRefusedOnAnyMachine) {
  if (!zt::device::built_with_cuda()) GTEST_SKIP() << "no CUDA backend in this build";
  std::string e = error_of([&] {
    zt::choose_backend(plan_with({"device=cuda", "model.seq_len=2097152", "model.n_embd=1024", "model.n_head=16",
                                  "batch.micro_batch=1"}),
                       1);
  });
  EXPECT_EQ(e, "model: seq_len x n_embd = 2147483648 on device \"cuda\" is more than its kernels index in 32 bits "
               "(at most 2147483647)");
  e = error_of([&] {
    zt::choose_backend(plan_with({"device=cuda", "model.seq_len=1", "model.n_embd=64", "model.n_head=4",
                                  "batch.micro_batch=1073741824"}),
                       1);
  });
  EXPECT_EQ(e, "batch.micro_batch: micro_batch x model.n_head = 4294967296 on device \"cuda\" is more than its kernels "
               "index in 32 bits (at most 2147483647)");
}
