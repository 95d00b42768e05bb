// The parts a run trains with, built once the plan has passed every start-up check
// (docs/design.md §3.8): the model, its partition, the state store, the comm the engine runs its
// collectives on (the CUDA backend's NCCL or host-mirror choice), and the ZeRO engine over them.
#pragma once
#include <memory>

#include "comm/comm.h"
#include "data/loader.h"
#include "model/gpt.h"
#include "offload/swap_file.h"
#include "plan/plan.h"
#include "runtime/memory.h"
#include "zero/engine.h"
#include "zero/engine_settings.h"
#include "zero/partition.h"
#include "zero/store.h"

namespace zt {

// Declared in the order they are built; destroyed in reverse, so each outlives what points at it
// (the engine refers to all the others).
template <class Ops>
struct EngineParts {
  std::unique_ptr<GPT<Ops>> model;
  std::unique_ptr<Partition> partition;
  std::unique_ptr<StateStore> store;
  // CUDA backend: the engine's comm for device buffers, NCCL or HostMirrorComm, over the run's comm.
  // comm: device_comm, or the run's comm itself on the CPU backend.
  std::unique_ptr<Comm> device_comm;
  Comm* comm = nullptr;
  std::unique_ptr<ZeroEngine<Ops>> engine;
};

// As engine_settings `es` sizes them (what `train estimate` counts), on `mem`; `swap`: the NVMe
// offload spec (train/offload_setup.h), referred to by the store for the run's lifetime. `train`:
// the training data, from which the engine reads a step's first tokens ahead (StepTokens,
// zero/embedding_exchange.h); it outlives the engine.
template <class Ops>
EngineParts<Ops> assemble_engine(const Plan& plan, const EngineSettings& es, Comm& comm, MemoryTracker& mem,
                                 const offload::SwapSpec& swap, DataLoader& train);

}  // namespace zt
