#include "train/engine_assembly.h"

#include <cstdint>
#include <utility>
#include <vector>

#include "backend/ops_cpu.h"
#if ZT_HAVE_CUDA
#include "backend/ops_cuda.h"
#include "comm/nccl_comm.h"
#include "comm/host_mirror_comm.h"
#endif

namespace zt {

namespace {

// The NCCL comm's timeout and fault injection, as the MPI comm has them (train.cu).
[[maybe_unused]] CommOptions nccl_options(const Plan& plan) {
  CommOptions co;
  co.timeout_s = plan.comm.timeout_s;
  co.fault_skip_rank = plan.comm.fault_skip_rank;
  co.fault_skip_step = plan.comm.fault_skip_step;
  return co;
}

}  // namespace

template <class Ops>
EngineParts<Ops> assemble_engine(const Plan& plan, const EngineSettings& es, Comm& comm, MemoryTracker& mem,
                                 const offload::SwapSpec& swap, DataLoader& train) {
  EngineParts<Ops> p;
  const int B = es.micro_batch, Tn = es.seq_len;
  [[maybe_unused]] const int stage = plan.zero.stage;
  // Units padded so every rank's shard has the same size. The model keeps no parameters or
  // gradients of its own: they are the store's (zero/store.h), pointed at by the engine.
  p.model = std::make_unique<GPT<Ops>>(es.model, B, Tn, mem, es.pad_multiple, false, false, es.recompute,
                                       es.embedding_rows, es.activation_slots);
  p.partition = std::make_unique<Partition>(p.model->layout(), es.zero);
  p.store = std::make_unique<StateStore>(list_model_state(p.model->layout(), *p.partition, es.types, swap), mem, swap);
  // The CUDA backend's collectives (comm.backend, train/backend_choice.h): NCCL on the device
  // buffers (comm/nccl_comm.h), or through pinned host mirrors over MPI (comm/host_mirror_comm.h).
  p.comm = &comm;
#if ZT_HAVE_CUDA
  if constexpr (Ops::tier == Tier::device) {
    if (plan.comm.backend == "nccl")
      p.device_comm = make_nccl_comm(nccl_options(plan), comm, Ops::stream(), es.types.param == DType::bf16);
    else
      p.device_comm = std::make_unique<HostMirrorComm>(
          comm, host_mirror_regions(*p.store, es.types.param, stage, es.zero.replicas > 1), int(dtype_bytes(es.types.param)));
    p.comm = p.device_comm.get();
  }
#endif
  // Micro-step 0's tokens of a step, for the lookup from the shards to be prepared a step ahead.
  StepTokens next{B, Tn, [&train, accum = plan.batch.grad_accum, targets = std::vector<int>(size_t(B) * size_t(Tn))](
                             int64_t step, int* tokens) mutable {
                    train.train_batch(step, 0, accum, tokens, targets.data());
                  }};
  // The mesh (zero/data_mesh.h): pipeline stages of consecutive ranks outermost, the pipeline group
  // across them; inside a stage, tensor groups of T adjacent ranks, the data axis across them; on the
  // data axis, shard groups of consecutive ranks, replicated across. Every rank makes every split, in
  // this order (Comm::split is collective).
  // The pipeline group is the host comm's even on the CUDA backend (the tied embedding's sum,
  // evaluation, samples, final weights cross through host memory, train/pipeline_step.cpp); on NCCL
  // the boundaries get a device pipeline group of their own.
  p.stage_comm = p.comm;
  if (const int P = es.model.whole_L > 0 ? plan.mesh.pipeline : 1; P > 1) {
    const int rank = p.comm->rank(), per_stage = p.comm->world() / P;
    p.pipe_group = comm.split(rank % per_stage, rank, "pipeline");
    p.stage_group = p.comm->split(rank / per_stage, rank, "stage");
    p.pipe_comm = p.pipe_group.get();
    p.stage_comm = p.stage_group.get();
    p.boundary_comm = p.pipe_comm;
    if (es.pipe_messages > 0) {  // NCCL: the boundaries between the stages' devices
      p.boundary_group = p.comm->split(rank % per_stage, rank, "pipeline");
      p.boundary_comm = p.boundary_group.get();
      const size_t n = size_t(es.pipe_messages), each = es.pipe_message_bytes;
      p.boundary_mem = mem.alloc(n * each, Ops::tier, Category::comm, "pipeline messages");
      float* at = p.boundary_mem.template as<float>();
      for (size_t i = 0; i < n; ++i, at += each / sizeof(float)) {
        if (i < 2) p.boundary_buffers.recv[i] = at;  // two receives, then one per send of the step
        else p.boundary_buffers.send.push_back(at);
      }
    }
  }
  p.data_comm = p.stage_comm;
  if (const int T = es.zero.tensor; T > 1) {
    const int rank = p.stage_comm->rank();
    p.tensor_group = p.stage_comm->split(rank / T, rank, "tensor");
    p.data_group = p.stage_comm->split(rank % T, rank, "data");
    p.tensor_comm = p.tensor_group.get();
    p.data_comm = p.data_group.get();
    p.tensor_ops = std::make_unique<CommTensorGroup>(*p.tensor_comm);
    p.model->set_tensor_group(p.tensor_ops.get());
  }
  p.shard_comm = p.data_comm;
  if (es.zero.replicas > 1) {
    const int rank = p.data_comm->rank(), S = es.zero.world;
    p.shard_group = p.data_comm->split(rank / S, rank, "shard");
    p.replicate_group = p.data_comm->split(rank % S, rank, "replicate");
    p.shard_comm = p.shard_group.get();
    p.replica_comm = p.replicate_group.get();
  }
  p.engine = std::make_unique<ZeroEngine<Ops>>(*p.model, *p.partition, *p.store, *p.shard_comm, plan.optim,
                                               std::move(next), p.replica_comm);
  if (p.tensor_comm) p.engine->set_tensor_group(p.tensor_comm);
  if (p.pipe_comm) p.engine->set_pipeline_group(p.pipe_comm, es.model.first_stage);
  return p;
}

template EngineParts<CpuOps<float>> assemble_engine<CpuOps<float>>(const Plan&, const EngineSettings&, Comm&,
                                                                  MemoryTracker&, const offload::SwapSpec&,
                                                                  DataLoader&);
#if ZT_HAVE_CUDA
template EngineParts<CudaOps<float>> assemble_engine<CudaOps<float>>(const Plan&, const EngineSettings&, Comm&,
                                                                    MemoryTracker&, const offload::SwapSpec&,
                                                                    DataLoader&);
template EngineParts<CudaOps<bf16>> assemble_engine<CudaOps<bf16>>(const Plan&, const EngineSettings&, Comm&,
                                                                  MemoryTracker&, const offload::SwapSpec&,
                                                                  DataLoader&);
#endif

}  // namespace zt
