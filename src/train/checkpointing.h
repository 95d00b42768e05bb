// The run's model state in and out (docs/design.md §3.7, §3.9): where a run starts (a captured
// TrainState, a checkpoint to resume, or the plan's init), the periodic sharded checkpoint, and
// the final weights in llm.c format.
#pragma once
#include <cstdint>
#include <string>

#include "checkpoint/checkpoint.h"
#include "checkpoint/checkpoint_dir.h"
#include "comm/comm.h"
#include "plan/plan.h"
#include "train/engine_assembly.h"
#include "train/outputs.h"
#include "train/state.h"
#include "train/trainer.h"

namespace zt {

// The checkpoint a run continues, and what loading it took.
struct Resume {
  std::string from;  // its step directory ("" = none)
  ckpt::Transfer loaded;
  ckpt::Meta meta;
};

// Fills `state` (its seed: run.seed) and the store's buffers: from ctl.start's TrainState (same
// plan and world), else from the checkpoint `cont` names (into `resume`), else the parameters from
// model.init. Returns the refusal of a state or checkpoint that does not continue this plan ("" =
// none); running out of memory throws.
template <class Ops>
std::string start_state(const Plan& plan, const RunControl& ctl, const ckpt::Continuation& cont, int world,
                 EngineParts<Ops>& parts, TrainState& state, Resume& resume);

// Collective: the load's bytes summed over every rank, its time the slowest rank's.
void total_load(Comm& comm, Resume& resume);

// Rank 0's first lines: the earlier run's files moved aside (`moved`), the checkpoint directory's
// `note`, the resumed checkpoint (what was loaded, and on stderr the plan fields that changed since
// it was saved).
void report_start(const std::string& moved, const std::string& note, const Resume& resume, const Plan& plan,
                  int64_t step);

// Collective: every rank writes its shards (checkpoint/checkpoint.h), nothing is gathered.
// `decorate`: rank 0 shows on a terminal how far its own file is.
template <class Ops>
void save_checkpoint(Comm& comm, const Plan& plan, const TrainState& state, const GPTConfig& cfg, uint64_t run_id,
                     const ParamLayout& layout, const StateStore& store, bool decorate);

// Collective, after step `step`: a checkpoint when checkpoint.every says so or a stop signal came
// (agreed by every rank). Returns true when a signal ends the run here (the checkpoint saved).
template <class Ops>
bool checkpoint_when_due(Comm& comm, const Plan& plan, const TrainState& state, const GPTConfig& cfg, uint64_t run_id,
                         EngineParts<Ops>& parts, bool decorate, int step);

// Collective (stage 3 gathers one unit at a time); rank 0 writes each unit as it comes. With
// pipeline stages, each later stage's first rank sends its blocks to rank 0 over the pipeline group
// in batches of about 1 MiB, after rank 0 has written its own stage's.
template <class Ops>
void save_final_weights(EngineParts<Ops>& parts, const Plan& plan, const RunOutputs& outputs, bool root);

}  // namespace zt
