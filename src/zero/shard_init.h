// Stage 3's parameters initialised shard-wise (zero/shard_init.cpp): random GPT-2 values or an
// llm.c file, each rank writing only its own shard where the store keeps it (device, pinned host
// memory or its swap file). Stages 0-2 initialise the full parameters in the model itself.
#pragma once
#include <cstdint>
#include <string>

#include "model/gpt.h"
#include "zero/store.h"

namespace zt {

template <class Ops>
void init_param_shard(GPT<Ops>& model, const StateStore& store, uint64_t seed, const std::string& llmc_path);

}  // namespace zt
