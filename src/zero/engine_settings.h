// Plan -> what the model, the partition and the store are built with, derived once: the run
// (train/trainer.cpp) and `train estimate` (zero/estimate.cpp) both build from engine_settings(),
// so "the estimate is the tracked memory" (tested to the byte) rests on this one function.
#pragma once
#include <cstddef>
#include <utility>
#include <vector>

#include "model/gpt.h"
#include "pipeline/runner.h"
#include "pipeline/schedule.h"
#include "plan/plan.h"
#include "zero/data_mesh.h"
#include "zero/partition.h"
#include "zero/store.h"

namespace zt {

struct EngineSettings {
  GPTConfig model;
  int micro_batch = 0;      // B
  int seq_len = 0;          // Tn
  Recompute recompute;
  size_t pad_multiple = 0;  // every unit padded to a multiple of it (zero_pad_multiple)
  int embedding_rows = 0;   // wte rows per embedding unit (zero_embedding_rows; 0 = one unit)
  // Pipeline parallelism: micro-batches whose activations this stage holds at once, each in all its
  // chunks (pipeline/schedule.h pipe_activation_slots); 1 without.
  int activation_slots = 1;
  // Pipeline stages on NCCL (the CUDA backend, comm.backend "nccl"): the boundaries cross between the
  // stages' devices in device buffers (pipeline/runner.h PipeBuffers), pipe_messages of
  // pipe_message_bytes each (one message, aligned); none otherwise (host messages: on the host-staged
  // comm, and for shapes whose launches would close a cycle on NCCL, pipe_device_messages).
  int pipe_messages = 0;
  size_t pipe_message_bytes = 0;
  ZeroConfig zero;
  StateTypes types;

  ParamLayout layout() const { return ParamLayout(model, pad_multiple, embedding_rows); }
};

// Pipeline stage `stage` of P with v chunks each: its runs of blocks (first layer, blocks), chunk c
// being virtual stage c P + stage of the P v. The blocks are cut into P v runs by their forward
// FLOPs (GPT::forward_flops, the estimate's cost model), the last also paying for the head
// (pipeline/schedule.h balance_blocks).
template <class Ops>
std::vector<std::pair<int, int>> stage_runs(const GPTConfig& whole, int B, int Tn, int P, int v, int stage) {
  GPTConfig none = whole, one = whole;
  none.L = 0;
  one.L = 1;
  const double head = GPT<Ops>::forward_flops(none, B, Tn), block = GPT<Ops>::forward_flops(one, B, Tn) - head;
  const std::vector<int> n = balance_blocks(std::vector<double>(size_t(whole.L), block), P * v, 0.0, head);
  std::vector<std::pair<int, int>> runs;
  for (int j = 0, first = 0; j < P * v; first += n[size_t(j)], ++j)
    if (j % P == stage) runs.emplace_back(first, n[size_t(j)]);
  return runs;
}

// A stage boundary (GPT::boundary_bytes) as the pipeline runner's message: whole floats.
template <class Ops>
size_t pipe_message_floats(const GPTConfig& cfg, int B, int Tn) {
  return (GPT<Ops>::boundary_bytes(cfg, B, Tn) + sizeof(float) - 1) / sizeof(float);
}

// For rank mesh.rank of the mesh on the backend of op table Ops. The partition is the shard group's:
// its world and rank are the group's size and this rank's place in it (zero/data_mesh.h).
template <class Ops>
EngineSettings engine_settings(const Plan& plan, const DataMesh& mesh) {
  const int world = mesh.shard;
  const ModelSection& m = plan.model;
  EngineSettings s;
  // This tensor rank's part of the model (model/tensor_parallel.h); the whole model without.
  s.model = GPTConfig::make(m.n_layer, m.n_head, m.n_embd, m.seq_len, m.vocab_size).split(mesh.tensor, mesh.tensor_rank, plan.mesh.sequence_parallel);
  s.micro_batch = plan.batch.micro_batch;
  s.seq_len = m.seq_len;
  // This pipeline stage's blocks (docs/design.md §3.14), and the activations its schedule keeps alive.
  if (const int P = mesh.pipeline; P > 1) {
    const int v = plan.mesh.chunks;
    s.model = s.model.stage_chunks(P, mesh.stage, stage_runs<Ops>(s.model, s.micro_batch, s.seq_len, P, v, mesh.stage));
    const PipeShape shape{P, plan.batch.grad_accum, v};
    s.activation_slots = pipe_activation_slots(parse_pipe_schedule("mesh.schedule", plan.mesh.schedule), shape, mesh.stage);
  }
  s.recompute = Recompute::from(plan.recompute.policy, plan.recompute.every, plan.recompute.classifier_chunk);
  s.pad_multiple = zero_pad_multiple(world);
  s.embedding_rows = zero_embedding_rows(s.model, plan.zero.stage, world);

  ZeroConfig& zc = s.zero;
  zc.stage = plan.zero.stage;
  zc.world = world;
  zc.rank = mesh.shard_rank();
  zc.replicas = mesh.replicas;
  zc.tensor = mesh.tensor;
  zc.pipeline = mesh.pipeline;
  zc.overlap = plan.zero.overlap_comm;
  zc.bucket_mb = plan.zero.bucket_mb;
  zc.prefetch_units = plan.zero.prefetch_units;
  zc.grad_accum = plan.batch.grad_accum;
  zc.elem_bytes = sizeof(typename Ops::T);
  zc.micro_tokens = size_t(s.micro_batch) * size_t(s.seq_len);
  zc.host = Ops::tier == Tier::host;
  zc.classifier_regather = GPT<Ops>::classifier_regathers(s.model, s.micro_batch, s.seq_len, s.recompute,
                                                          s.layout().embedding_units());

  s.types = state_types_of<Ops>();
  // The CUDA backend's AdamW on the host (offload.optimizer "cpu" / "nvme", zero/host_optimizer.cpp).
  s.types.host_optimizer = Ops::tier == Tier::device && plan.offload.optimizer != "none";
  s.types.host_shards = Ops::tier == Tier::device && plan.offload.params == "cpu";
  // comm.backend as resolved (train/backend_choice.h): NCCL needs no host mirrors.
  s.types.host_mirror_comm = plan.comm.backend != "nccl";
  const PipeShape shape{mesh.pipeline, plan.batch.grad_accum, plan.mesh.chunks};
  const PipeSchedule sched = parse_pipe_schedule("mesh.schedule", plan.mesh.schedule);
  if (mesh.pipeline > 1 && Ops::tier == Tier::device && !s.types.host_mirror_comm && pipe_device_messages(sched, shape)) {
    s.pipe_messages = 2 + int(pipe_message_sends(sched, shape, mesh.stage));  // 2 receives, each send its own
    s.pipe_message_bytes = (pipe_message_floats<Ops>(s.model, s.micro_batch, s.seq_len) * sizeof(float) +
                            MemoryTracker::kAlign - 1) / MemoryTracker::kAlign * MemoryTracker::kAlign;
  }
  return s;
}

}  // namespace zt
