#include "pipeline/schedule.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>

#include "runtime/error.h"

namespace zt {

namespace {

int rank_of(const PipeShape& sh, int j) { return j % sh.P; }
int vstage(const PipeShape& sh, int rank, int chunk) { return chunk * sh.P + rank; }

// Interleaved: the k-th forward (or backward) of a rank, Megatron-LM's order. Micro-batches go
// through the rank's chunks in groups of P: P micro-batches of chunk 0, the same P of chunk 1, ...,
// then the next P micro-batches; backwards take the chunks last first.
PipeOp interleaved_op(const PipeShape& sh, int k, PipeOp::Kind kind) {
  const int group = sh.P * sh.v, in_group = k % group;
  int chunk = in_group / sh.P;
  if (kind == PipeOp::backward) chunk = sh.v - 1 - chunk;
  return {kind, (k / group) * sh.P + k % sh.P, chunk};
}

}  // namespace

PipeSchedule parse_pipe_schedule(const std::string& what, const std::string& name) {
  if (name == "gpipe") return PipeSchedule::gpipe;
  if (name == "1f1b") return PipeSchedule::one_f_one_b;
  if (name == "interleaved") return PipeSchedule::interleaved;
  ZT_REQUIRE(false, what << ": \"" << name << "\" is not a pipeline schedule (choices: \"gpipe\", \"1f1b\", "
                            "\"interleaved\")");
  return PipeSchedule::gpipe;
}

const char* pipe_schedule_name(PipeSchedule s) {
  switch (s) {
    case PipeSchedule::gpipe: return "gpipe";
    case PipeSchedule::one_f_one_b: return "1f1b";
    case PipeSchedule::interleaved: return "interleaved";
  }
  return "?";
}

std::string pipe_refusal(PipeSchedule s, const PipeShape& sh) {
  std::ostringstream why;
  const std::string name = std::string("pipeline schedule \"") + pipe_schedule_name(s) + "\"";
  if (sh.P < 1 || sh.m < 1 || sh.v < 1)
    why << "pipeline: ranks " << sh.P << ", micro-batches " << sh.m << " and chunks per rank " << sh.v
        << " must each be at least 1";
  else if (s != PipeSchedule::interleaved && sh.v != 1)
    why << name << " runs one chunk per rank, got " << sh.v << " (\"interleaved\" runs several)";
  else if (s == PipeSchedule::interleaved && sh.v < 2)
    why << name << " needs at least 2 chunks per rank, got " << sh.v << " (with one it is \"1f1b\")";
  else if (s == PipeSchedule::interleaved && sh.m % sh.P != 0)
    why << name << " takes micro-batches in groups of the " << sh.P << " pipeline ranks: " << sh.m
        << " is not a multiple of " << sh.P << " (use " << std::max(sh.P, sh.m / sh.P * sh.P) << " or "
        << (sh.m / sh.P + 1) * sh.P << ", or \"1f1b\")";
  return why.str();
}

std::vector<PipeOp> pipe_ops(PipeSchedule s, const PipeShape& sh, int rank) {
  const std::string why = pipe_refusal(s, sh);
  ZT_REQUIRE(why.empty(), why);
  ZT_ASSERT(rank >= 0 && rank < sh.P);
  std::vector<PipeOp> ops;
  auto F = [&](int micro, int chunk) { ops.push_back({PipeOp::forward, micro, chunk}); };
  auto B = [&](int micro, int chunk) { ops.push_back({PipeOp::backward, micro, chunk}); };
  switch (s) {
    case PipeSchedule::gpipe:
      for (int i = 0; i < sh.m; ++i) F(i, 0);
      for (int i = 0; i < sh.m; ++i) B(i, 0);
      break;
    case PipeSchedule::one_f_one_b: {
      // Warm-up: the forwards whose backwards cannot have started yet (the ranks after this one
      // each hold one); steady: one forward, one backward; cool-down: the backwards left.
      const int warmup = std::min(sh.P - rank - 1, sh.m);
      for (int i = 0; i < warmup; ++i) F(i, 0);
      for (int i = 0; i < sh.m - warmup; ++i) {
        F(warmup + i, 0);
        B(i, 0);
      }
      for (int i = sh.m - warmup; i < sh.m; ++i) B(i, 0);
      break;
    }
    case PipeSchedule::interleaved: {
      const int total = sh.m * sh.v;
      const int warmup = std::min((sh.P - rank - 1) * 2 + (sh.v - 1) * sh.P, total);
      for (int k = 0; k < warmup; ++k) ops.push_back(interleaved_op(sh, k, PipeOp::forward));
      for (int k = 0; k < total - warmup; ++k) {
        ops.push_back(interleaved_op(sh, warmup + k, PipeOp::forward));
        ops.push_back(interleaved_op(sh, k, PipeOp::backward));
      }
      for (int k = total - warmup; k < total; ++k) ops.push_back(interleaved_op(sh, k, PipeOp::backward));
      break;
    }
  }
  return ops;
}

int pipe_activation_slots(PipeSchedule s, const PipeShape& sh, int rank) {
  std::vector<int> backwards_left(size_t(sh.m), sh.v);
  int lo = 0, widest = 0;  // lo: the oldest micro-batch not yet done
  for (const PipeOp& op : pipe_ops(s, sh, rank)) {
    if (op.kind == PipeOp::forward) {
      widest = std::max(widest, op.micro - lo + 1);
    } else if (--backwards_left[size_t(op.micro)] == 0) {
      while (lo < sh.m && backwards_left[size_t(lo)] == 0) ++lo;
    }
  }
  return widest;
}

double pipe_bubble(PipeSchedule s, const PipeShape& sh) {
  const double v = s == PipeSchedule::interleaved ? sh.v : 1;
  return double(sh.P - 1) / (v * sh.m + sh.P - 1);
}

PipeTimeline simulate_pipe(PipeSchedule s, const PipeShape& sh, double tf, double tb) {
  const int V = sh.virtual_stages();
  std::vector<std::vector<PipeOp>> tables;
  for (int r = 0; r < sh.P; ++r) tables.push_back(pipe_ops(s, sh, r));
  // When each (micro-batch, virtual stage) pass finished; -1 = not yet.
  std::vector<double> fwd(size_t(sh.m) * size_t(V), -1), bwd(fwd);
  auto at = [&](std::vector<double>& t, int micro, int j) -> double& { return t[size_t(micro) * size_t(V) + size_t(j)]; };
  PipeTimeline out;
  out.ranks.resize(size_t(sh.P));
  std::vector<size_t> next(size_t(sh.P), 0);
  std::vector<double> free_at(size_t(sh.P), 0);
  size_t left = 0;
  for (const auto& t : tables) left += t.size();
  while (left > 0) {
    bool moved = false;
    for (int r = 0; r < sh.P; ++r) {
      while (next[size_t(r)] < tables[size_t(r)].size()) {
        const PipeOp& op = tables[size_t(r)][next[size_t(r)]];
        const int j = vstage(sh, r, op.chunk);
        double ready = free_at[size_t(r)];
        if (op.kind == PipeOp::forward) {
          if (j > 0) {
            if (at(fwd, op.micro, j - 1) < 0) break;
            ready = std::max(ready, at(fwd, op.micro, j - 1));
          }
        } else {
          if (at(fwd, op.micro, j) < 0) break;
          ready = std::max(ready, at(fwd, op.micro, j));
          if (j + 1 < V) {
            if (at(bwd, op.micro, j + 1) < 0) break;
            ready = std::max(ready, at(bwd, op.micro, j + 1));
          }
        }
        const double end = ready + (op.kind == PipeOp::forward ? tf : tb);
        at(op.kind == PipeOp::forward ? fwd : bwd, op.micro, j) = end;
        free_at[size_t(r)] = end;
        out.ranks[size_t(r)].push_back({op, ready, end});
        out.makespan = std::max(out.makespan, end);
        ++next[size_t(r)];
        --left;
        moved = true;
      }
    }
    if (!moved) {
      for (int r = 0; r < sh.P; ++r)
        if (next[size_t(r)] < tables[size_t(r)].size()) {
          const PipeOp& op = tables[size_t(r)][next[size_t(r)]];
          ZT_REQUIRE(false, "pipeline schedule \"" << pipe_schedule_name(s) << "\" hangs: rank " << r << " waits in its "
                                                   << (op.kind == PipeOp::forward ? "forward" : "backward")
                                                   << " of micro-batch " << op.micro << ", chunk " << op.chunk
                                                   << ", for a pass no rank can run");
        }
    }
  }
  double busy = 0;
  for (int r = 0; r < sh.P; ++r) {
    int alive = 0, peak = 0;
    for (const PipeTimeline::Slot& x : out.ranks[size_t(r)]) {
      busy += x.end - x.start;
      alive += x.op.kind == PipeOp::forward ? 1 : -1;  // a forward keeps its activations until its backward
      peak = std::max(peak, alive);
    }
    out.peak_alive.push_back(peak);
  }
  out.bubble = out.makespan > 0 ? 1 - busy / (double(sh.P) * out.makespan) : 0;
  return out;
}

std::vector<PipeMessage> pipe_sends(PipeSchedule s, const PipeShape& sh, int from, int to) {
  std::vector<PipeMessage> out;
  const int V = sh.virtual_stages();
  for (const PipeOp& op : pipe_ops(s, sh, from)) {
    const int j = vstage(sh, from, op.chunk);
    if (op.kind == PipeOp::forward && j + 1 < V && rank_of(sh, j + 1) == to) out.push_back({op.kind, op.micro, j});
    if (op.kind == PipeOp::backward && j > 0 && rank_of(sh, j - 1) == to) out.push_back({op.kind, op.micro, j});
  }
  return out;
}

std::vector<PipeMessage> pipe_uses(PipeSchedule s, const PipeShape& sh, int from, int to) {
  std::vector<PipeMessage> out;
  const int V = sh.virtual_stages();
  for (const PipeOp& op : pipe_ops(s, sh, to)) {
    const int j = vstage(sh, to, op.chunk);
    if (op.kind == PipeOp::forward && j > 0 && rank_of(sh, j - 1) == from) out.push_back({op.kind, op.micro, j - 1});
    if (op.kind == PipeOp::backward && j + 1 < V && rank_of(sh, j + 1) == from)
      out.push_back({op.kind, op.micro, j + 1});
  }
  return out;
}

std::vector<int> balance_blocks(const std::vector<double>& cost, int parts, double first_extra, double last_extra) {
  const int L = int(cost.size());
  ZT_REQUIRE(parts >= 1 && L >= parts, "pipeline: " << L << " blocks cannot fill " << parts
                                                    << " stages (a stage with no block); use at most " << L
                                                    << " stages, or more layers");
  std::vector<double> prefix(size_t(L) + 1, 0);
  for (int i = 0; i < L; ++i) prefix[size_t(i) + 1] = prefix[size_t(i)] + cost[size_t(i)];
  // run(p, a, b): part p holding blocks [a, b), with its extras.
  auto run = [&](int p, int a, int b) {
    return prefix[size_t(b)] - prefix[size_t(a)] + (p == 0 ? first_extra : 0) + (p == parts - 1 ? last_extra : 0);
  };
  const double inf = std::numeric_limits<double>::infinity();
  // best[p][b]: the least possible most-expensive part when parts 0..p hold blocks [0, b); cut[p][b]
  // where part p starts then (the first such start: of equal splits, the later parts hold more).
  std::vector<std::vector<double>> best(size_t(parts), std::vector<double>(size_t(L) + 1, inf));
  std::vector<std::vector<int>> cut(size_t(parts), std::vector<int>(size_t(L) + 1, 0));
  for (int b = 1; b <= L; ++b) best[0][size_t(b)] = run(0, 0, b);
  for (int p = 1; p < parts; ++p)
    for (int b = p + 1; b <= L; ++b)
      for (int a = p; a < b; ++a) {
        const double c = std::max(best[size_t(p) - 1][size_t(a)], run(p, a, b));
        if (c < best[size_t(p)][size_t(b)]) best[size_t(p)][size_t(b)] = c, cut[size_t(p)][size_t(b)] = a;
      }
  std::vector<int> counts(static_cast<size_t>(parts), 0);
  for (int p = parts - 1, b = L; p >= 0; --p) {
    const int a = p == 0 ? 0 : cut[size_t(p)][size_t(b)];
    counts[size_t(p)] = b - a;
    b = a;
  }
  return counts;
}

std::string render_pipe(const PipeTimeline& t, const PipeShape& sh, double tf) {
  int digits = 1;
  for (int x = sh.m - 1; x >= 10; x /= 10) ++digits;
  const int width = 1 + digits + (sh.v > 1 ? 1 : 0) + 1;  // "F12a "
  std::ostringstream os;
  for (size_t r = 0; r < t.ranks.size(); ++r) {
    std::string line;
    for (const PipeTimeline::Slot& x : t.ranks[r]) {
      const size_t from = size_t(std::lround(x.start / tf * width)), to = size_t(std::lround(x.end / tf * width));
      if (line.size() < from) line.append(from - line.size(), '.');
      std::string label = (x.op.kind == PipeOp::forward ? "F" : "B") + std::to_string(x.op.micro);
      if (sh.v > 1) label += char('a' + x.op.chunk);
      label.resize(to - from, ' ');
      line += label;
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    os << "rank " << r << " |" << line << "\n";
  }
  return os.str();
}

}  // namespace zt
