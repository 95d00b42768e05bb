#include "comm/coll_log.h"

#include "runtime/memory.h"

#include <algorithm>
#include <atomic>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <sstream>

namespace zt {

namespace {
// The wait in progress, for the SIGTERM handler (async-signal-safe reads only).
char g_wait_what[200];
std::atomic<int> g_wait_active{0};
std::atomic<long long> g_wait_t0_ns{0};
int g_term_rank = -1;

long long mono_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

// Async-signal-safe formatting: append text / an unsigned number.
void put(char* buf, size_t& len, size_t cap, const char* t) {
  while (*t && len + 1 < cap) buf[len++] = *t++;
}
void put_u(char* buf, size_t& len, size_t cap, unsigned long long v) {
  char d[24];
  int n = 0;
  do d[n++] = char('0' + v % 10); while ((v /= 10) && n < 24);
  while (n && len + 1 < cap) buf[len++] = d[--n];
}

void on_term(int sig) {
  char buf[400];
  size_t len = 0;
  put(buf, len, sizeof buf, "zerotrain: rank ");
  put_u(buf, len, sizeof buf, (unsigned long long)(g_term_rank < 0 ? 0 : g_term_rank));
  put(buf, len, sizeof buf, ": terminated by signal ");
  put_u(buf, len, sizeof buf, (unsigned long long)sig);
  put(buf, len, sizeof buf, " (the launcher is ending the job)");
  if (g_wait_active.load(std::memory_order_acquire)) {
    const long long ms = (mono_ns() - g_wait_t0_ns.load(std::memory_order_relaxed)) / 1000000;
    put(buf, len, sizeof buf, " while waiting ");
    put_u(buf, len, sizeof buf, (unsigned long long)(ms / 1000));
    put(buf, len, sizeof buf, ".");
    put_u(buf, len, sizeof buf, (unsigned long long)(ms % 1000 / 100));
    put(buf, len, sizeof buf, " s for ");
    put(buf, len, sizeof buf, g_wait_what);
  } else {
    put(buf, len, sizeof buf, ", not waiting for a collective");
  }
  put(buf, len, sizeof buf, "\n");
  ssize_t w = write(2, buf, len);
  (void)w;
  signal(sig, SIG_DFL);
  raise(sig);
}
}  // namespace

void CollLog::install_term_note(int rank) {
  static bool installed = false;
  if (installed) return;
  installed = true;
  g_term_rank = rank;
  struct sigaction old {};
  if (sigaction(SIGTERM, nullptr, &old) != 0 || old.sa_handler != SIG_DFL) return;  // someone else's handler
  struct sigaction sa {};
  sa.sa_handler = on_term;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESETHAND;
  sigaction(SIGTERM, &sa, nullptr);
}

void CollLog::note_wait(uint64_t seq) {
  wait_seq_ = seq;
  g_wait_active.store(0, std::memory_order_release);
  const CollRecord* r = find(seq);
  if (r)
    std::snprintf(g_wait_what, sizeof g_wait_what, "%s (%zu bytes, step %lld)", what(*r).c_str(), r->bytes,
                  (long long)r->step);
  else
    std::snprintf(g_wait_what, sizeof g_wait_what, "collective #%llu", (unsigned long long)seq);
  g_wait_t0_ns.store(mono_ns(), std::memory_order_relaxed);
  g_wait_active.store(1, std::memory_order_release);
}

void CollLog::clear_wait_note() { g_wait_active.store(0, std::memory_order_release); }

const char* coll_op_name(CollOp op) {
  switch (op) {
    case CollOp::all_reduce: return "all_reduce";
    case CollOp::reduce_scatter: return "reduce_scatter";
    case CollOp::all_gather: return "all_gather";
    case CollOp::broadcast: return "broadcast";
    case CollOp::barrier: return "barrier";
    case CollOp::scalar_all_reduce: return "scalar_all_reduce";
    case CollOp::scalar_all_gather: return "scalar_all_gather";
    case CollOp::send: return "send";
    case CollOp::recv: return "recv";
  }
  return "?";
}

bool coll_op_is_control(CollOp op) {
  return op == CollOp::barrier || op == CollOp::scalar_all_reduce || op == CollOp::scalar_all_gather;
}

uint64_t model_bytes_all_reduce(uint64_t n, int world, uint64_t elem_bytes) {
  if (world <= 1) return 0;
  return 2 * uint64_t(world - 1) * elem_bytes * n / uint64_t(world);
}
uint64_t model_bytes_reduce_scatter(uint64_t recv_n, int world, uint64_t elem_bytes) {
  return world <= 1 ? 0 : uint64_t(world - 1) * elem_bytes * recv_n;
}
uint64_t model_bytes_all_gather(uint64_t send_n, int world, uint64_t elem_bytes) {
  return world <= 1 ? 0 : uint64_t(world - 1) * elem_bytes * send_n;
}
uint64_t model_bytes_broadcast(uint64_t bytes, int world, bool is_root) {
  return (world <= 1 || !is_root) ? 0 : bytes;
}
uint64_t model_bytes_p2p(uint64_t bytes, CollOp op) { return op == CollOp::send ? bytes : 0; }

CollLog::CollLog(int rank, int world, const CommOptions& opts, std::string name, std::vector<int> global_ranks)
    : rank_(rank), world_(world), opts_(opts), name_(std::move(name)), global_ranks_(std::move(global_ranks)),
      t0_(std::chrono::steady_clock::now()), records_(kLogRecords) {
  t0_us_ = std::chrono::duration<double, std::micro>(t0_.time_since_epoch()).count();
  if (world > 1) install_term_note(global_rank(rank));
}

double CollLog::now() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
}

bool CollLog::take_fault(CollOp op) {
  if (fault_fired_ || coll_op_is_control(op) || op == CollOp::broadcast || op == CollOp::recv) return false;
  if (opts_.fault_skip_rank < 0 || opts_.fault_skip_rank != global_rank(rank_)) return false;
  if (step_ != opts_.fault_skip_step) return false;
  fault_fired_ = true;
  return true;
}

uint64_t CollLog::start(CollOp op, uint64_t bytes, bool skipped) { return start_record(op, bytes, -1, skipped); }

uint64_t CollLog::start_p2p(CollOp op, uint64_t bytes, int peer, bool skipped) {
  return start_record(op, bytes, peer, skipped);
}

uint64_t CollLog::start_record(CollOp op, uint64_t bytes, int peer, bool skipped) {
  const uint64_t seq = next_seq_++;
  CollRecord& r = records_[seq % kLogRecords];
  r = CollRecord{};
  r.seq = seq;
  r.op = op;
  r.bytes = bytes;
  r.peer = peer;
  r.step = step_;
  r.t_start = now();
  if (tracer_) tracer_->started(lanes_, seq);
  if (skipped) {
    r.state = CollState::skipped;
    r.t_end = r.t_start;
    // Said at once, not only in the log dump: the rank that skipped is often taken down by
    // another rank's timeout (MPI_Abort) before it reaches its own, and whoever set the fault
    // must see that it fired and where.
    std::fprintf(stderr, "note: rank %d: %s (%llu bytes, step %lld) skipped (fault injection: comm.fault_skip_rank)\n",
                 global_rank(rank_), what(r).c_str(), static_cast<unsigned long long>(bytes),
                 static_cast<long long>(step_));
    std::fflush(stderr);
    return seq;
  }
  if (coll_op_is_control(op)) {
    stats_.control_bytes += bytes;
    stats_.control_collectives += 1;
  } else {
    stats_.bytes += bytes;
    stats_.collectives += 1;
  }
  return seq;
}

void CollLog::finish(uint64_t seq) { finish(seq, now()); }

void CollLog::finish(uint64_t seq, double t_end) {
  CollRecord& r = records_[seq % kLogRecords];
  if (r.seq != seq || r.state != CollState::pending) return;
  r.state = CollState::done;
  r.t_end = std::max(t_end, r.t_start);
  if (tracer_)
    tracer_->collective(lanes_, coll_op_name(r.op), seq, r.bytes, r.step, t0_us_ + r.t_start * 1e6,
                        t0_us_ + r.t_end * 1e6, r.peer);
}

double CollLog::since(std::chrono::steady_clock::time_point tp) const {
  return std::chrono::duration<double>(tp - t0_).count();
}

void CollLog::trace_wait(double t0, double t1) const {
  tracer_->complete("wait #" + std::to_string(wait_seq_), Tracer::kWait, t0_us_ + t0 * 1e6, (t1 - t0) * 1e6,
                    "\"seq\":" + std::to_string(wait_seq_));
}

void CollLog::mark_timed_out(uint64_t seq) {
  CollRecord& r = records_[seq % kLogRecords];
  if (r.seq == seq) r.timed_out = true;
}

void CollLog::begin_step(int64_t step) {
  step_ = step;
  stats_ = CommStepStats{};
}

const CollRecord* CollLog::find(uint64_t seq) const {
  if (seq == 0) return nullptr;
  const CollRecord& r = records_[seq % kLogRecords];
  return r.seq == seq ? &r : nullptr;
}

std::vector<CollRecord> CollLog::records() const {
  std::vector<CollRecord> out;
  const uint64_t last = next_seq_ - 1;
  const uint64_t first = last >= kLogRecords ? last - kLogRecords + 1 : 1;
  for (uint64_t s = first; s <= last; ++s) out.push_back(records_[s % kLogRecords]);
  return out;
}

std::string CollLog::dump(size_t n) const {
  std::vector<CollRecord> recs = records();
  const size_t from = recs.size() > n ? recs.size() - n : 0;
  const double t = now();
  std::ostringstream os;
  char buf[160];
  for (size_t i = from; i < recs.size(); ++i) {
    const CollRecord& r = recs[i];
    os << "  #" << r.seq << " " << coll_op_name(r.op) << " " << format_bytes(double(r.bytes));
    if (r.peer >= 0) os << (r.op == CollOp::send ? " to rank " : " from rank ") << r.peer;
    os << " step " << r.step << " ";
    switch (r.state) {
      case CollState::done:
        std::snprintf(buf, sizeof buf, "done %.3f s -> %.3f s", r.t_start, r.t_end);
        break;
      case CollState::pending:
        std::snprintf(buf, sizeof buf, "pending since %.3f s (%.3f s ago)", r.t_start, t - r.t_start);
        break;
      case CollState::skipped:
        std::snprintf(buf, sizeof buf, "skipped (fault injection) at %.3f s", r.t_start);
        break;
    }
    os << buf;
    if (r.timed_out) os << (r.state == CollState::pending ? " TIMED OUT" : " (timed out earlier)");
    os << "\n";
  }
  return os.str();
}

// The world's collectives read as they always did ("collective all_reduce #3"): scripts and tests
// match that text; other groups and point to point add what tells them apart.
std::string CollLog::what(const CollRecord& r) const {
  std::ostringstream os;
  const bool p2p = r.peer >= 0;
  if (!p2p) os << "collective ";
  os << coll_op_name(r.op) << " #" << r.seq;
  // The pipeline group's ranks are its stages, in order (zero/data_mesh.h): named as such.
  const char* peer_is = name_ == "pipeline" ? "stage " : "rank ";
  if (p2p) {
    os << (r.op == CollOp::send ? " to " : " from ") << peer_is << r.peer;
    if (!global_ranks_.empty()) os << " (rank " << global_rank(r.peer) << " of the world)";
  }
  if (p2p || name_ != "world") os << " in group \"" << name_ << "\"";
  return os.str();
}

std::string CollLog::timeout_headline(uint64_t seq) const {
  const CollRecord* r = find(seq);
  std::ostringstream os;
  if (r) os << what(*r) << " (" << r->bytes << " bytes, step " << r->step << ")";
  else os << "collective #" << seq;
  os << " did not complete within " << opts_.timeout_s << " s \xe2\x80\x94 ";
  if (r && r->peer >= 0)
    os << (name_ == "pipeline" ? "stage " : "rank ") << r->peer << " of the group probably did not post the matching "
       << (r->op == CollOp::send ? "recv" : "send") << ", or is stuck";
  else if (name_ == "world")
    os << "another rank is probably stuck or skipped it";
  else {  // a group: the ranks that may be missing are its other members
    os << "another rank of the group (world rank";
    os << (world_ > 2 ? "s " : " ");
    for (int g = 0, n = 0; g < world_; ++g)
      if (g != rank_) os << (n++ ? ", " : "") << global_rank(g);
    os << ") is probably stuck or skipped it";
  }
  return os.str();
}

std::string CollLog::timeout_report(uint64_t seq, size_t dump_n) const {
  std::string who = "rank " + std::to_string(global_rank(rank_));
  if (name_ != "world") who += " (rank " + std::to_string(rank_) + " of group \"" + name_ + "\")";
  const std::string log = name_ == "world" ? "last collectives on this rank:\n"
                                           : "last collectives of group \"" + name_ + "\" on this rank:\n";
  return who + ": " + timeout_headline(seq) + "; " + log + dump(dump_n);
}

}  // namespace zt
