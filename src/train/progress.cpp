#include "train/progress.h"

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "runtime/error.h"
#include "runtime/launcher.h"

namespace zt {

std::string format_duration(double s) {
  char buf[32];
  const int total = int(s + 0.5);
  if (total >= 3600) std::snprintf(buf, sizeof buf, "%dh%02dm", total / 3600, (total / 60) % 60);
  else if (total >= 60) std::snprintf(buf, sizeof buf, "%dm%02ds", total / 60, total % 60);
  else std::snprintf(buf, sizeof buf, "%ds", total);
  return buf;
}

MetricsLog::MetricsLog(const std::string& path) : path_(path), out_(path, std::ios::out | std::ios::trunc) {
  ZT_REQUIRE(out_, "run.log: cannot open " << path << " for writing: " << std::strerror(errno));
}

void MetricsLog::write(const nlohmann::json& j) {
  out_ << j.dump() << "\n";
  out_.flush();
  ZT_REQUIRE(out_, "run.log: write to " << path_ << " failed");
}

bool decorate_progress() {
  const char* env = std::getenv("ZT_PROGRESS");
  const std::string mode = env ? env : "";
  if (mode == "tty") return true;
  if (mode == "plain") return false;
  ZT_REQUIRE(mode.empty() || mode == "auto",
             "ZT_PROGRESS: \"" << mode << "\" is not a progress mode (tty, plain or auto; unset = auto)");
  return this_launch().launcher.empty() && isatty(STDOUT_FILENO) == 1;
}

}  // namespace zt
