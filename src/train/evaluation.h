// The validation loss (run.eval_every and after the last step): the mean over run.eval_batches
// batches of data.val on every rank.
#pragma once
#include "comm/comm.h"
#include "data/loader.h"
#include "model/gpt.h"
#include "plan/plan.h"
#include "train/progress.h"
#include "zero/engine.h"

namespace zt {

// Collective. Rank 0 logs (`log`, null elsewhere) and prints it after `step`; V: model.vocab_size.
// pipe: the pipeline group (mesh.pipeline > 1): each batch's forward runs through the stages and the
// last stage's losses count.
template <class Ops>
double evaluate(GPT<Ops>& model, ZeroEngine<Ops>& engine, DataLoader& val, Comm& comm, const Plan& plan, int V,
                int step, MetricsLog* log, Comm* pipe = nullptr);

}  // namespace zt
