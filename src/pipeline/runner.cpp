#include "pipeline/runner.h"

#include <chrono>
#include <deque>
#include <map>
#include <tuple>
#include <vector>

#include "runtime/error.h"

namespace zt {

namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Where a pass's input comes from and its result goes, as ranks of the pipeline group (-1: none:
// virtual stage 0 reads tokens, the last one computes the loss).
struct Route {
  int from = -1, to = -1;
};
Route route(const PipeShape& sh, int rank, const PipeOp& op) {
  const int j = op.chunk * sh.P + rank, V = sh.virtual_stages();
  const int prev = j > 0 ? (j - 1) % sh.P : -1, next = j + 1 < V ? (j + 1) % sh.P : -1;
  return op.kind == PipeOp::forward ? Route{prev, next} : Route{next, prev};
}

}  // namespace

PipeStepStats run_pipe_step(PipeSchedule s, const PipeShape& sh, Comm& pipe, PipeStageWork& work, size_t floats) {
  ZT_REQUIRE(pipe.world() == sh.P, "pipeline: the group \"" << pipe.name() << "\" has " << pipe.world()
                                                            << " ranks for " << sh.P << " pipeline stages");
  const int me = pipe.rank();
  const std::vector<PipeOp> ops = pipe_ops(s, sh, me);
  const size_t bytes = floats * sizeof(float);
  PipeStepStats st;

  // Inputs from other ranks, posted in use order, one pass ahead; inputs from this rank (one rank
  // holding adjacent virtual stages: P = 1) handed over in memory, keyed by the pass that uses them.
  struct Incoming {
    CommHandle h;
    std::vector<float> buf;
  };
  std::map<size_t, Incoming> incoming;  // by index of the pass that uses it
  std::map<std::tuple<int, int, int>, std::vector<float>> local;  // (kind, micro, chunk) of the user
  size_t posted = 0;  // passes whose receive is posted (or needs none)
  auto post_through = [&](size_t last) {
    for (; posted <= last && posted < ops.size(); ++posted) {
      const Route rt = route(sh, me, ops[posted]);
      if (rt.from < 0 || rt.from == me) continue;
      Incoming& in = incoming[posted];
      in.buf.resize(floats);
      in.h = pipe.recv(in.buf.data(), bytes, rt.from);
      ++st.recvs;
    }
  };
  struct Outgoing {
    CommHandle h;
    std::vector<float> buf;
  };
  std::deque<Outgoing> sent;  // complete in posting order per peer; released as they complete

  for (size_t i = 0; i < ops.size(); ++i) {
    const PipeOp& op = ops[i];
    const Route rt = route(sh, me, op);
    post_through(i + 1);
    std::vector<float> in;
    if (rt.from == me) {
      auto it = local.find({op.kind, op.micro, op.chunk});
      ZT_ASSERT(it != local.end());
      in = std::move(it->second);
      local.erase(it);
    } else if (rt.from >= 0) {
      Incoming& x = incoming.at(i);
      const double t0 = now_s();
      pipe.wait(x.h);
      st.recv_wait_s += now_s() - t0;
      in = std::move(x.buf);
      incoming.erase(i);
    }
    std::vector<float> out(rt.to >= 0 ? floats : 0);
    const float* input = rt.from >= 0 ? in.data() : nullptr;
    float* output = rt.to >= 0 ? out.data() : nullptr;
    if (op.kind == PipeOp::forward)
      work.forward(op.chunk, op.micro, input, output);
    else
      work.backward(op.chunk, op.micro, input, output);
    if (rt.to == me) {
      // The next virtual stage is this rank's too: its chunk is one up (forward) or down (backward).
      local[{op.kind, op.micro, op.chunk + (op.kind == PipeOp::forward ? 1 : -1)}] = std::move(out);
    } else if (rt.to >= 0) {
      Outgoing o{{}, std::move(out)};
      o.h = pipe.send(o.buf.data(), bytes, rt.to);
      sent.push_back(std::move(o));
      ++st.sends;
    }
    while (!sent.empty() && pipe.test(sent.front().h)) sent.pop_front();
  }
  for (Outgoing& o : sent) pipe.wait(o.h);
  ZT_ASSERT(incoming.empty() && local.empty());
  return st;
}

}  // namespace zt
