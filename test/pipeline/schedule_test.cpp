// The pipeline schedules' tables (src/pipeline/schedule.h) against arithmetic: every pass once and in
// order, no table that hangs, the bubble and the activations in flight the papers state, messages
// used in the order they are sent, the layer split, and the drawing docs/pipeline.md shows; the
// runner's device launches (pipeline/runner.h) run as NCCL runs them, without a cycle.
#include "pipeline/runner.h"
#include "pipeline/schedule.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <iterator>
#include <numeric>
#include <set>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "runtime/error.h"

namespace zt {
namespace {

const PipeSchedule kAll[] = {PipeSchedule::gpipe, PipeSchedule::one_f_one_b, PipeSchedule::interleaved};

// Every shape with P 1-5, m 1-9, v 1-3 that schedule s runs.
std::vector<PipeShape> shapes(PipeSchedule s) {
  std::vector<PipeShape> out;
  for (int P = 1; P <= 5; ++P)
    for (int m = 1; m <= 9; ++m)
      for (int v = 1; v <= 3; ++v)
        if (pipe_refusal(s, {P, m, v}).empty()) out.push_back({P, m, v});
  return out;
}

std::string name(PipeSchedule s, const PipeShape& sh) {
  return std::string(pipe_schedule_name(s)) + " P " + std::to_string(sh.P) + " m " + std::to_string(sh.m) + " v " +
         std::to_string(sh.v);
}

TEST(PipeSchedule, EveryPassOnceAndEachForwardBeforeItsBackward) {
  for (PipeSchedule s : kAll)
    for (const PipeShape& sh : shapes(s))
      for (int r = 0; r < sh.P; ++r) {
        const std::vector<PipeOp> ops = pipe_ops(s, sh, r);
        ASSERT_EQ(ops.size(), size_t(2 * sh.m * sh.v)) << name(s, sh);
        std::set<std::tuple<int, int, int>> seen;
        for (const PipeOp& op : ops) {
          ASSERT_TRUE(op.micro >= 0 && op.micro < sh.m && op.chunk >= 0 && op.chunk < sh.v) << name(s, sh);
          ASSERT_TRUE(seen.insert({op.kind, op.micro, op.chunk}).second) << name(s, sh) << ": a pass twice";
          if (op.kind == PipeOp::backward) {
            ASSERT_TRUE(seen.count({PipeOp::forward, op.micro, op.chunk})) << name(s, sh) << ": backward first";
          }
        }
      }
}

// With equal passes per virtual stage no table hangs, and the idle fraction is the papers' formula:
// (P - 1) / (m + P - 1) for GPipe and 1F1B, (P - 1) / (v m + P - 1) interleaved.
TEST(PipeSchedule, NoTableHangsAndTheBubbleIsTheFormula) {
  for (PipeSchedule s : kAll)
    for (const PipeShape& sh : shapes(s))
      for (double tb : {1.0, 2.0}) {
        const PipeTimeline t = simulate_pipe(s, sh, 1.0, tb);
        const double v = s == PipeSchedule::interleaved ? sh.v : 1;
        EXPECT_DOUBLE_EQ(t.makespan, (v * sh.m + sh.P - 1) * (1.0 + tb)) << name(s, sh) << " tb " << tb;
        EXPECT_NEAR(t.bubble, pipe_bubble(s, sh), 1e-12) << name(s, sh) << " tb " << tb;
      }
}

// 1F1B holds at most min(P - s, m) micro-batches' activations on rank s; GPipe all m; interleaved
// its warm-up's forwards plus one, in chunks (each 1/v of a rank's layers).
TEST(PipeSchedule, ActivationsInFlight) {
  for (const PipeShape& sh : shapes(PipeSchedule::one_f_one_b)) {
    const PipeTimeline one = simulate_pipe(PipeSchedule::one_f_one_b, sh, 1, 2);
    const PipeTimeline all = simulate_pipe(PipeSchedule::gpipe, sh, 1, 2);
    for (int r = 0; r < sh.P; ++r) {
      EXPECT_EQ(one.peak_alive[size_t(r)], std::min(sh.P - r, sh.m)) << name(PipeSchedule::one_f_one_b, sh) << " rank " << r;
      EXPECT_EQ(all.peak_alive[size_t(r)], sh.m) << name(PipeSchedule::gpipe, sh) << " rank " << r;
    }
  }
  for (const PipeShape& sh : shapes(PipeSchedule::interleaved)) {
    const PipeTimeline t = simulate_pipe(PipeSchedule::interleaved, sh, 1, 2);
    for (int r = 0; r < sh.P; ++r)
      EXPECT_EQ(t.peak_alive[size_t(r)], std::min((sh.P - r - 1) * 2 + (sh.v - 1) * sh.P + 1, sh.m * sh.v))
          << name(PipeSchedule::interleaved, sh) << " rank " << r;
  }
}

// Slots of whole micro-batches (slot = micro mod slots, every chunk of a micro-batch in its slot):
// pipe_activation_slots is the fewest with which no micro-batch's slot is still held by another,
// walking each rank's table; with one chunk it is the simulator's peak.
int first_slot_clash(const std::vector<PipeOp>& ops, int m, int v, int slots) {
  std::vector<int> holder(size_t(slots), -1), left(size_t(m), v);
  for (size_t i = 0; i < ops.size(); ++i) {
    const PipeOp& op = ops[i];
    int& h = holder[size_t(op.micro % slots)];
    if (op.kind == PipeOp::forward) {
      if (h != -1 && h != op.micro) return int(i);
      h = op.micro;
    } else if (--left[size_t(op.micro)] == 0) {
      h = -1;
    }
  }
  return -1;
}

TEST(PipeSchedule, ActivationSlotsAreTheFewestWithoutAClash) {
  for (PipeSchedule s : {PipeSchedule::gpipe, PipeSchedule::one_f_one_b, PipeSchedule::interleaved})
    for (const PipeShape& sh : shapes(s)) {
      const PipeTimeline t = simulate_pipe(s, sh, 1, 2);
      for (int r = 0; r < sh.P; ++r) {
        const int slots = pipe_activation_slots(s, sh, r);
        const std::vector<PipeOp> ops = pipe_ops(s, sh, r);
        EXPECT_EQ(first_slot_clash(ops, sh.m, sh.v, slots), -1) << name(s, sh) << " rank " << r;
        if (slots > 1) EXPECT_NE(first_slot_clash(ops, sh.m, sh.v, slots - 1), -1) << name(s, sh) << " rank " << r;
        if (sh.v == 1) EXPECT_EQ(slots, t.peak_alive[size_t(r)]) << name(s, sh) << " rank " << r;
      }
    }
}

// Device messages (pipeline/runner.h): NCCL runs each rank's launches in order on one stream, a
// launch done when each of its sends and receives has met its peer's in the peer's current launch.
// pipe_launches_stuck runs them so. GPipe's and 1F1B's paired launches finish for every shape; the
// host order (each receive launched alone a pass ahead) does not at P 3 (a middle stage's receive
// holds its stream, its send behind it); interleaved's paired launches close a cycle across the
// wrap-around at m >= 2P (worked by hand for P 2, m 4, v 2: rank 0's send of B(0,b)'s gradient waits
// behind nothing but for rank 1's receive, which is behind rank 1's send of B(1,b)'s gradient, which
// rank 0 receives only in its next launch), so those runs keep host messages (pipe_device_messages).
TEST(PipeRunner, DeviceLaunchesNeverWaitInACycle) {
  auto all = [](PipeSchedule s, const PipeShape& sh) {
    std::vector<std::vector<PipeLaunch>> l;
    for (int r = 0; r < sh.P; ++r) l.push_back(pipe_launches(s, sh, r));
    return l;
  };
  for (PipeSchedule s : {PipeSchedule::gpipe, PipeSchedule::one_f_one_b, PipeSchedule::interleaved})
    for (const PipeShape& sh : shapes(s)) {
      if (sh.P < 2) continue;
      const bool finishes = pipe_launches_stuck(all(s, sh)) == -1;
      if (s != PipeSchedule::interleaved) EXPECT_TRUE(finishes) << name(s, sh);
      EXPECT_EQ(pipe_device_messages(s, sh), finishes) << name(s, sh);
    }
  EXPECT_FALSE(pipe_device_messages(PipeSchedule::interleaved, {2, 4, 2}));
  EXPECT_TRUE(pipe_device_messages(PipeSchedule::interleaved, {2, 2, 2}));
  // The hazard the pairing avoids: the host order on one stream.
  const PipeShape sh{3, 4, 1};
  std::vector<std::vector<PipeLaunch>> ahead(3);
  for (int r = 0; r < 3; ++r)
    for (const PipeLaunch& x : pipe_launches(PipeSchedule::one_f_one_b, sh, r)) {
      if (x.recv_from >= 0) ahead[size_t(r)].push_back({-1, x.recv_from});
      if (x.send_to >= 0) ahead[size_t(r)].push_back({x.send_to, -1});
    }
  EXPECT_NE(pipe_launches_stuck(ahead), -1) << "receives launched ahead of sends on one stream";
}

// Point-to-point messages match in posting order (comm/comm.h): a receiver that posts its receives in
// the order it uses them gets the right activation or gradient because that is the sender's order,
// for every pair of ranks, both kinds mixed, every schedule (one channel per pair suffices).
TEST(PipeSchedule, MessagesAreUsedInTheOrderTheyAreSent) {
  for (PipeSchedule s : kAll)
    for (const PipeShape& sh : shapes(s))
      for (int a = 0; a < sh.P; ++a)
        for (int b = 0; b < sh.P; ++b) {
          if (a == b) continue;
          const std::vector<PipeMessage> sent = pipe_sends(s, sh, a, b), used = pipe_uses(s, sh, a, b);
          // Where the pipeline wraps around (interleaved: rank P - 1 -> 0 activations, 0 -> P - 1
          // gradients; at P = 2 both kinds each way) one pair carries both kinds, and still in one order.
          EXPECT_TRUE(sent == used) << name(s, sh) << " " << a << " -> " << b << ": " << sent.size() << " messages";
        }
}

TEST(PipeSchedule, RefusalsSayTheArithmetic) {
  EXPECT_EQ(pipe_refusal(PipeSchedule::one_f_one_b, {4, 2, 1}), "");  // fewer micro-batches than stages runs
  EXPECT_EQ(pipe_refusal(PipeSchedule::interleaved, {4, 6, 2}),
            "pipeline schedule \"interleaved\" takes micro-batches in groups of the 4 pipeline ranks: 6 is not a "
            "multiple of 4 (use 4 or 8, or \"1f1b\")");
  EXPECT_EQ(pipe_refusal(PipeSchedule::interleaved, {2, 4, 1}),
            "pipeline schedule \"interleaved\" needs at least 2 chunks per rank, got 1 (with one it is \"1f1b\")");
  EXPECT_EQ(pipe_refusal(PipeSchedule::gpipe, {2, 4, 2}),
            "pipeline schedule \"gpipe\" runs one chunk per rank, got 2 (\"interleaved\" runs several)");
  EXPECT_NE(pipe_refusal(PipeSchedule::gpipe, {0, 4, 1}), "");
  EXPECT_THROW(pipe_ops(PipeSchedule::interleaved, {4, 6, 2}, 0), Error);
  EXPECT_THROW(parse_pipe_schedule("pipeline.schedule", "zb"), Error);
  EXPECT_EQ(parse_pipe_schedule("pipeline.schedule", "1f1b"), PipeSchedule::one_f_one_b);
}

TEST(PipeSchedule, BlocksSplitByCost) {
  // Ties go to the later stages: under 1F1B an earlier stage holds more micro-batches' activations.
  const std::vector<double> five(5, 1.0);
  EXPECT_EQ(balance_blocks(five, 2, 0, 0), (std::vector<int>{2, 3}));
  EXPECT_EQ(balance_blocks(five, 3, 0, 0), (std::vector<int>{1, 2, 2}));
  // A head worth 2.5 blocks on the last stage: it takes fewer blocks (4 + 0 against 1 + 2.5).
  EXPECT_EQ(balance_blocks(five, 2, 0, 2.5), (std::vector<int>{4, 1}));
  EXPECT_EQ(balance_blocks(five, 2, 1.5, 0), (std::vector<int>{2, 3}));
  EXPECT_EQ(balance_blocks({1, 1, 4, 1}, 2, 0, 0), (std::vector<int>{2, 2}));
  for (int parts = 1; parts <= 5; ++parts) {
    const std::vector<int> c = balance_blocks(five, parts, 0.3, 0.7);
    EXPECT_EQ(int(c.size()), parts);
    EXPECT_EQ(std::accumulate(c.begin(), c.end(), 0), 5);
    EXPECT_GE(*std::min_element(c.begin(), c.end()), 1);
  }
  EXPECT_THROW(balance_blocks(five, 6, 0, 0), Error);
}

// The drawing docs/pipeline.md shows: 1F1B, P 2, m 3, a backward twice a forward.
TEST(PipeSchedule, RenderedTimeline) {
  const PipeShape sh{2, 3, 1};
  const PipeTimeline t = simulate_pipe(PipeSchedule::one_f_one_b, sh, 1, 2);
  EXPECT_EQ(render_pipe(t, sh, 1),
            "rank 0 |F0 F1 ......B0    F2 B1    ...B2\n"
            "rank 1 |...F0 B0    F1 B1    F2 B2\n");
}

// docs/pipeline.md's drawings are the tables' own: each `<!-- pipe: SCHEDULE P p m m v v -->` line is
// followed by a fenced block that must be render_pipe of that simulation (backward = 2 forwards).
TEST(PipeSchedule, DocsDrawingsAreTheTables) {
  std::ifstream doc("docs/pipeline.md");
  ASSERT_TRUE(doc) << "docs/pipeline.md (tests run from the repository root)";
  std::string line;
  int drawings = 0;
  while (std::getline(doc, line)) {
    if (line.rfind("<!-- pipe: ", 0) != 0) continue;
    std::istringstream spec(line.substr(11));
    std::string sched, kp, km, kv;
    PipeShape sh;
    spec >> sched >> kp >> sh.P >> km >> sh.m >> kv >> sh.v;
    ASSERT_TRUE(spec && kp == "P" && km == "m" && kv == "v") << line;
    std::string fence, drawn;
    ASSERT_TRUE(std::getline(doc, fence) && fence == "```") << line;
    while (std::getline(doc, fence) && fence != "```") drawn += fence + "\n";
    const PipeSchedule s = parse_pipe_schedule("docs/pipeline.md", sched);
    EXPECT_EQ(drawn, render_pipe(simulate_pipe(s, sh, 1, 2), sh, 1)) << line;
    ++drawings;
  }
  EXPECT_EQ(drawings, 4);
}

}  // namespace
}  // namespace zt
