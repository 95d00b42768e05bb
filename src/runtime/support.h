// What this build supports, in one table: for each backend its device, precision, world size, ZeRO
// stages, head sizes, n_embd multiple and 32-bit index limits; and which values of the plan features
// (offload, checkpoints, master_weights) this build runs. Read by plan validation (src/plan), the
// backend choice (choose_backend, src/train/backend_choice.h) and ./train --help / --version (train.cu);
// nothing else decides what this build can run. Relax an entry here when a feature lands.
//
// It lives in the runtime (the ground, docs/design.md §2) because the plan, which may include only
// the runtime, validates against it. Whether the CUDA backend is built is device::built_with_cuda()
// (device.cu or device_nocuda.cpp is linked).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace zt::support {

struct Backend {
  std::string name;       // what choose_backend returns: "cpu-fp32", "cpu-bf16", "cuda-fp32", "cuda-bf16"
  std::string device;     // plan "device"
  std::string precision;  // plan "precision.compute" as run
  std::string library;    // "CPU", "CUDA": "this build has no <library> backend"
  bool built = false;     // compiled into this binary
  int max_world = 0;      // ranks; 0 = any (MPI)
  std::string world_note;           // what max_world means, for messages
  std::vector<int> zero_stages;     // allowed zero.stage values
  std::string stage_note;           // appended to the list of stages in messages
  std::vector<int> head_sizes;      // n_embd / n_head; empty = any
  int n_embd_multiple = 1;          // 1 = any
  std::string n_embd_note;          // why the multiple
  int64_t max_seq_x_embd = 0;       // seq_len x n_embd (position-table indexing); 0 = no limit here
  int64_t max_batch_x_heads = 0;    // micro_batch x n_head (attention grid); 0 = no limit here
  std::string note;                 // what else --help says of it ("" = nothing)
};

// Every backend this source tree has, built into this binary or not, in the order --help lists them.
const std::vector<Backend>& backends();
// The backend called `name`; throws zt::Error (internal) for a name not in the table.
const Backend& backend(const std::string& name);
// Some built backend runs on `device` / computes in `precision`.
bool device_built(const std::string& device);
bool precision_built(const std::string& precision);

// Plan features, for every backend of this build.
struct Features {
  std::vector<std::string> offload_params;     // values of offload.params
  bool checkpoint_saving = false;              // checkpoint.every > 0
  bool checkpoint_resume = false;              // checkpoint.resume other than "none"
  bool master_weights_off = false;             // precision.master_weights false
  std::vector<std::string> offload_optimizer;  // values of offload.optimizer
};
const Features& features();

// "16, 32, 64, 128"
std::string join(const std::vector<int>& v);
// The table as text, for ./train --help.
std::string help();

}  // namespace zt::support
