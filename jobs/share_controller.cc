// The share controller (Note [What the controller optimises] in share_controller.h): admission in
// arrival order, then an exact Pareto search over each admitted job's ladder points, greedy past a
// frontier size.
#include "jobs/share_controller.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <stdexcept>

#include <fmt/format.h>

#include "common/error.h"

namespace ferry {
namespace {

// Note [Ratios on a grid]
// The division depends on each job's ratios alone (Note [What the controller optimises]), but a
// ladder scaled by a factor (a job re-registers its curve after a drift) gives ratios that differ
// in their last bits, and jobs with equal curves would then swap the extra bytes at every
// re-registration (a re-plan each time). So ratios are rounded to a grid of 2^-32: a scaled
// ladder gives the same ratios, ties stay ties and fall the same way, and sums of them are exact.
double on_grid(double ratio) {
  return std::nearbyint(std::ldexp(ratio, 32)) * std::ldexp(1.0, -32);
}

// A job's ladder made monotone: budgets increasing, step times non-increasing.
struct Curve {
  std::vector<uint64_t> budget;
  std::vector<double> step;  // predicted, uncalibrated
  double alone = 0;          // step at the peak
  double scale = 1;          // measured / predicted at the current budget
  // Speed relative to alone, and its inverse (Note [Ratios on a grid]).
  double value(size_t k) const { return on_grid(alone / step[k]); }
  double slowdown(size_t k) const { return on_grid(step[k] / alone); }
};

Curve curve_of(const ShareJob& j, size_t index) {
  const auto bad = [&](const std::string& why) {
    return std::invalid_argument(fmt::format("memory share job {}: {}", index, why));
  };
  if (j.curve.lower > j.curve.peak) throw bad("lower bound above its peak");
  if (j.curve.ladder.empty()) throw bad("empty ladder");
  if (j.curve.ladder.front().budget != j.curve.lower ||
      j.curve.ladder.back().budget != j.curve.peak)
    throw bad("the ladder must run from the lower bound to the peak");
  Curve c;
  for (size_t k = 0; k < j.curve.ladder.size(); ++k) {
    const SharePoint& p = j.curve.ladder[k];
    if (!(p.step_s > 0) || !std::isfinite(p.step_s)) throw bad("a step time that is not positive");
    if (k > 0 && p.budget <= j.curve.ladder[k - 1].budget) throw bad("budgets not increasing");
    c.budget.push_back(p.budget);
    c.step.push_back(k > 0 ? std::min(p.step_s, c.step.back()) : p.step_s);
  }
  c.alone = c.step.back();
  const double predicted = ladder_step(j.curve.ladder, j.current);
  if (j.measured_step_s > 0 && predicted > 0) c.scale = j.measured_step_s / predicted;
  return c;
}

// One state of the Pareto search: bytes used above the lower bounds, objective, how it was made.
struct State {
  uint64_t used = 0;
  double value = 0;
  int32_t parent = -1;
  int32_t pick = 0;
};

// Exact multiple-choice knapsack: for each job one point k in [first[j], size), cost budget[k] -
// budget[first[j]], value curve.value(k); maximises the value within `room`. Returns the picks,
// or nothing when the frontier grew past `max_frontier`.
bool pareto_search(const std::vector<const Curve*>& curves, const std::vector<size_t>& first,
                   uint64_t room, size_t max_frontier, std::vector<size_t>& picks) {
  std::vector<std::vector<State>> layers;
  std::vector<State> frontier{State{}};
  for (size_t j = 0; j < curves.size(); ++j) {
    const Curve& c = *curves[j];
    std::vector<State> next;
    for (size_t s = 0; s < frontier.size(); ++s) {
      for (size_t k = first[j]; k < c.budget.size(); ++k) {
        const uint64_t cost = c.budget[k] - c.budget[first[j]];
        if (cost > room - frontier[s].used) break;  // budgets increase with k
        next.push_back(State{frontier[s].used + cost, frontier[s].value + c.value(k),
                             static_cast<int32_t>(s), static_cast<int32_t>(k)});
      }
    }
    std::sort(next.begin(), next.end(), [](const State& a, const State& b) {
      return a.used != b.used ? a.used < b.used : a.value > b.value;
    });
    frontier.clear();
    for (const State& s : next)
      if (frontier.empty() || s.value > frontier.back().value) frontier.push_back(s);
    if (frontier.size() > max_frontier) return false;
    layers.push_back(frontier);
  }
  picks.assign(curves.size(), 0);
  if (curves.empty()) return true;
  // The best state is the frontier's last (values increase along it).
  int32_t at = static_cast<int32_t>(layers.back().size()) - 1;
  for (size_t j = curves.size(); j-- > 0;) {
    const State& s = layers[j][static_cast<size_t>(at)];
    picks[j] = static_cast<size_t>(s.pick);
    at = s.parent;
  }
  return true;
}

// Greedy upgrades by objective gained per byte, from each job's first allowed point.
std::vector<size_t> greedy_search(const std::vector<const Curve*>& curves,
                                  const std::vector<size_t>& first, uint64_t room) {
  std::vector<size_t> picks = first;
  for (;;) {
    double best_rate = 0;
    size_t best_j = 0, best_k = 0;
    for (size_t j = 0; j < curves.size(); ++j) {
      const Curve& c = *curves[j];
      for (size_t k = picks[j] + 1; k < c.budget.size(); ++k) {
        const uint64_t extra = c.budget[k] - c.budget[picks[j]];
        if (extra > room) break;
        const double rate = (c.value(k) - c.value(picks[j])) / static_cast<double>(extra);
        if (rate > best_rate) {
          best_rate = rate;
          best_j = j;
          best_k = k;
        }
      }
    }
    if (best_rate <= 0) return picks;
    room -= curves[best_j]->budget[best_k] - curves[best_j]->budget[picks[best_j]];
    picks[best_j] = best_k;
  }
}

// The first point of `c` whose slowdown is within `limit`.
size_t first_within(const Curve& c, double limit) {
  for (size_t k = 0; k < c.step.size(); ++k)
    if (c.slowdown(k) <= limit) return k;
  return c.step.size() - 1;
}

}  // namespace

const char* share_objective_name(ShareObjective objective) {
  return objective == ShareObjective::kFair ? "fair" : "throughput";
}

ShareObjective parse_share_objective(const std::string& word) {
  if (word == "throughput") return ShareObjective::kThroughput;
  if (word == "fair") return ShareObjective::kFair;
  throw ConfigError(fmt::format("memory.share_objective: '{}' is not an objective", word),
                    "use throughput or fair");
}

double ladder_step(const std::vector<SharePoint>& ladder, uint64_t budget) {
  double best = 0;
  for (const SharePoint& p : ladder) {
    if (p.budget > budget) break;
    best = best > 0 ? std::min(best, p.step_s) : p.step_s;
  }
  return best;
}

bool share_drifted(const ShareJob& job, double tolerance) {
  const double predicted = ladder_step(job.curve.ladder, job.current);
  if (!(job.measured_step_s > 0) || !(predicted > 0)) return false;
  return std::abs(job.measured_step_s / predicted - 1) > tolerance;
}

ShareDivision divide_memory(uint64_t capacity, const std::vector<ShareJob>& jobs,
                            ShareObjective objective, size_t max_frontier) {
  std::vector<Curve> curves;
  for (size_t i = 0; i < jobs.size(); ++i) curves.push_back(curve_of(jobs[i], i));
  ShareDivision out;
  out.jobs.resize(jobs.size());

  // Admission in arrival order.
  std::vector<size_t> order(jobs.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return jobs[a].order < jobs[b].order; });
  std::vector<size_t> admitted;
  uint64_t lowers = 0;
  bool blocked = false;
  for (size_t i : order) {
    const uint64_t lower = jobs[i].curve.lower;
    const bool fits = !blocked && lower <= capacity - lowers;
    if (fits) {
      admitted.push_back(i);
      lowers += lower;
    } else {
      out.jobs[i].waiting = true;
      if (lower <= capacity) blocked = true;  // one that can never fit blocks nobody
    }
  }

  std::vector<const Curve*> chosen;
  for (size_t i : admitted) chosen.push_back(&curves[i]);
  std::vector<size_t> first(admitted.size(), 0);
  const uint64_t room = capacity - lowers;
  if (objective == ShareObjective::kFair && !admitted.empty()) {
    // The smallest largest slowdown whose budgets fit: feasibility grows with the limit.
    std::vector<double> limits;
    for (const Curve* c : chosen)
      for (size_t k = 0; k < c->step.size(); ++k) limits.push_back(c->slowdown(k));
    std::sort(limits.begin(), limits.end());
    limits.erase(std::unique(limits.begin(), limits.end()), limits.end());
    const auto fits = [&](double limit) {
      uint64_t need = 0;
      for (const Curve* c : chosen) need += c->budget[first_within(*c, limit)] - c->budget[0];
      return need <= room;
    };
    size_t lo = 0, hi = limits.size() - 1;  // the largest limit (every lower bound) fits
    while (lo < hi) {
      const size_t mid = (lo + hi) / 2;
      if (fits(limits[mid])) {
        hi = mid;
      } else {
        lo = mid + 1;
      }
    }
    for (size_t j = 0; j < chosen.size(); ++j) first[j] = first_within(*chosen[j], limits[lo]);
  }
  uint64_t base = 0;  // the budgets of the first allowed points, above the lower bounds
  for (size_t j = 0; j < chosen.size(); ++j)
    base += chosen[j]->budget[first[j]] - chosen[j]->budget[0];
  std::vector<size_t> picks;
  if (!pareto_search(chosen, first, room - base, max_frontier, picks)) {
    picks = greedy_search(chosen, first, room - base);
    out.exact = false;
  }
  uint64_t used = 0;
  for (size_t j = 0; j < admitted.size(); ++j) {
    const Curve& c = *chosen[j];
    ShareTarget& s = out.jobs[admitted[j]];
    s.share = c.budget[picks[j]];
    s.step_s = c.step[picks[j]] * c.scale;
    s.slowdown = c.step[picks[j]] / c.alone;
    used += s.share;
  }
  out.free_bytes = capacity - used;
  return out;
}

}  // namespace ferry
