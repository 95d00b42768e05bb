#include "autoplan/validation.h"

#include <algorithm>
#include <cstdio>

#include "autoplan/engine_runs.h"
#include "autoplan/ranking.h"

namespace zt::autoplan {

bool validate(const PlanRequest& req, const PlanInputs& in, std::vector<Candidate*>& fit, Comm& comm,
              const std::string& out_dir) {
  const bool root = comm.rank() == 0;
  const size_t k = req.validate < 0 ? fit.size() : std::min(fit.size(), size_t(req.validate));
  if (k == 0) return false;
  const int rounds = req.validate_rounds;
  if (root) std::printf("\nvalidating the top %zu: %d steps each, the first not timed; %d round(s), every other one in "
                        "reverse order, the fastest run counts (and the first candidate run once untimed before)\n",
                        k, req.validate_steps, rounds);
  // The first run after the calibration measured up to 25% slower than its twin run later, in 4 of
  // 5 sweeps on the development VM, all of its steps (settling the disk did not change it): so the
  // first candidate runs once untimed first.
  (void)measure(fit[0]->resolved, 2, comm, out_dir);
  // Rounds: the machine drifts over a sweep (whole sweeps 9-13% off their calibration, twin plans of
  // the same cost up to 17% apart within one: docs/autoplan.md), so each candidate runs once per
  // round, the rounds in alternating order so that a slow stretch falls on other candidates in the
  // next, and its time is its fastest run, as each calibration probe keeps its fastest repeat.
  for (int r = 0; r < rounds; ++r)
    for (size_t j = 0; j < k; ++j) {
      const size_t i = r % 2 == 0 ? j : k - 1 - j;
      Candidate* c = fit[i];
      const Measured m = measure(c->resolved, req.validate_steps, comm, out_dir);
      c->measured_runs_s.push_back(m.step_s);
      c->measured_update_runs_s.push_back(m.update_s);
      c->measured_s = *std::min_element(c->measured_runs_s.begin(), c->measured_runs_s.end());
      if (root) {
        std::printf("  round %d/%d, %zu/%zu %s: predicted %s ms, measured %s ms\n", r + 1, rounds, i + 1, k,
                    c->choice.label().c_str(), ms(c->pred.step_s).c_str(), ms(c->measured_runs_s.back()).c_str());
        std::fflush(stdout);
      }
    }
  if (root) {
    std::printf("\n");
    print_table(std::vector<const Candidate*>(fit.begin(), fit.begin() + long(k)), true);
    const auto fastest = std::min_element(fit.begin(), fit.begin() + long(k),
                                          [](auto* a, auto* b) { return a->measured_s < b->measured_s; });
    if (*fastest != fit[0])
      std::printf("measured fastest: #%ld (%s), %.1f%% faster than the chosen plan\n", long(fastest - fit.begin()) + 1,
                  (*fastest)->choice.label().c_str(), (1 - (*fastest)->measured_s / fit[0]->measured_s) * 100);
    else
      std::printf("measured fastest: the chosen plan\n");
  }
  return true;
}

}  // namespace zt::autoplan
