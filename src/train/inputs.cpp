#include "train/inputs.h"

#include <filesystem>

#include "checkpoint/checkpoint.h"
#include "data/shard.h"
#include "runtime/error.h"

namespace zt {

namespace fs = std::filesystem;

void register_plan_inputs(OutputPaths& paths, const Plan& plan) {
  for (size_t i = 0; i < plan.files.size(); ++i) paths.input(i == 0 ? "the plan" : "a plan it extends", plan.files[i]);
  if (plan.files.empty()) paths.input("the plan", plan.source);  // a Plan not loaded from a file
  for (const auto& [key, pattern] : {std::pair<const char*, std::string>{"data.train", plan.data.train},
                                     std::pair<const char*, std::string>{"data.val", plan.data.val}}) {
    if (pattern.empty()) continue;
    try {
      for (const std::string& f : data_files(pattern)) paths.input(key, f);
    } catch (const Error&) {  // nothing matches: nothing to protect (the loader refuses it when it is read)
    }
  }
  paths.input("data.tokenizer", plan.data.tokenizer);
  paths.input("model.init", plan.model.init);
  const CheckpointSection& ck = plan.checkpoint;
  if (ck.resume != "none" && ck.resume != "auto" && !ck.resume.empty()) {
    paths.input("checkpoint.resume", (fs::path(ck.resume) / "latest").string());
    try {  // the step directory it names; a path that names none is refused later, in its own words
      paths.input("checkpoint.resume", ckpt::resolve_resume(ck));
    } catch (const Error&) {
    }
  }
  if (!ck.dir.empty()) {  // its checkpoints: `latest` and the step directories (saved or being saved)
    paths.input("checkpoint.dir", (fs::path(ck.dir) / "latest").string());
    std::error_code ec;
    for (const fs::directory_entry& e : fs::directory_iterator(ck.dir, ec)) {
      const std::string n = e.path().filename().string();
      if (n.rfind("step_", 0) == 0 || n.rfind(".tmp_step_", 0) == 0) paths.input("checkpoint.dir", e.path().string());
    }
  }
}

}  // namespace zt
