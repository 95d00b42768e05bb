// Wall time as the loop and the planner's probes measure it: the host's monotonic clock.
#pragma once
#include <chrono>

namespace zt {

using Clock = std::chrono::steady_clock;

// Seconds from `t0` to now.
inline double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

}  // namespace zt
