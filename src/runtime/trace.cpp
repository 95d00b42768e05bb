#include "runtime/trace.h"

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <system_error>

#include "runtime/error.h"

namespace zt {

namespace fs = std::filesystem;

std::string Tracer::rank_path(const std::string& path, int rank) {
  const std::string r = ".rank" + std::to_string(rank);
  std::error_code ec;
  if (!path.empty() && (path.back() == '/' || fs::is_directory(path, ec)))
    return (fs::path(path) / ("trace" + r + ".json")).string();
  const fs::path p(path);
  return (p.parent_path() / (p.stem().string() + r + p.extension().string())).string();
}

double Tracer::now_us() {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

Tracer::Tracer(const std::string& file, int rank) : path_(file), rank_(rank) {
  const fs::path dir = fs::path(path_).parent_path();
  std::error_code ec;
  if (!dir.empty()) fs::create_directories(dir, ec);
  f_ = std::fopen(path_.c_str(), "w");
  ZT_REQUIRE(f_, "run.trace: cannot write " << path_ << ": " << std::strerror(errno)
                                            << " (choose a writable path, or \"\" for no trace)");
  buf_.reserve(1 << 20);
  buf_ += "{\"displayTimeUnit\":\"ms\",\"otherData\":{\"clock\":\"steady_clock\",\"rank\":" + std::to_string(rank) +
          "},\"traceEvents\":[\n";
  begin_event();
  buf_ += "{\"ph\":\"M\",\"name\":\"process_name\",\"pid\":" + std::to_string(rank) + ",\"tid\":0,\"args\":{\"name\":\"rank " +
          std::to_string(rank) + "\"}}";
  begin_event();
  buf_ += "{\"ph\":\"M\",\"name\":\"process_sort_index\",\"pid\":" + std::to_string(rank) +
          ",\"tid\":0,\"args\":{\"sort_index\":" + std::to_string(rank) + "}}";
  track_name(kStep, "step");
  track_name(kCompute, "compute");
  track_name(kWait, "wait");
  track_name(kOptimizer, "optimizer");
  track_name(kHostOptimizer, "host optimizer (CPU AdamW)");
  track_name(kCopy, "copy");
  track_name(kOps, "ops");
  track_name(kPipeline, "pipeline stage");
  track_name(kComm, "comm");
  groups_.push_back({"world", kComm, std::vector<Lane>(1)});
}

Tracer::~Tracer() {
  try {
    close();
  } catch (...) {
  }
}

void Tracer::begin_event() {
  if (!first_) buf_ += ",\n";
  first_ = false;
}

void Tracer::track_name(int tid, const std::string& name) {
  begin_event();
  buf_ += "{\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":" + std::to_string(rank_) + ",\"tid\":" + std::to_string(tid) +
          ",\"args\":{\"name\":\"" + name + "\"}}";
  begin_event();
  buf_ += "{\"ph\":\"M\",\"name\":\"thread_sort_index\",\"pid\":" + std::to_string(rank_) +
          ",\"tid\":" + std::to_string(tid) + ",\"args\":{\"sort_index\":" + std::to_string(tid) + "}}";
}

void Tracer::complete(const std::string& name, int tid, double ts_us, double dur_us, const std::string& args) {
  if (!f_) return;
  char head[160];
  std::snprintf(head, sizeof head, "{\"ph\":\"X\",\"pid\":%d,\"tid\":%d,\"ts\":%.3f,\"dur\":%.3f,\"name\":\"", rank_, tid,
                ts_us, dur_us < 0 ? 0.0 : dur_us);
  event(head, name, args);
}

void Tracer::instant(const std::string& name, int tid, double ts_us, const std::string& args) {
  if (!f_) return;
  char head[160];
  std::snprintf(head, sizeof head, "{\"ph\":\"i\",\"s\":\"t\",\"pid\":%d,\"tid\":%d,\"ts\":%.3f,\"name\":\"", rank_, tid,
                ts_us);
  event(head, name, args);
}

void Tracer::event(const char* head, const std::string& name, const std::string& args) {
  begin_event();
  buf_ += head;
  buf_ += name;
  buf_ += args.empty() ? "\"}" : "\",\"args\":{" + args + "}}";
  ++events_;
  flush(false);
}

void Tracer::tag_next(const char* key, long value) {
  std::string& t = next_tags_;
  if (!t.empty()) t += ',';
  t += '"';
  t += key;
  t += "\":" + std::to_string(value);
}

int Tracer::lane_group(const std::string& name) {
  for (size_t g = 0; g < groups_.size(); ++g)
    if (groups_[g].name == name) return int(g);
  const int tid = 1000 + 100 * (int(groups_.size()) - 1);  // the first group after the world: 1000
  groups_.push_back({name, tid, std::vector<Lane>(1)});
  track_name(tid, "comm " + name);
  return int(groups_.size() - 1);
}

void Tracer::collective(int group, const char* op, uint64_t seq, uint64_t bytes, int64_t step, double ts_us,
                        double end_us, int peer) {
  if (!f_) return;
  if (end_us < ts_us) end_us = ts_us;
  LaneGroup& lg = groups_[size_t(group)];
  size_t k = 0;
  while (k < lg.lanes.size() && ts_us < lg.lanes[k].end) ++k;
  if (k == lg.lanes.size()) {
    lg.lanes.push_back({});
    track_name(lg.first_tid + int(k), (group == 0 ? std::string("comm") : "comm " + lg.name) + "." + std::to_string(k));
  }
  lg.lanes[k] = {ts_us, end_us};
  std::string args = "\"seq\":" + std::to_string(seq) + ",\"bytes\":" + std::to_string(bytes) +
                     ",\"step\":" + std::to_string(step);
  if (peer >= 0) args += ",\"peer\":" + std::to_string(peer);
  auto it = tags_.find(tag_key(group, seq));
  if (it != tags_.end()) {
    args += "," + it->second;
    tags_.erase(it);
  }
  complete(op, lg.first_tid + int(k), ts_us, end_us - ts_us, args);
}

void Tracer::flush(bool force) {
  if (!f_ || (!force && buf_.size() < (1u << 20))) return;
  if (std::fwrite(buf_.data(), 1, buf_.size(), f_) != buf_.size() && write_errno_ == 0) write_errno_ = errno;
  buf_.clear();
}

void Tracer::close() {
  if (!f_) return;
  buf_ += "\n]}\n";
  flush(true);
  if (std::fflush(f_) != 0 && write_errno_ == 0) write_errno_ = errno;
  const bool ok = std::ferror(f_) == 0 && write_errno_ == 0;
  std::FILE* f = f_;
  f_ = nullptr;
  if (std::fclose(f) != 0 && write_errno_ == 0) write_errno_ = errno;
  if (ok && write_errno_ == 0) return;
  // A trace cut anywhere is not valid JSON: nothing is kept that a viewer would misread.
  std::error_code ec;
  fs::remove(path_, ec);
  ZT_REQUIRE(false, "run.trace: writing " << path_ << " failed (" << std::strerror(write_errno_ ? write_errno_ : EIO)
                                          << "): this rank's trace (" << events_
                                          << " events) is lost and the partial file removed; free some space, or set "
                                             "run.trace to \"\" (off)");
}

}  // namespace zt
