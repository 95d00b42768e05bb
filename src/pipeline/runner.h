// One pipeline rank's step (docs/pipeline.md, docs/design.md §3.14): the passes of its schedule's
// table (pipeline/schedule.h), with the activations and gradients that cross stage boundaries moved
// point to point over the pipeline group. What a pass computes is the caller's (PipeStageWork): the
// runner knows the table and the messages, nothing of a model: train/pipeline_step.cpp makes a model
// stage its work, and the tests drive it with a toy stack of linear layers against one process.
//
// Messages: a forward of virtual stage j sends its output to the rank of j + 1, a backward of j > 0
// its input gradient to the rank of j - 1, each `floats` long, in host memory (the CPU backend's, and
// the CUDA backend's over MPI) or in device buffers (PipeBuffers: NCCL). Sends
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
#include <vector>

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

// Device messages (a pipeline group on NCCL): the runner's messages in buffers the caller allocated
// (and counted), each `floats` long, instead of host vectors: two for receives, and one for each
// message the rank sends in the step (pipe_message_sends; none reused within a step, so no send waits
// for another's buffer). PipeStageWork then gets device pointers.
//
// NCCL runs a rank's point-to-point launches in order on one stream, each launch holding the stream
// until all of its sends and receives have met their peers. A receive posted a pass ahead, alone,
// would hold the stream until its message came, with the send its sender is waiting for queued
// behind it (a middle stage of 1F1B: recv for B(k-w) launched, send of F(k) behind it, while the next
// stage's send of B(k-w) sits behind its own receive of F(k)). So with device messages each pass's
// output is sent in one launch with the next pass's receive, as Megatron-LM pairs them
// (send_forward_recv_backward): launch 0 = [recv of pass 0's input], launch i+1 = [send of pass i's
// output, recv of pass i+1's input] (pipe_launches; PipeRunner tests simulate every schedule's
// launches as NCCL runs them and find no cycle).
struct PipeBuffers {
  float* recv[2] = {nullptr, nullptr};
  std::vector<float*> send;
};
// Messages rank `rank` sends to other ranks in one step of `s`.
size_t pipe_message_sends(PipeSchedule s, const PipeShape& shape, int rank);
// The launches above for rank `rank`: each the peer a message goes to and the one a message comes
// from (-1: none), launches with neither left out.
struct PipeLaunch {
  int send_to = -1, recv_from = -1;
};
std::vector<PipeLaunch> pipe_launches(PipeSchedule s, const PipeShape& shape, int rank);
// Every rank's launches (launches[r]) run as NCCL runs them: in order, a launch done when each of
// its sends and receives has met its peer's in the peer's current launch (the k-th send from a to b
// meets the k-th receive on b from a). -1 when all finish, else the first rank left waiting.
int pipe_launches_stuck(const std::vector<std::vector<PipeLaunch>>& launches);
// Whether the shape's boundaries may cross as device messages: its paired launches finish (GPipe and
// 1F1B always; interleaved at m >= 2 P closes a cycle across the wrap-around from the last rank to
// the first, and keeps host messages).
bool pipe_device_messages(PipeSchedule s, const PipeShape& shape);

struct PipeStepStats {
  uint64_t sends = 0, recvs = 0;  // messages this rank sent / received
  double recv_wait_s = 0;         // time the passes waited for their inputs
};

// Runs rank pipe.rank()'s table for one optimizer step. pipe: the pipeline group, its ranks in stage
// order (pipe.world() == shape.P). Throws zt::Error for a shape the schedule does not run, and
// CommTimeout (naming the op, the peer and the group) for a stage that never sends.
// buffers: device messages (above), or nullptr for host memory.
PipeStepStats run_pipe_step(PipeSchedule s, const PipeShape& shape, Comm& pipe, PipeStageWork& work, size_t floats,
                            const PipeBuffers* buffers = nullptr);

}  // namespace zt
