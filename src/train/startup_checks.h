// What can refuse a plan at start-up, before the first large allocation and the first write
// (docs/design.md §3.8): data too small or with ids outside the vocabulary, host memory short of
// the estimate; and the per-batch guard the loop keeps for a shard rewritten while it runs.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "comm/comm.h"
#include "data/loader.h"
#include "data/tokenizer.h"
#include "offload/swap_file.h"
#include "plan/plan.h"
#include "train/outputs.h"
#include "zero/data_mesh.h"

namespace zt {

struct DataLoaders {
  std::unique_ptr<DataLoader> train, val;
};

// What the start-up checks leave for the run.
struct Startup {
  std::string refusal;  // "" = this rank found nothing wrong (agree_or_throw makes it one verdict)
  bool decorate = false;  // progress decorations (train/progress.h)
  DataLoaders data;
  std::unique_ptr<Tokenizer> tokenizer;  // data.tokenizer; null = no samples
  RunOutputs outputs;  // rank 0: all; the others: their trace
  offload::SwapSpec swap;  // train/offload_setup.h
};

// Everything that can refuse the plan, before the first large allocation and the first write: a
// refused plan has allocated and written nothing, and nothing that could be known now is found
// after training. The token scan and the output paths look at the same files from every rank, so
// rank 0 alone does them. V: model.vocab_size; final_weights_bytes: the llm.c file run.final_weights
// will take; host_backend: the CPU backend.
Startup check_startup(const Plan& plan, Comm& comm, int V, uint64_t final_weights_bytes, bool host_backend);

// The data mesh of zero.shard_group (zero/data_mesh.h), one verdict for all ranks (AgreedError):
// "host" needs every host to run the same number of ranks, numbered host by host.
DataMesh agreed_mesh(const Plan& plan, Comm& comm);

// The loaders of data.train and data.val for this rank, refusing data too small for one step or
// one evaluation: a short train file would repeat sequences within a step (several ranks reading
// the same data), a short val file used to be found at the final evaluation, after all the training.
DataLoaders open_data(const Plan& plan, int rank, int world);

// One pass over every token at start: an id outside the vocabulary (vocab_size `V`) used to stop
// the run at whatever step first drew its sequence (or never, if none did).
void check_token_ids(const DataLoaders& data, int V);

// The estimate is what the tracker will allocate (tested to the byte), so it can be compared
// before allocating: past the available memory the kernel's OOM killer would end the run with no
// message at all. Every rank on this host (`local_world` of them) allocates its own.
void check_host_memory(const Plan& plan, int world, int local_world);

// The start-up scan found no id outside the vocabulary; this guards the embedding lookup against
// a shard rewritten while the run maps it.
void check_tokens(const std::vector<int>& inputs, const std::vector<int>& targets, int V);

}  // namespace zt
