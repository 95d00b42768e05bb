// Pipeline parallelism's schedules (docs/pipeline.md; docs/design.md §3.14): which forward and
// backward passes each of the P pipeline ranks runs, in which order, for m micro-batches, written as
// tables a reader can follow and a simulator can check: what the runner (pipeline/runner.h) executes,
// and what the step loop, the estimate's in-flight activations and the banner's bubble read.
//
// Virtual stages: with v model chunks per rank (interleaved), rank s holds chunks c = 0..v-1, and
// chunk c is virtual stage j = c P + s of the P v in the model (Megatron-LM's layout: a micro-batch
// crosses every rank v times). v = 1 is the plain pipeline, j = s.
//
//   gpipe        all forwards, then all backwards (GPipe, Huang et al. 2019): m activations alive
//   1f1b         PipeDream-flush (Narayanan et al. 2021): rank s runs min(P - s - 1, m) forwards,
//                then one forward and one backward in turn, then the remaining backwards: at most
//                min(P - s, m) activations alive, the same bubble as GPipe
//   interleaved  1F1B over v chunks per rank (Narayanan et al. 2021, Megatron-LM): rank s warms up
//                with (P - s - 1) 2 + (v - 1) P forwards; forward k runs chunk (k mod P v) / P of
//                micro-batch (k / P v) P + k mod P, backward k the chunks in reverse; needs m a
//                multiple of P
//
// Bubble (idle fraction of a rank, equal forward and backward times per virtual stage):
//   gpipe, 1f1b: (P - 1) / (m + P - 1)        interleaved: (P - 1) / (v m + P - 1)
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace zt {

enum class PipeSchedule { gpipe, one_f_one_b, interleaved };
// "gpipe" | "1f1b" | "interleaved"; anything else throws zt::Error naming `what` and the choices.
PipeSchedule parse_pipe_schedule(const std::string& what, const std::string& name);
const char* pipe_schedule_name(PipeSchedule s);

// One pass of one micro-batch through one of this rank's chunks.
struct PipeOp {
  enum Kind : uint8_t { forward, backward };
  Kind kind;
  int micro;  // 0..m-1
  int chunk;  // 0..v-1: virtual stage chunk * P + rank
  bool operator==(const PipeOp& o) const { return kind == o.kind && micro == o.micro && chunk == o.chunk; }
};

struct PipeShape {
  int P = 1;  // pipeline ranks
  int m = 1;  // micro-batches per optimizer step
  int v = 1;  // chunks (virtual stages) per rank
  int virtual_stages() const { return P * v; }
};

// "" when `s` runs this shape, else one line saying why, with the arithmetic (fewer micro-batches
// than stages runs, with its bubble; interleaved needs v >= 2 and m a multiple of P).
std::string pipe_refusal(PipeSchedule s, const PipeShape& shape);
// The table: rank `rank`'s passes in the order it runs them (each (micro, chunk) once forward and once
// backward). Throws zt::Error with pipe_refusal's line for a shape the schedule does not run.
std::vector<PipeOp> pipe_ops(PipeSchedule s, const PipeShape& shape, int rank);
// Activation slots rank `rank` needs when one slot holds a micro-batch's activations in every one of
// its chunks (GPT::use_activation_slot; slot = micro mod slots): the widest span of micro-batches
// alive at once in its table, a micro-batch alive from its first forward to its last backward. Equal
// to simulate_pipe's peak_alive with one chunk; with v it counts micro-batches, not (micro, chunk)
// pairs.
int pipe_activation_slots(PipeSchedule s, const PipeShape& shape, int rank);
// The idle fraction above (theory).
double pipe_bubble(PipeSchedule s, const PipeShape& shape);

// Every rank running its table with forward and backward times tf and tb per virtual stage, a pass
// starting when its rank is free and its inputs exist (forward: the previous virtual stage's forward
// of the micro-batch; backward: the next one's backward, or its own forward on the last), messages
// taking no time.
struct PipeTimeline {
  struct Slot {
    PipeOp op;
    double start, end;
  };
  std::vector<std::vector<Slot>> ranks;  // per rank, in its table's order
  double makespan = 0;
  double bubble = 0;                     // 1 - busy / (P makespan)
  std::vector<int> peak_alive;           // per rank: most (micro, chunk) activations held at once
};
// Throws zt::Error naming the first stuck rank and pass when no rank can proceed (a table that
// would hang).
PipeTimeline simulate_pipe(PipeSchedule s, const PipeShape& shape, double tf, double tb);

// The activations and gradients rank `from` sends rank `to`, in the order its table sends them, and
// in the order `to`'s table uses them. (A forward of virtual stage j sends its output to the rank of
// j + 1; a backward of j > 0 sends its input gradient to the rank of j - 1.) Point-to-point messages
// match in posting order (comm/comm.h), so a receiver that posts its receives in use order gets the
// right message only where the two agree.
struct PipeMessage {
  PipeOp::Kind kind;  // forward: an activation; backward: a gradient
  int micro;
  int virtual_stage;  // the sender's
  bool operator==(const PipeMessage& o) const {
    return kind == o.kind && micro == o.micro && virtual_stage == o.virtual_stage;
  }
};
std::vector<PipeMessage> pipe_sends(PipeSchedule s, const PipeShape& shape, int from, int to);
std::vector<PipeMessage> pipe_uses(PipeSchedule s, const PipeShape& shape, int from, int to);

// Blocks per virtual stage: L blocks cut into `parts` contiguous, non-empty runs minimising the most
// expensive one, block i costing block_cost[i], the first run first_extra more (the embedding), the
// last last_extra more (final norm, head and loss); of equal splits, the later runs hold more blocks
// (under 1F1B an earlier stage holds more micro-batches' activations). Throws zt::Error when
// L < parts ("a stage with no block").
std::vector<int> balance_blocks(const std::vector<double>& block_cost, int parts, double first_extra,
                                double last_extra);

// The timeline as text, one line per rank, `cols` columns per time unit of tf:
//   rank 0 |F0 F1 F2 F3 B0 F4 B1 ...
// (F/B, micro-batch, and the chunk as a letter after it when v > 1).
std::string render_pipe(const PipeTimeline& t, const PipeShape& shape, double tf);

}  // namespace zt
