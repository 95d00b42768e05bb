// Pipeline parallelism in the loop (docs/design.md §3.14, docs/pipeline.md): a model stage as the
// runner's work (pipeline/runner.h runs the schedule's table and moves the boundary messages), the
// tied embedding's gradient between the first and the last stage, and evaluation's forward passes
// through the stages.
//
// One step on stage s of P, 1F1B, m = 4 micro-batches (P = 2):
//
//   stage 0 | F0 | F1 |    | B0 | F2 | B1 | F3 | B2 |    | B3 | tied sum | norm | AdamW
//   stage 1 |    | F0 | B0 | F1 | B1 | F2 | B2 | F3 | B3 |    tied sum | norm | AdamW
//   data    each stage's ZeRO engine reduces its units' gradients on its data axis in the last
//           backward (B3), as without a pipeline: once per step
//
// The last stage computes the loss; the trainer sums it over the world. The gradient norm sums
// every stage's units (ShardedOptimizer::set_pipeline_group), the embedding once.
#pragma once
#include <cstddef>
#include <string>
#include <vector>

#include "comm/comm.h"
#include "data/loader.h"
#include "model/gpt.h"
#include "pipeline/runner.h"
#include "plan/plan.h"
#include "runtime/trace.h"
#include "zero/engine.h"

namespace zt {

// One step's micro-batches: m x (B, Tn) token ids and targets, host memory.
struct StepBatches {
  std::vector<std::vector<int>> inputs, targets;
};

// Runs this stage's table for one step; returns the mean loss over the m micro-batches on the last
// stage, 0 on the others. tracer (run.trace): each pass a span "F<micro>" / "B<micro>" on the
// "pipeline stage" track. dloss as the trainer gives it to forward (1 / tokens in the global batch).
// pipe: the group the boundaries cross (the host pipeline group, or on NCCL the device one, with
// device_messages its buffers: pipeline/runner.h PipeBuffers; nullptr for host messages).
template <class Ops>
double pipeline_train_step(GPT<Ops>& model, ZeroEngine<Ops>& engine, Comm& pipe, PipeSchedule schedule,
                           const StepBatches& batches, int B, int Tn, typename Ops::S dloss, int slots,
                           const PipeBuffers* device_messages = nullptr, Tracer* tracer = nullptr,
                           PipeStepStats* stats = nullptr);

// After the engine completed the gradients: the first and the last stage each hold the gradient of
// their copy of the embedding (the lookup's part, the head's part); both add the other's, so their
// copies take the same update and stay equal. Nothing on the other stages. In pieces of
// kTiePieceNumel elements (1 MiB in fp32), each exchanged and waited for before the next.
inline constexpr size_t kTiePieceNumel = size_t(1) << 18;
template <class Ops>
void sum_tied_embedding(GPT<Ops>& model, ZeroEngine<Ops>& engine, Comm& pipe);

// The banner's line: each stage's layers (its chunks' runs, comma-separated), the schedule, its
// bubble and the micro-batches each stage holds at once, e.g. "pipeline of 2 stages (layers 0-3 | 4, cut by forward FLOPs), schedule 1f1b,
// 4 micro-batches: bubble (P-1)/(m+P-1) = 0.200, activations of 2 | 1 micro-batches held per stage".
template <class Ops>
std::string describe_pipeline(const Plan& plan, const GPTConfig& whole);

// One forward of (B, Tn) tokens through every virtual stage in turn (evaluation, sampling): each
// chunk receives its input from the rank of the virtual stage before and sends its output, `bytes`
// of the backend's elements through host memory (boundary: its buffer), to the one after. Returns
// the last stage's loss (0 elsewhere, and without targets); the model is left in its last chunk.
template <class Ops>
double pipeline_forward(GPT<Ops>& model, Comm& pipe, const int* inputs, const int* targets, int B, int Tn,
                        size_t bytes, std::vector<float>& boundary);

// Evaluation through the stages, one batch after the other: returns the sum of the n batches' mean
// losses on the last stage, 0 on the others.
template <class Ops>
double pipeline_eval_sum(GPT<Ops>& model, ZeroEngine<Ops>& engine, Comm& pipe, DataLoader& val, int64_t n, int B,
                         int Tn, int V);

}  // namespace zt
