// Timeline traces (plan field run.trace): a Chrome / Perfetto JSON trace per rank. Ground level:
// knows nothing of ZeRO, the model or communication; the parts that own an event emit it
// (docs/traces.md; docs/design.md §3.4).
//
// File: {"traceEvents": [...], "displayTimeUnit": "ms", "otherData": {...}}. Complete events
// ("ph": "X") with ts and dur in microseconds of the host's monotonic clock (steady_clock, so ranks
// on one host share a time base), pid = rank, tid = a track; instant events ("ph": "i") for marks;
// "M" metadata events name the process ("rank R") and the tracks:
//
//   tid 0        step       each training step ("step 7", args step and loss), each evaluation
//   tid 1        compute    forward / backward per unit ("fwd u3", "bwd u3"; args unit, micro),
//                           "finish gradients", stage-3 releases (instant "release u3")
//   tid 2        wait       time blocked in Comm::wait on collective #seq
//   tid 3        optimizer  grad norm, AdamW over the owned slices, the parameter all-gather after it
//   tid 5        copy       the host-staged comm's device-to-host copies, from issue to the host seeing
//                           them done; its host-to-device copies as instants (the compute stream waits
//                           for them on the device: the host never sees them end)
//   tid 6        ops        the CPU backend's ops (matmul_forward, layernorm_backward, adamw, ...),
//                           one span per call (backend/ops_cpu.h)
//   tid 10 + k   comm, comm.k  collectives from start to completion (args: seq, bytes, step and the
//                           engine's tag: bucket, unit); in-flight collectives overlap, so each takes
//                           the first lane whose previous event it does not cross
//   tid 1000 + 100 g + k    comm <name>, comm <name>.k: the same for the g-th other group (from 0) of this
//                           rank (Comm::split: "comm dp", "comm row 1"), sends and receives with
//                           their peer in the args
//
// Cost when off: the owners hold a null Tracer* and test it. When on: one snprintf per event into
// a buffer, written out in 1 MiB pieces. Single-threaded: every call comes from the rank's main
// thread (the communication thread never traces; completion times it measured are passed in).
#pragma once
#include <cstdint>
#include <cstdio>
#include <string>
#include <unordered_map>
#include <vector>

namespace zt {

class Tracer {
 public:
  // kHostOptimizer: the CUDA backend's CPU AdamW (offload.optimizer "cpu"), beside backward.
  // kPipeline: a pipeline stage's passes of its schedule ("F3", "B1": micro-batch 3's forward, 1's
  // backward; train/pipeline_step.h), one such lane per rank of the merged trace.
  enum Track : int {
    kStep = 0, kCompute = 1, kWait = 2, kOptimizer = 3, kHostOptimizer = 4, kCopy = 5, kOps = 6, kPipeline = 7, kComm = 10
  };

  // The file of this rank: `path` with ".rank<R>" inserted before its extension ("t.json" ->
  // "t.rank0.json", "t" -> "t.rank0"), or "<path>/trace.rank<R>.json" when path ends in '/' or is
  // a directory.
  static std::string rank_path(const std::string& path, int rank);

  // Writes `file` (this rank's rank_path, already checked as an output: runtime/output_path.h);
  // missing parent directories are created. Throws Error if it cannot be opened.
  Tracer(const std::string& file, int rank);
  ~Tracer();  // close(), errors dropped
  Tracer(const Tracer&) = delete;
  Tracer& operator=(const Tracer&) = delete;

  // Microseconds of steady_clock (the time base of every event).
  static double now_us();

  // args: the members of a JSON object without braces (e.g. "\"seq\":3,\"bytes\":128"), or "".
  void complete(const std::string& name, int tid, double ts_us, double dur_us, const std::string& args = "");
  void instant(const std::string& name, int tid, double ts_us, const std::string& args = "");

  // The lanes of the group `name` ("world": the comm lanes above), made on first use; the id is for
  // collective() and started().
  int lane_group(const std::string& name);
  // A collective (or a send / recv: peer >= 0) of lane group `group` that completed: name = op, on
  // the group's first lane it does not cross.
  void collective(int group, const char* op, uint64_t seq, uint64_t bytes, int64_t step, double ts_us, double end_us,
                  int peer = -1);
  // A key/value (e.g. "bucket", 3) for the args of the next collective started: call before
  // starting it; the Comm calls started(seq) as it starts one, which binds the tags to that seq.
  void tag_next(const char* key, long value);
  // The tags given since the last start, removed; put_tags gives them back later. For a comm that
  // starts its inner collective after other collectives were tagged (comm/host_mirror_comm.h).
  std::string take_tags() {
    std::string t;
    t.swap(next_tags_);
    return t;
  }
  void put_tags(std::string tags) { next_tags_ = std::move(tags); }
  void started(int group, uint64_t seq) {
    if (next_tags_.empty()) return;
    tags_[tag_key(group, seq)].swap(next_tags_);
    next_tags_.clear();
  }

  const std::string& path() const { return path_; }
  // Ends the file. When it cannot be written whole (a full disk), the partial file is removed and
  // Error says what was lost.
  void close();

 private:
  void event(const char* head, const std::string& name, const std::string& args);  // head: the fields before the name
  void begin_event();
  void flush(bool force);
  void track_name(int tid, const std::string& name);

  std::string path_;
  int rank_;
  std::FILE* f_ = nullptr;
  std::string buf_;
  bool first_ = true;
  int write_errno_ = 0;  // the first failed write's errno
  uint64_t events_ = 0;
  static uint64_t tag_key(int group, uint64_t seq) { return uint64_t(group) << 48 ^ seq; }
  struct Lane {
    double start = 0, end = 0;
  };
  struct LaneGroup {
    std::string name;  // "world" or the group's
    int first_tid;     // lane k is first_tid + k
    std::vector<Lane> lanes;
  };
  std::vector<LaneGroup> groups_;  // [0]: the world
  std::string next_tags_;
  std::unordered_map<uint64_t, std::string> tags_;
};

}  // namespace zt
