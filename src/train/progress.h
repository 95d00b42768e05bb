// What the loop prints and logs (docs/running.md): the metrics JSONL, durations, and whether to
// decorate progress.
#pragma once
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

namespace zt {

// "1h02m", "3m05s", "12s".
std::string format_duration(double seconds);

// Metrics JSONL: one object per line, flushed at once so a crash loses nothing already logged.
class MetricsLog {
 public:
  explicit MetricsLog(const std::string& path);
  void write(const nlohmann::json& j);

 private:
  std::string path_;
  std::ofstream out_;
};

// Progress decorations (\r, erase-line, ETA) are for a person watching a terminal. Under a
// launcher rank 0 cannot see what the user's stdout is: Open MPI hands each rank a pty of its own
// even when mpirun's output goes to a file, so there the default is plain. ZT_PROGRESS=tty|plain
// overrides the guess either way.
bool decorate_progress();

}  // namespace zt
