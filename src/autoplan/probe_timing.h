// How the calibration probes time what they measure (calibrate.h): the fastest of repeated calls,
// stopping once steady, or the median; and the slowest rank's value, since a step waits for it.
#pragma once
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "comm/comm.h"
#include "runtime/clock.h"

namespace zt::autoplan {

// The fastest of `reps` timed calls after one untimed (first-touch page faults, BLAS thread
// start-up): the planner predicts an undisturbed machine, and another job's burst during a probe
// slows some calls, never speeds one up.
template <class F>
inline double best_time(int reps, F&& f) {
  f();
  double best = 1e300;
  for (int i = 0; i < reps; ++i) {
    const auto t0 = Clock::now();
    f();
    best = std::min(best, seconds_since(t0));
  }
  return best;
}

// The same (the untimed call only where `warm_up`: not where a call before touched everything),
// but stopping early once the measurement is steady: after `least` timed calls, as soon
// as the two fastest agree within `agree` (relative) on every rank, else after `most`. Two calls
// that agree were both undisturbed (a burst would have to slow both by the same), so more calls
// would not find a faster one. Collective: every rank makes the same number of calls, so that
// ranks sharing cores run together as they do in training.
template <class F>
inline double steady_best_time(Comm& comm, int least, int most, double agree, bool warm_up, F&& f) {
  if (warm_up) f();
  std::vector<double> t;
  for (int i = 0; i < most; ++i) {
    const auto t0 = Clock::now();
    f();
    t.push_back(seconds_since(t0));
    if (int(t.size()) < least) continue;
    std::vector<double> sorted = t;
    std::sort(sorted.begin(), sorted.end());
    const uint64_t steady = sorted[1] <= sorted[0] * (1 + agree) ? 1 : 0;
    uint64_t all = 1;
    for (uint64_t x : comm.all_gather_u64(steady)) all &= x;
    if (all) break;
  }
  return *std::min_element(t.begin(), t.end());
}

// The median of `reps` timed calls of f after one untimed, each call after an untimed before():
// for the disk, whose rate moves from call to call by itself (a virtual disk's host cache), where
// the fastest would promise its best moment.
template <class F, class G>
inline double median_time(int reps, F&& f, G&& before) {
  before();
  f();
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    before();
    const auto t0 = Clock::now();
    f();
    t.push_back(seconds_since(t0));
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

inline double max_over_ranks(Comm& comm, double v) {
  uint64_t bits;
  std::memcpy(&bits, &v, 8);
  double m = 0;
  for (uint64_t b : comm.all_gather_u64(bits)) {
    double x;
    std::memcpy(&x, &b, 8);
    m = std::max(m, x);
  }
  return m;
}


}  // namespace zt::autoplan
