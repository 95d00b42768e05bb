// A resolved plan checked: schema checks with suggestions, ranges, combinations, options this
// build does not support, data-file checks.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "runtime/device.h"
#include "runtime/support.h"

#include "plan_testing.h"

using namespace plan_test;

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
       zt::support::precision_built("bf16")
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

// The CUDA backend is part of every build that found nvcc; without it, cuda is refused, and bf16 too
// unless oneDNN gave the CPU backend its bf16 products (cpu-bf16; whether this CPU has them is asked
// where the backend is chosen: limits_test.cpp).
TEST(PlanUnsupported, CudaDependsOnTheBuild) {
  for (const std::vector<std::string>& sets :
       {std::vector<std::string>{"device=cuda"}, std::vector<std::string>{"device=cuda", "precision.compute=bf16"}}) {
    SCOPED_TRACE(sets.back());
    if (zt::device::built_with_cuda()) {
      EXPECT_NO_THROW(zt::load_plan(kSrc + "/plans/base.json", sets, false));
    } else {
      const std::string e = error_of([&] { zt::load_plan(kSrc + "/plans/base.json", sets, false); });
      EXPECT_NE(e.find("is not supported by this build yet"), std::string::npos) << e;
    }
  }
  for (const std::vector<std::string>& sets :
       {std::vector<std::string>{"precision.compute=bf16"}, std::vector<std::string>{"device=cpu", "precision.compute=bf16"}}) {
    SCOPED_TRACE(sets.back());
    const bool built = zt::device::built_with_cuda() || zt::support::backend("cpu-bf16").built;
    if (built) {
      EXPECT_NO_THROW(zt::load_plan(kSrc + "/plans/base.json", sets, false));
    } else {
      const std::string e = error_of([&] { zt::load_plan(kSrc + "/plans/base.json", sets, false); });
      EXPECT_NE(e.find("is not supported by this build yet"), std::string::npos) << e;
    }
  }
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
