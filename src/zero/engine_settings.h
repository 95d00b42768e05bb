// Plan -> what the model, the partition and the store are built with, derived once: the run
// (train/trainer.cpp) and `train estimate` (zero/estimate.cpp) both build from engine_settings(),
// so "the estimate is the tracked memory" (tested to the byte) rests on this one function.
#pragma once
#include <cstddef>

#include "model/gpt.h"
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
  ZeroConfig zero;
  StateTypes types;

  ParamLayout layout() const { return ParamLayout(model, pad_multiple, embedding_rows); }
};

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
  s.recompute = Recompute::from(plan.recompute.policy, plan.recompute.every, plan.recompute.classifier_chunk);
  s.pad_multiple = zero_pad_multiple(world);
  s.embedding_rows = zero_embedding_rows(s.model, plan.zero.stage, world);

  ZeroConfig& zc = s.zero;
  zc.stage = plan.zero.stage;
  zc.world = world;
  zc.rank = mesh.shard_rank();
  zc.replicas = mesh.replicas;
  zc.tensor = mesh.tensor;
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
  return s;
}

}  // namespace zt
