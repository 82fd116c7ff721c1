// The share controller: divides one GPU's memory capacity among the jobs sharing it, from their
// curves (Note [What the controller optimises]). Invariant: every admitted job gets at least its
// lower bound, the shares sum to at most the capacity, and admission follows arrival order.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace ferry {

// One point of a job's ladder: planned with a budget of `budget` bytes, a step takes `step_s`.
struct SharePoint {
  uint64_t budget = 0;
  double step_s = 0;
};

// A job's curve: what it registers for its device (the one spelling of it, from the planner to
// the ledger's block and back).
struct ShareCurve {
  uint64_t lower = 0;  // the smallest budget that can work
  uint64_t peak = 0;   // the unconstrained peak: a budget beyond it buys nothing
  // Sorted by budget, strictly increasing, the first at `lower` and the last at `peak` (one point
  // when lower == peak); step times positive. A larger budget can always run a smaller one's plan,
  // so a point slower than one below it is read as that one's time.
  std::vector<SharePoint> ladder;
};

// One job on the GPU, as the controller sees it.
struct ShareJob {
  ShareCurve curve;
  uint64_t order = 0;  // arrival order: smaller arrived first (ties: index order)
  // The step time measured at budget `current` (0: not measured). It calibrates the predicted
  // step times reported (Note [What the controller optimises]).
  double measured_step_s = 0;
  uint64_t current = 0;
};

enum class ShareObjective {
  kThroughput,  // maximise the sum over jobs of step(peak) / step(share)
  kFair,        // minimise the largest step(share) / step(peak), then as kThroughput
};

// "throughput" / "fair"; the parse throws ConfigError on another word.
const char* share_objective_name(ShareObjective objective);
ShareObjective parse_share_objective(const std::string& word);

// What the controller aims one job at: its target share (the job ledger grants it once the
// memory is free, Note [Handing memory over between jobs] in jobs/job_ledger.h).
struct ShareTarget {
  uint64_t share = 0;    // bytes; 0 while waiting
  bool waiting = false;  // not admitted: its lower bound does not fit after earlier arrivals'
  double step_s = 0;     // predicted (calibrated) step time at the share; 0 while waiting
  double slowdown = 0;   // step(share) / step(peak); 0 while waiting
};

struct ShareDivision {
  std::vector<ShareTarget> jobs;  // in the order of the input
  uint64_t free_bytes = 0;        // capacity minus the shares
  bool exact = true;              // false when the job mix was too large for the exact search
};

// Note [What the controller optimises]
// The controller divides from each job's lower bound, unconstrained peak and ladder of (budget,
// predicted step time) points. It is pure: no shared memory, no clock.
// Throughput is the sum over jobs of each job's speed relative to running alone, step(peak) /
// step(share) (the "weighted speedup" of multiprogrammed systems), not the raw sum of 1/step: the
// steps of different models are not the same unit of work, and the raw sum would give every byte
// to the job with the shortest steps (a 10 ms job saving 1 ms counts ten times a 1 s job halving
// its step). Nor the sum of step times, which favours the job with the longest steps. Fair
// minimises the largest slowdown step(share) / step(peak) and, among the divisions that reach it,
// maximises throughput. Both depend only on each job's ratios, so a uniform error in a job's cost
// model changes nothing: the measured step time only calibrates the step times reported (the
// ladder scaled by measured / predicted at the job's current budget); a curve whose shape is
// wrong is fixed by the job re-planning its ladder with its measured cost model (TENSILE's
// across-iteration correction), which share_drifted() tells it to do.
//
// Admission: jobs in arrival order, each admitted while the lower bounds of those admitted so
// far and its own fit; the first that does not fit waits, and so does every later one, so a large
// job is never overtaken for ever by small ones. A job whose lower bound exceeds the whole
// capacity can never run: it waits and blocks nobody.
//
// Division: each admitted job takes one ladder point (budgets between ladder points buy nothing,
// so they stay free for the next arrival). The search is exact: over jobs, the Pareto frontier
// of (bytes used, objective) is kept, which is a multiple-choice knapsack solved without
// discretising bytes (a mix of 24 jobs of 24 random points keeps about 4000 states); past
// `max_frontier` states it falls back to greedy upgrades by gain per byte
// (as TENSILE plans). Fair first finds the smallest reachable largest slowdown among the ladder's
// slowdowns, then maximises throughput among the points within it.
ShareDivision divide_memory(uint64_t capacity, const std::vector<ShareJob>& jobs,
                            ShareObjective objective, size_t max_frontier = size_t{1} << 14);

// Whether a job's measured step time at its share differs from the ladder's prediction there by
// more than `tolerance` (a fraction: 0.3 is TENSILE's): then it should re-plan its ladder.
bool share_drifted(const ShareJob& job, double tolerance);

// The ladder's step time at `budget` (the fastest point whose budget fits); 0 below `lower`.
double ladder_step(const std::vector<SharePoint>& ladder, uint64_t budget);

}  // namespace ferry
