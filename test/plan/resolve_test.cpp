// How a plan file becomes a resolved plan: the shipped plans, "extends" chains and deep merge,
// reading the files, --set overrides.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "plan_testing.h"

using namespace plan_test;

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
