// The parts a run trains with, built once the plan has passed every start-up check
// (docs/design.md §3.8): the model, its partition, the state store, the comm the engine runs its
// collectives on (the CUDA backend's NCCL or host-mirror choice), and the ZeRO engine over them.
#pragma once
#include <memory>

#include "comm/comm.h"
#include "data/loader.h"
#include "model/gpt.h"
#include "offload/swap_file.h"
#include "pipeline/runner.h"
#include "plan/plan.h"
#include "runtime/memory.h"
#include "tensor/tensor_group.h"
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
  // Pipeline parallelism (mesh.pipeline > 1, zero/data_mesh.h): the pipeline group (this rank's place
  // in every stage, in stage order) and the stage (the ranks of this rank's stage, which the axes
  // below split); without, pipe_comm is nullptr and the stage `comm` itself.
  std::unique_ptr<Comm> pipe_group, stage_group;
  Comm* pipe_comm = nullptr;
  Comm* stage_comm = nullptr;
  // The group the stage boundaries cross: pipe_comm, or on NCCL (es.pipe_messages > 0) a pipeline
  // group of its own on the devices with its message buffers (tracked: the estimate's "pipeline
  // messages"; pipeline/runner.h PipeBuffers). The tied embedding's sum, evaluation, samples and
  // final weights stay on pipe_comm (host memory).
  std::unique_ptr<Comm> boundary_group;
  Comm* boundary_comm = nullptr;
  Allocation boundary_mem;
  PipeBuffers boundary_buffers;
  const PipeBuffers* device_messages() const { return boundary_group ? &boundary_buffers : nullptr; }
  // Tensor parallelism (mesh.tensor > 1, zero/data_mesh.h): the tensor group and the data axis,
  // split from `comm` once; the model completes its split products over tensor_ops. Without, the
  // data axis is `comm` itself and tensor_comm nullptr.
  std::unique_ptr<Comm> tensor_group, data_group;
  Comm* tensor_comm = nullptr;
  Comm* data_comm = nullptr;
  std::unique_ptr<CommTensorGroup> tensor_ops;
  // Hybrid sharding (zero/data_mesh.h): the shard group and the replicate group, split from
  // `data_comm` once; without replicas shard_comm is `comm` itself and replica_comm nullptr.
  std::unique_ptr<Comm> shard_group, replicate_group;
  Comm* shard_comm = nullptr;
  Comm* replica_comm = nullptr;
  std::unique_ptr<ZeroEngine<Ops>> engine;

  // This rank's traffic in the step over every comm the engine uses (the world's, if it is not the
  // shard group, carries only the trainer's scalars).
  CommStepStats step_stats() const {
    CommStepStats s = comm->step_stats();
    for (const Comm* c : {pipe_comm, boundary_comm == pipe_comm ? nullptr : boundary_comm, tensor_comm,
                          data_comm == shard_comm ? nullptr : data_comm, shard_comm, replica_comm}) {
      if (!c || c == comm) continue;
      const CommStepStats& g = c->step_stats();
      s.bytes += g.bytes, s.control_bytes += g.control_bytes, s.collectives += g.collectives;
      s.control_collectives += g.control_collectives, s.wait_s += g.wait_s, s.host_waits += g.host_waits;
    }
    return s;
  }
  void set_tracer(Tracer* t) {  // a lane per group (docs/traces.md)
    comm->set_tracer(t);
    for (Comm* c : {pipe_comm, boundary_comm == pipe_comm ? nullptr : boundary_comm, tensor_comm,
                    data_comm == shard_comm ? nullptr : data_comm, shard_comm, replica_comm})
      if (c && c != comm) c->set_tracer(t);
  }
};

// As engine_settings `es` sizes them (what `train estimate` counts), on `mem`; `swap`: the NVMe
// offload spec (train/offload_setup.h), referred to by the store for the run's lifetime. `train`:
// the training data, from which the engine reads a step's first tokens ahead (StepTokens,
// zero/embedding_exchange.h); it outlives the engine.
template <class Ops>
EngineParts<Ops> assemble_engine(const Plan& plan, const EngineSettings& es, Comm& comm, MemoryTracker& mem,
                                 const offload::SwapSpec& swap, DataLoader& train);

}  // namespace zt
