// One pipeline rank's step (docs/pipeline.md, docs/design.md §3.14): the passes of its schedule's
// table (pipeline/schedule.h), with the activations and gradients that cross stage boundaries moved
// point to point over the pipeline group. What a pass computes is the caller's (PipeStageWork): the
// runner knows the table and the messages, nothing of a model: train/pipeline_step.cpp makes a model
// stage its work, and the tests drive it with a toy stack of linear layers against one process.
//
// Messages: a forward of virtual stage j sends its output to the rank of j + 1, a backward of j > 0
// its input gradient to the rank of j - 1, each `floats` long, host memory (the CPU backend's). Sends
// are non-blocking and complete by the end of the step (a send completes when its receive is posted:
// comm/comm.h), so a rank never waits for its successor to take an output. Each receive is posted one
// pass ahead, in the order the table uses them, which is the order they are sent on every pair of
// ranks (PipeSchedule.MessagesAreUsedInTheOrderTheyAreSent): the transfer overlaps the pass before.
//
//   rank s   ... | F3 (recv for B1 posted) | B1 (waits: grad of B1 from s+1) | F4 ...
//   send        out of F3 ─────────────> rank s+1         in of B1 from s+1 (posted during F3)
#pragma once
#include <cstddef>
#include <cstdint>

#include "comm/comm.h"
#include "pipeline/schedule.h"

namespace zt {

struct PipeStageWork {
  virtual ~PipeStageWork() = default;
  // Chunk `chunk` (virtual stage chunk * P + rank) of micro-batch `micro`: input -> output, each
  // `floats` long; input is nullptr on virtual stage 0 (it reads its tokens), output nullptr on the
  // last (it computes the loss).
  virtual void forward(int chunk, int micro, const float* input, float* output) = 0;
  // output_grad (nullptr on the last virtual stage) -> input_grad (nullptr on virtual stage 0).
  virtual void backward(int chunk, int micro, const float* output_grad, float* input_grad) = 0;
};

struct PipeStepStats {
  uint64_t sends = 0, recvs = 0;  // messages this rank sent / received
  double recv_wait_s = 0;         // time the passes waited for their inputs
};

// Runs rank pipe.rank()'s table for one optimizer step. pipe: the pipeline group, its ranks in stage
// order (pipe.world() == shape.P). Throws zt::Error for a shape the schedule does not run, and
// CommTimeout (naming the op, the peer and the group) for a stage that never sends.
PipeStepStats run_pipe_step(PipeSchedule s, const PipeShape& shape, Comm& pipe, PipeStageWork& work, size_t floats);

}  // namespace zt
