// The calibration cache (calibrate.h): the machine it names, its lock, its entries checked on load, saved.
#include "autoplan/calibrate.h"
#include "autoplan/probe_timing.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <fstream>
#include <sstream>

#include <cblas.h>
#include <omp.h>

#include "backend/ops_cpu.h"
#include "kernels/adamw.h"
#include "model/gpt.h"
#include "offload/shard_source.h"
#include "offload/swap_file.h"
#include "offload/swap_pipeline.h"
#include "offload/uring.h"
#include "runtime/clock.h"
#include "runtime/error.h"
#include "plan/plan.h"
#include "runtime/output_path.h"

namespace zt::autoplan {

std::string canonical_dir(const std::string& dir) {
  std::error_code ec;
  const std::string where = std::filesystem::weakly_canonical(dir, ec).string();
  return where.empty() ? dir : where;
}


namespace {

std::string read_text(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// The first "key : value" line of a /proc file whose key starts with `key`.
std::string proc_field(const std::string& path, const std::string& key) {
  std::ifstream f(path);
  std::string line;
  while (std::getline(f, line))
    if (line.rfind(key, 0) == 0) {
      const size_t colon = line.find(':');
      if (colon == std::string::npos) return "";
      std::string v = line.substr(colon + 1);
      v.erase(0, v.find_first_not_of(" \t"));
      return v;
    }
  return "";
}

// What makes measured rates comparable: the same host, CPU, CPUs, memory and build.
nlohmann::json this_machine(const std::string& version) {
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  return {{"host", host},
          {"cpu", proc_field("/proc/cpuinfo", "model name")},
          {"cpus", long(sysconf(_SC_NPROCESSORS_ONLN))},  // the host's; a rank's share is in each probe's key
          {"mem_total", proc_field("/proc/meminfo", "MemTotal")},
          {"zerotrain", version}};
}


}  // namespace

std::string default_cache_path() {
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x) return std::string(x) + "/zerotrain/calibration.json";
  const char* home = std::getenv("HOME");
  ZT_REQUIRE(home && *home, "plan: neither XDG_CACHE_HOME nor HOME is set: give the calibration cache with --calibration FILE");
  return std::string(home) + "/.cache/zerotrain/calibration.json";
}

namespace {

// Every probe stores seconds (a whole call's, or per parameter or byte moved) or a share, the
// slowest rank's (max_over_ranks: never below 0). Past a day, or below a femtosecond, no probe of
// this machine measured it.
constexpr double kLeastSeconds = 1e-15, kMostSeconds = 86400;

// Why the cached `v` of `key` cannot be what its probe measured; "" when it can.
std::string bad_entry(const std::string& key, const nlohmann::json& v) {
  if (!v.is_number()) return "not a number";
  const double x = v.get<double>();
  if (!std::isfinite(x)) return "not finite";
  auto ends = [&](const std::string& tail) {
    return key.size() >= tail.size() && key.compare(key.size() - tail.size(), tail.size(), tail) == 0;
  };
  if (key.rfind("overlap ", 0) == 0 || ends(" exposed")) return x >= 0 && x <= 1 ? "" : "not a share from 0 to 1";
  if (key.rfind("stage_idle_share ", 0) == 0) return x > 0 && x <= 1 ? "" : "not a share above 0 up to 1";
  // Differences of two times (the engine run's later micro-steps and flush) may come out 0.
  if (x == 0 && (ends(" next") || ends(" flush"))) return "";
  if (x < kLeastSeconds || x > kMostSeconds) return "not a time a probe measures (1e-15 to 86400 s)";
  return "";
}

}  // namespace

Calibration::Calibration(Comm& comm, std::string cache_path, int threads, const std::string& version,
                         std::string comm_settings, std::vector<std::string>& notes)
    : comm_(comm), path_(std::move(cache_path)), threads_(threads), comm_settings_(std::move(comm_settings)),
      machine_(this_machine(version)), notes_(notes) {
  omp_set_num_threads(threads_);
  openblas_set_num_threads(threads_);
  // Rank 0 takes the lock first; while another planner holds it every rank waits, a second at a
  // time (short collectives: one long wait would pass the comm layer's hang timeout).
  if (comm_.rank() == 0) {
    std::error_code ec;
    const std::filesystem::path parent = std::filesystem::path(path_).parent_path();
    if (!parent.empty()) std::filesystem::create_directories(parent, ec);
    // Best effort: where no lock file can be made, the cache cannot be written either (save
    // refuses), so no entries of another planner's can be lost.
    lock_fd_ = ::open((path_ + ".lock").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  }
  for (bool said = false;;) {
    uint64_t got = comm_.rank() != 0 || lock_fd_ < 0 || ::flock(lock_fd_, LOCK_EX | LOCK_NB) == 0 ? 1 : 0;
    comm_.wait(comm_.broadcast(&got, sizeof got, 0));
    if (got) break;
    if (comm_.rank() == 0 && !said) {
      std::printf("calibration: %s is in use by another planner (%s.lock held); waiting for it to finish\n", path_.c_str(),
                  path_.c_str());
      std::fflush(stdout);
    }
    said = true;
    ::sleep(1);
  }
  // Rank 0 reads and checks the cache; every rank gets the same entries, so all take the same
  // probes (collectives).
  std::string text;
  if (comm_.rank() == 0) {
    std::error_code ec;
    if (std::filesystem::is_regular_file(path_, ec)) {
      nlohmann::json j = nlohmann::json::parse(read_text(path_), nullptr, false);
      if (j.is_discarded() || !j.is_object() || !j.contains("zerotrain_calibration"))
        throw Error("--calibration " + path_ + ": not a zerotrain calibration cache (it would be replaced): give another path");
      ZT_REQUIRE(j.contains("entries") && j["entries"].is_object(),
                 "--calibration " << path_ << ": its \"entries\" is not an object: not a calibration cache this build "
                                  << "reads (it would be replaced): remove it or give another path");
      if (j["machine"] != machine_) {
        notes_.push_back("calibration: " + path_ + " was measured on another machine or build (" + clip(j["machine"].dump(), 300) +
                         "); measuring again, it will be replaced");
      } else {
        nlohmann::json kept = nlohmann::json::object();
        for (const auto& [key, v] : j["entries"].items()) {
          const std::string why = bad_entry(key, v);
          if (why.empty()) kept[key] = v;
          else
            notes_.push_back("warning: calibration: " + path_ + ": \"" + clip(key, 200) + "\" is " + clip(v.dump(), 40) +
                             ", " + why + ": measuring it again");
        }
        text = kept.dump();
      }
    }
  }
  uint64_t n = text.size();
  comm_.wait(comm_.broadcast(&n, sizeof n, 0));
  text.resize(n);
  if (n) comm_.wait(comm_.broadcast(text.data(), n, 0));
  if (n) entries_ = nlohmann::json::parse(text);
}

Calibration::~Calibration() {
  if (lock_fd_ >= 0) ::close(lock_fd_);
}

double Calibration::cached(const std::string& key, const std::function<double()>& probe) {
  if (!entries_.contains(key)) {
    comm_.barrier();  // every rank starts together: they share the machine as in training
    const auto t0 = Clock::now();
    const double v = probe();
    record(key, v, seconds_since(t0));
  }
  const double v = entries_[key].get<double>();
  used_[key] = v;
  return v;
}

void Calibration::record(const std::string& key, double mine, double took_s) {
  const double v = max_over_ranks(comm_, mine);
  entries_[key] = v;
  ++measured_;
  if (comm_.rank() == 0) {  // progress, the number itself, and what measuring it took
    std::printf("  %s: %.6g", key.c_str(), v);
    if (took_s >= 0.05) std::printf("  (%.1f s)", took_s);
    std::printf("\n");
    std::fflush(stdout);
  }
}


void Calibration::save() {
  if (comm_.rank() != 0 || saved_) return;
  saved_ = true;
  // The lock goes with the save, not with the planner: --validate after it may run for minutes.
  struct Unlock {
    int& fd;
    ~Unlock() {
      if (fd >= 0) ::close(fd), fd = -1;
    }
  } unlock{lock_fd_};
  if (measured_ == 0) return;
  const std::string target = check_output_path("--calibration", path_);
  std::error_code ec;
  std::filesystem::create_directories(std::filesystem::path(target).parent_path(), ec);
  const nlohmann::json j = {{"zerotrain_calibration", 1}, {"machine", machine_}, {"entries", entries_}};
  write_by_rename("--calibration", target, [&](const std::string& tmp) {
    std::ofstream f(tmp);
    f << j.dump(2) << "\n";
    ZT_REQUIRE(f.good(), "--calibration " << tmp << ": write failed");
  });
}

}  // namespace zt::autoplan
