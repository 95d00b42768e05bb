#include "pipeline/runner.h"

#include <chrono>
#include <cstdint>
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

// One message: host memory the runner owns, or a device buffer the caller gave (PipeBuffers).
struct Message {
  std::vector<float> host;
  float* given = nullptr;
  float* data() { return given ? given : host.data(); }
};

}  // namespace

size_t pipe_message_sends(PipeSchedule s, const PipeShape& sh, int rank) {
  size_t n = 0;
  for (const PipeOp& op : pipe_ops(s, sh, rank)) {
    const int to = route(sh, rank, op).to;
    n += to >= 0 && to != rank ? 1 : 0;
  }
  return n;
}

std::vector<PipeLaunch> pipe_launches(PipeSchedule s, const PipeShape& sh, int rank) {
  const std::vector<PipeOp> ops = pipe_ops(s, sh, rank);
  auto other = [&](int peer) { return peer == rank ? -1 : peer; };
  std::vector<PipeLaunch> out;
  for (size_t i = 0; i <= ops.size(); ++i) {
    PipeLaunch l;
    if (i > 0) l.send_to = other(route(sh, rank, ops[i - 1]).to);
    if (i < ops.size()) l.recv_from = other(route(sh, rank, ops[i]).from);
    if (l.send_to >= 0 || l.recv_from >= 0) out.push_back(l);
  }
  return out;
}

int pipe_launches_stuck(const std::vector<std::vector<PipeLaunch>>& l) {
  const size_t P = l.size();
  // Each launch's send and receive: its place k among the messages between the pair, and met yet.
  struct Op {
    int k = -1;
    bool met = false;
  };
  std::vector<std::vector<Op>> send(P), recv(P);
  for (size_t r = 0; r < P; ++r) {
    std::vector<int> ns(P, 0), nr(P, 0);
    for (const PipeLaunch& x : l[r]) {
      send[r].push_back({x.send_to >= 0 ? ns[size_t(x.send_to)]++ : -1, x.send_to < 0});
      recv[r].push_back({x.recv_from >= 0 ? nr[size_t(x.recv_from)]++ : -1, x.recv_from < 0});
    }
  }
  std::vector<size_t> cur(P, 0);  // each rank's current launch
  auto current = [&](int q) { return cur[size_t(q)] < l[size_t(q)].size() ? cur[size_t(q)] : SIZE_MAX; };
  for (bool moved = true; moved;) {
    moved = false;
    for (size_t r = 0; r < P; ++r) {
      const size_t i = cur[r];
      if (i == l[r].size()) continue;
      const PipeLaunch& x = l[r][i];
      if (!send[r][i].met) {  // met when the peer's current launch receives it
        const size_t j = current(x.send_to);
        if (j != SIZE_MAX && l[size_t(x.send_to)][j].recv_from == int(r) && recv[size_t(x.send_to)][j].k == send[r][i].k)
          send[r][i].met = recv[size_t(x.send_to)][j].met = true;
      }
      if (!recv[r][i].met) {
        const size_t j = current(x.recv_from);
        if (j != SIZE_MAX && l[size_t(x.recv_from)][j].send_to == int(r) && send[size_t(x.recv_from)][j].k == recv[r][i].k)
          recv[r][i].met = send[size_t(x.recv_from)][j].met = true;
      }
      if (send[r][i].met && recv[r][i].met) {
        ++cur[r];
        moved = true;
      }
    }
  }
  for (size_t r = 0; r < P; ++r)
    if (cur[r] < l[r].size()) return int(r);
  return -1;
}

bool pipe_device_messages(PipeSchedule s, const PipeShape& sh) {
  std::vector<std::vector<PipeLaunch>> l;
  for (int r = 0; r < sh.P; ++r) l.push_back(pipe_launches(s, sh, r));
  return sh.P > 1 && pipe_launches_stuck(l) == -1;
}

PipeStepStats run_pipe_step(PipeSchedule s, const PipeShape& sh, Comm& pipe, PipeStageWork& work, size_t floats,
                            const PipeBuffers* buffers) {
  ZT_REQUIRE(pipe.world() == sh.P, "pipeline: the group \"" << pipe.name() << "\" has " << pipe.world()
                                                            << " ranks for " << sh.P << " pipeline stages");
  const int me = pipe.rank();
  const std::vector<PipeOp> ops = pipe_ops(s, sh, me);
  const size_t bytes = floats * sizeof(float);
  ZT_ASSERT(!buffers || (sh.P > 1 && buffers->send.size() == pipe_message_sends(s, sh, me)));
  PipeStepStats st;
  // A new message: a host vector, or the next of the caller's buffers (receives alternate between
  // two: at most the current pass's and the next one's are posted and not yet used).
  auto message = [&](bool receive) {
    Message m;
    if (!buffers) m.host.resize(floats);
    else m.given = receive ? buffers->recv[st.recvs % 2] : buffers->send[st.sends];
    return m;
  };

  // Inputs from other ranks, posted in use order, one pass ahead; inputs from this rank (one rank
  // holding adjacent virtual stages: P = 1) handed over in memory, keyed by the pass that uses them.
  struct Incoming {
    CommHandle h;
    Message buf;
  };
  std::map<size_t, Incoming> incoming;  // by index of the pass that uses it
  std::map<std::tuple<int, int, int>, Message> local;  // (kind, micro, chunk) of the user
  size_t posted = 0;  // passes whose receive is posted (or needs none)
  auto post_through = [&](size_t last) {
    for (; posted <= last && posted < ops.size(); ++posted) {
      const Route rt = route(sh, me, ops[posted]);
      if (rt.from < 0 || rt.from == me) continue;
      Incoming& in = incoming[posted];
      in.buf = message(true);
      in.h = pipe.recv(in.buf.data(), bytes, rt.from);
      ++st.recvs;
    }
  };
  struct Outgoing {
    CommHandle h;
    Message buf;
  };
  std::deque<Outgoing> sent;  // complete in posting order per peer; released as they complete

  // Host messages: each receive posted a pass ahead. Device messages: with the previous pass's send
  // (pipe_launches), which the comm launches together at its next test or wait.
  const bool paired = buffers != nullptr;
  for (size_t i = 0; i < ops.size(); ++i) {
    const PipeOp& op = ops[i];
    const Route rt = route(sh, me, op);
    post_through(paired ? i : i + 1);
    Message in;
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
    Message out = rt.to >= 0 ? message(false) : Message{};
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
    if (paired) post_through(i + 1);
    while (!sent.empty() && pipe.test(sent.front().h)) sent.pop_front();
  }
  for (Outgoing& o : sent) pipe.wait(o.h);
  ZT_ASSERT(incoming.empty() && local.empty());
  return st;
}

}  // namespace zt
