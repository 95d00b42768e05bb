// Text samples during training (run.sample_every): autoregressive from <|endoftext|>, temperature 1,
// with a deterministic RNG on (run.seed, step) (train/state.h).
#pragma once
#include "comm/comm.h"
#include "data/tokenizer.h"
#include "model/gpt.h"
#include "plan/plan.h"
#include "zero/engine.h"

namespace zt {

// Collective: every rank samples the same tokens (stage 3 gathers need all); rank 0 (`root`)
// prints them after `step`. V: model.vocab_size. With pipeline stages (`pipe`: the pipeline group),
// each token's forward runs through the stages as evaluation's does, the last stage draws the token
// and sends it to the first (which looks it up next, and prints).
template <class Ops>
void sample(GPT<Ops>& model, ZeroEngine<Ops>& engine, const Tokenizer& tokenizer, const Plan& plan, int V, int step,
            bool root, Comm* pipe = nullptr);

}  // namespace zt
