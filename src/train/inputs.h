// Every file a command that runs or plans a plan reads, registered in one place (docs/design.md
// §3.8): `train` (its log, resolved plan, final weights and traces), `train plan` (the chosen plan,
// its report and the calibration cache) check their outputs against this one list, so no output
// of any command can be one of them.
#pragma once
#include "plan/plan.h"
#include "runtime/output_path.h"

namespace zt {

// Registers with `paths`: the plan file and every file of its "extends" chain (plan.files), the
// data shards after glob expansion (data.train and data.val), data.tokenizer, model.init, the
// checkpoint being resumed (its `latest` and the step directory it names) and the checkpoints in
// checkpoint.dir (`latest`, step directories saved or being saved). What does not exist is
// skipped: the readers refuse it later, in their own words.
void register_plan_inputs(OutputPaths& paths, const Plan& plan);

}  // namespace zt
