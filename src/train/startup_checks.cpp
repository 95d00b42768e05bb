#include "train/startup_checks.h"

#include <algorithm>
#include <string>
#include <utility>

#include "runtime/error.h"
#include "runtime/memory.h"
#include "train/backend_choice.h"
#include "train/offload_setup.h"
#include "train/progress.h"
#include "zero/estimate.h"

namespace zt {

Startup check_startup(const Plan& plan, Comm& comm, int V, uint64_t final_weights_bytes, bool host_backend) {
  const int world = comm.world();
  Startup s;
  try {
    s.decorate = decorate_progress();
    // Along the data axis: the ranks of one tensor group read the same batch, and those of one
    // pipeline group (zero/data_mesh.h).
    const DataMesh mesh = DataMesh::of(plan, world, comm.rank(), comm.local_world());
    s.data = open_data(plan, mesh.rank, mesh.world);
    if (!plan.data.tokenizer.empty()) s.tokenizer = std::make_unique<Tokenizer>(plan.data.tokenizer);
    if (comm.rank() == 0) {
      check_token_ids(s.data, V);
      s.outputs = check_run_outputs(plan, final_weights_bytes, world);
    } else {
      s.outputs = check_rank_outputs(plan, comm.rank());
    }
    // The CUDA backend's host memory is modelled when the plan names device "cuda" (zero/estimate.h).
    if (host_backend || plan.device == "cuda") check_host_memory(plan, world, comm.local_world());
    s.swap = prepare_offload(plan, world, comm.rank(), comm.local_world(), host_backend);
  } catch (const std::exception& e) {
    s.refusal = e.what();
  }
  return s;
}

DataMesh agreed_mesh(const Plan& plan, Comm& comm) {
  const int world = comm.world(), rank = comm.rank();
  std::string why;
  if (plan.zero.shard_group == "host" && world > 1) {
    // Every rank looks at every rank's place on its host (the same verdict everywhere, before any
    // rank could refuse on its own: a host of another size must not leave the others waiting).
    const std::vector<uint64_t> all = comm.all_gather_u64((uint64_t(comm.local_world()) << 32) | uint64_t(comm.local_rank()));
    const uint64_t size = all[0] >> 32;
    for (int r = 0; r < world && why.empty(); ++r) {
      const uint64_t lw = all[size_t(r)] >> 32, lr = all[size_t(r)] & 0xffffffffu;
      if (lw != size || lr != uint64_t(r) % size)
        why = "zero.shard_group \"host\": rank " + std::to_string(r) + " is rank " + std::to_string(lr) + " of " +
              std::to_string(lw) + " on its host, rank 0 one of " + std::to_string(size) +
              ": \"host\" needs the same number of ranks on every host, numbered host by host (mpirun -H a:K,b:K "
              "or --map-by ppr:K:node); or give the group size as a number";
    }
  }
  DataMesh mesh;
  if (why.empty()) {
    try {
      mesh = DataMesh::of(plan, world, rank, comm.local_world());
    } catch (const Error& e) {
      why = e.what();
    }
  }
  agree_or_throw(comm, why, "refused the plan");
  return mesh;
}

DataLoaders open_data(const Plan& plan, int rank, int world) {
  const int B = plan.batch.micro_batch, Tn = plan.model.seq_len, accum = plan.batch.grad_accum;
  // Shard errors name the file; the prefix names the plan field that pointed at it.
  auto open = [&](const char* field, const std::string& pattern, bool shuffle) {
    try {
      return std::make_unique<DataLoader>(pattern, B, Tn, rank, world, plan.run.seed, shuffle);
    } catch (const Error& e) {
      throw Error(std::string(field) + ": " + e.what());
    }
  };
  DataLoaders data;
  data.train = open("data.train", plan.data.train, plan.data.shuffle);
  data.val = open("data.val", plan.data.val, false);
  const char* ranks = world == 1 ? " rank" : " ranks";
  const uint64_t per_step = uint64_t(B) * uint64_t(accum) * uint64_t(world);
  ZT_REQUIRE(data.train->num_sequences() >= per_step,
             "data.train: " << plan.data.train << " holds " << data.train->num_sequences() << " sequence(s) of " << Tn + 1
                            << " tokens, fewer than one optimizer step uses (" << per_step << " = micro_batch " << B
                            << " x grad_accum " << accum << " x " << world << ranks
                            << "); add data, or lower batch.micro_batch or batch.grad_accum");
  const uint64_t per_eval = uint64_t(B) * uint64_t(world);
  ZT_REQUIRE(data.val->num_sequences() >= per_eval,
             "data.val: " << plan.data.val << " holds " << data.val->num_sequences() << " sequence(s) of " << Tn + 1
                          << " tokens, fewer than one evaluation batch (" << per_eval << " = micro_batch " << B << " x "
                          << world << ranks << "); add data, or lower batch.micro_batch");
  return data;
}

void check_token_ids(const DataLoaders& data, int V) {
  for (const auto& [field, loader] : {std::pair{"data.train", data.train.get()}, std::pair{"data.val", data.val.get()}})
    if (const auto bad = loader->first_token_at_least(V))
      throw Error(std::string(field) + ": " + bad->file + " holds token id " + std::to_string(bad->id) + " at token " +
                  std::to_string(bad->position) + ", outside the vocabulary (model.vocab_size " +
                  std::to_string(V) + "); tokenize the data for this vocabulary, or raise model.vocab_size");
}

void check_host_memory(const Plan& plan, int world, int local_world) {
  const HostMemory avail = host_memory_available();
  if (avail.bytes == 0) return;  // nothing to compare with (not Linux)
  // Host memory of every kind: pageable, and pinned (the CUDA backend's staging and offloaded state).
  const Estimate est = estimate_plan(plan, world);
  const uint64_t per_rank = est.tier_total(Tier::host) + est.tier_total(Tier::pinned);
  const uint64_t need = per_rank * uint64_t(local_world);
  ZT_REQUIRE(need <= avail.bytes,
             "memory: this plan needs " << format_bytes(double(need)) << " on this host (" << format_bytes(double(per_rank))
                                        << " per rank x " << local_world << " rank(s), as ./train estimate "
                                        << "reports) but " << format_bytes(double(avail.bytes)) << " is available ("
                                        << avail.source << "); next step: " << next_memory_step(plan, world));
}

void check_tokens(const std::vector<int>& inputs, const std::vector<int>& targets, int V) {
  for (size_t i = 0; i < inputs.size(); ++i)
    ZT_REQUIRE(inputs[i] < V && targets[i] < V,
               "data: token id " << std::max(inputs[i], targets[i]) << " is outside the vocabulary (model.vocab_size "
                                 << V << ")");
}

}  // namespace zt
