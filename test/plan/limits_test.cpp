// Plans at the edges: nesting, long values, duplicate keys, sizes past the kernels' ints and 64 bits,
// machine limits, and the backend a plan actually runs on.
#include <gtest/gtest.h>
#include <omp.h>

#include <string>
#include <vector>

#include "kernels/matmul_bf16.h"
#include "runtime/device.h"
#include "train/backend_choice.h"
#include "zero/estimate.h"

#include "plan_testing.h"

using namespace plan_test;

// ---- robustness: nesting, long values, duplicate keys, sizes, machine limits ----------------------

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
// so activations 7,468,122,112 -> 5,971,189,760 at every stage, and -> 5,870,526,464 since the
// (B, T, 4C) gradient the GELU's backward no longer needs is gone (8 x 1024 x 3072 x 4 =
// 100,663,296); at stage 3 the split embedding's units are gathered once more for their
// gradients: sent + 7/8 x 4 x Pe (Pe = 39,419,904 padded embedding elements) = 1,431,034,752 ->
// 1,569,004,416.
TEST(PlanSizes, EstimateNumbersUnchangedForSizesThatFit) {
  const struct {
    std::vector<std::string> sets;
    int world;
    json memory;
    uint64_t bytes_per_step;
  } cases[] = {
      {{"zero.stage=0"}, 8,
       {{"activations", 5870526464ull}, {"grads", 497903616}, {"optimizer", 995807232}, {"params", 497903616},
        {"total", 7862140928ull}},
       871331328},
      {{"zero.stage=1"}, 8,
       {{"activations", 5870526464ull}, {"grads", 560141568}, {"optimizer", 124475904}, {"params", 497903616},
        {"total", 7053047552ull}},
       871331328},
      {{"zero.stage=2"}, 8,
       {{"activations", 5870526464ull}, {"comm", 241194240}, {"grads", 62237952}, {"optimizer", 124475904},
        {"params", 497903616}, {"total", 6796338176ull}},
       871331328},
      // Stage 3 since the embedding is six block-sized row chunks (docs/design.md §3.9): comm =
      // 4 x (2 staging buckets of a block + final norm, 7,089,408 each, their 1/8 receive, and 2
      // gather slots of a block, 7,087,872); sent = (3Ψ + 5 blocks) 7/8 x 4. Before: one
      // embedding-sized gather slot and gradient staging, comm 427225344, total 8144299264, sent
      // 1444966656; before that, two embedding-sized slots, comm 556553472, total 8273627392.
      {{"zero.stage=3"}, 8,
       {{"activations", 5870526464ull}, {"comm", 120507648}, {"grads", 62237952}, {"optimizer", 124475904},
        {"params", 62237952}, {"total", 6239985920ull}},
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
  // Huge but representable: 2.4e18 bytes of activations, exactly (2.5e18 while fcproj was kept;
  // 32767 x 65536 x 65536 x 4 more while the GELU's backward had a (B, T, 4C) gradient of its own).
  const zt::Estimate big = zt::estimate_plan(
      plan_with({"model.n_layer=1000", "model.n_embd=16384", "model.seq_len=65536", "batch.micro_batch=32767",
                 "zero.stage=3"}),
      4);
  EXPECT_EQ(big.by_tier_category.at({zt::Tier::host, zt::Category::activations}), 2394653941127970816ull);
  EXPECT_EQ(big.tier_total(zt::Tier::host), 2394666901949480960ull);
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

// bf16 without a GPU (device "cpu", or "auto" where none is visible) used to train in fp32 while
// plan.json said bf16; now it is the CPU's bf16 products, or refused where this CPU or build has none.
TEST(PlanBackend, Bf16OnTheCpuRunsOnlyWhereTheCpuHasIt) {
  if (zt::device::available()) GTEST_SKIP() << "needs a machine without a visible GPU";
  for (const std::string device : {"cpu", "auto"}) {
    SCOPED_TRACE(device);
    const zt::Plan p = plan_with({"device=" + device, "precision.compute=bf16"});
    const std::string why = device == "auto" ? "device \"auto\" found no GPU, and " : "";
    if (!zt::cpu::bf16::built())
      EXPECT_EQ(error_of([&] { zt::choose_backend(p, 1); }),
                "precision.compute: \"bf16\": " + why + "this build's CPU backend has no bf16 products (oneDNN, "
                "libdnnl-dev, was not found at configure time); set precision.compute to \"fp32\"");
    else if (!zt::cpu::bf16::cpu_supported())
      EXPECT_EQ(error_of([&] { zt::choose_backend(p, 1); }),
                "precision.compute: \"bf16\": " + why + "this CPU has no AVX512-BF16 or AMX-BF16 for the CPU "
                "backend's bf16 products; set precision.compute to \"fp32\"");
    else
      EXPECT_EQ(zt::choose_backend(p, 1), "cpu-bf16");
  }
  EXPECT_EQ(zt::choose_backend(plan_with({"device=cpu"}), 1), "cpu-fp32");
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
  zt::record_backend(p, "cpu-bf16");
  EXPECT_EQ(p.resolved["device"], "cpu");
  EXPECT_EQ(p.resolved["precision"]["compute"], "bf16");
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
