// Sharded checkpoints (docs/design.md §3.7): save (collective, atomic), find, load (any world size
// and stage: by global name and offset). The buffers come in as raw pointers with their element type
// and held ranges (zero/store.h), with the backend's copy function; state_io.h connects a store.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "checkpoint/format.h"
#include "comm/comm.h"
#include "model/layout.h"
#include "plan/plan.h"
#include "zero/store.h"

namespace zt::ckpt {

// Copies between backend and host memory; nullptr when the buffers are host memory (the CPU
// backend), which is then written from and read into directly, without a staging copy.
using CopyFn = void (*)(void* dst, const void* src, size_t bytes);

// One persistent buffer of a rank: its kind, element type, base pointer (backend memory) and the
// global ranges it holds, as the store lists them.
struct Buffer {
  Kind kind;
  DType dtype;
  void* base;
  std::vector<TensorRange> holds;
  // In the backend's memory (crosses through the copy function), or in host memory (read and
  // written in place): the CUDA backend's host optimizer keeps its state pinned on the host.
  bool in_backend_memory = true;
  // A buffer without memory of its own (an offloaded state in its swap file): base is unused, the
  // save reads each range through read_range(dst, bytes, byte offset) and the load writes it through
  // write_range, so no host copy of the whole buffer is ever made.
  std::function<void(void*, size_t, size_t)> read_range;
  std::function<void(const void*, size_t, size_t)> write_range;
};

// Bytes moved (all ranks), seconds, and the checkpoint directory.
struct Transfer {
  uint64_t bytes = 0;
  double seconds = 0;
  std::string dir;
  std::string summary(const char* verb) const;  // "checkpoint: saved ...: 1.2 GiB in 0.8 s (1.6 GB/s)"
};

// Writes the checkpoint of `meta.step` under `dir` (collective over `comm`): every rank writes its
// own file into a temporary directory and syncs it; once every rank reports success, rank 0 writes
// model.h5, renames the directory into place, points `latest` at it and removes all but the
// `keep` newest. A buffer every rank holds whole (stage 0-2 parameters, stage-0 moments) is saved
// 1/world per rank (each tensor cut evenly), so no rank writes more than its share and nothing is
// gathered. Any failure leaves the previous checkpoint and `latest` untouched.
// `progress` (may be empty) is called with the fraction of this rank's file written so far.
using Progress = std::function<void(double fraction)>;
Transfer save(Comm& comm, const std::string& dir, int keep, size_t chunk_bytes, const Meta& meta,
              const ParamLayout& layout, const std::vector<Buffer>& buffers, CopyFn d2h, const Progress& progress = {});

// The step directory `latest` names under `dir` ("" when there is none); refuses a `latest` that
// names something that is not there.
std::string latest(const std::string& dir);
// What checkpoint.resume asks for: "" (start fresh: "none", or "auto" without a checkpoint yet) or a
// step directory. A path may name a step directory or a checkpoint.dir (then its latest).
std::string resolve_resume(const CheckpointSection& c);

// Rounds n fp32 values to the backend's bf16 parameters at dst (backend memory): a bf16 run
// continuing from fp32 weights (a CPU run's checkpoint). nullptr where parameters are fp32.
using ToBf16Fn = void (*)(void* dst, const float* src, size_t n);

// Reads every range `buffers` hold from the checkpoint in `step_dir` (copying with h2d) after
// checking that it continues this plan: model shape, seed, data position per step (the global
// batch), step within run.steps. fp32 parameters come from the master weights when the checkpoint
// has them (a bf16 run's), bf16 parameters from fp32 ones through to_bf16 when it has no bf16 ones.
// Returns the checkpoint's metadata in `got`.
Transfer load(const std::string& step_dir, const Plan& plan, int world, const ParamLayout& layout,
              const std::vector<Buffer>& buffers, CopyFn h2d, ToBf16Fn to_bf16, Meta& got);

// The fp32 weights of a checkpoint (master weights when it has them), one tensor at a time, as a
// plain HDF5 file of full tensors ("hdf5", named as in model.h5) or an llm.c model file ("llmc").
// `ckpt` is a step directory or a checkpoint.dir (its latest).
Transfer export_weights(const std::string& ckpt, const std::string& format, const std::string& out);

// Fault injection for tests: ZT_FAULT_KILL_IN_SAVE=R@S makes rank R kill itself (SIGKILL, as
// kill -9) half way through writing its file of the checkpoint of step S. True for that rank and step.
bool fault_kill_in_save(int rank, int64_t step);
// ZT_FAULT_PAUSE_IN_SAVE=R@S (or R: every save) makes rank R wait half way through its file until a
// stop signal arrives (train/stop_signal.h), so that tests signal a save in progress without racing it.
bool fault_pause_in_save(int rank, int64_t step);

}  // namespace zt::ckpt
