// A running job's budget that follows its grant on the node's job ledger (memory.share).
// Invariant: the ledger's record of what this job holds is never below what its device holds
// (Note [The ledger's record of held memory] in jobs/job_ledger.h); no plan above the grant runs.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "device/device.h"
#include "device/shape.h"
#include "trainer/exec/executor.h"
#include "trainer/share/lease.h"

namespace ferry {

// Note [Following a shared budget]
// Between steps the job reads its grant, plans the new budget ahead on a background thread,
// switches when that plan is ready, and tells the ledger what it holds; no step runs a plan above
// the job's grant.
// A job's budget is its grant, or its share when that is smaller (a shrink it has not confirmed
// yet). Between two steps, never inside one, before_step():
//  1. polls the ledger (which reaps the dead on the way);
//  2. when that target differs from the budget running, asks for the next batch's program within
//     it, planned on a background thread (ProgramCache keys programs by (shape, mode, budget)),
//     and goes on running the current plan meanwhile;
//  3. once that program is planned, switches: the executor waits for the device and frees its
//     arena (Executor::set_budget); a job whose share shrank then confirms what it holds (its
//     persistent bytes, within its share), which lets the ledger hand the difference to growing
//     jobs; the next step allocates the new plan's arena, and reports the bytes it will hold to
//     the ledger first (Executor::on_arena_growth), which refuses more than the grant.
// What the job reports is what its device holds, MemoryStats::held (on a CUDA device sharing its
// GPU, the bytes mapped), and its budget is its target less the backend's granule (Note [A shared
// budget in held bytes] in lease.h); the budgets below are the executor's.
// A growing job therefore allocates only after its grant rose, and its grant rises only once the
// shrinking jobs confirmed (Note [Handing memory over between jobs] in jobs/job_ledger.h): the
// sum held never exceeds the capacity. A job whose share falls while it plans keeps its old
// grant, and runs on it, until it confirms. Persistent state (weights, gradients, optimizer state)
// never moves, only the arena is replaced, and every plan runs the same kernels on the same tape
// in the same order, so the losses are bitwise those of the job alone with unlimited memory.
// A switch waits for the device once. Planning stalls no step: the job runs its old plan until
// the new one is ready (except when its share falls again during the switch itself: the smaller
// budget is then planned at once).
//
// Drift (TENSILE's across-iteration correction): at each drain of the metrics the job reports its
// measured step time; when the mean over a window of at least kDriftWindow steps differs from its
// curve's prediction at the running budget by more than memory.share_drift, the job re-registers
// its curve scaled by measured / predicted and the device is divided again. A uniform scale
// changes the predictions the ledger shows, not the shares, since both objectives compare each job
// only with itself alone (Note [Ratios on a grid] in jobs/share_controller.cc). One step's time on
// a machine other jobs share varies by more than 30%, hence the window. The first interval (first
// touches) and intervals with a switch in them are not measured.

class SharedBudget {
 public:
  static constexpr int64_t kDriftWindow = 10;  // steps

  // `lease` (admitted) and `executor` outlive this. Installs the executor's arena listener. With
  // `measured` (the executor plans with a measured cost model, memory.measure), plans the job's
  // curve again with it, on the tape of the first step's `first` input, and re-registers it
  // when it differs from the offline planner's.
  SharedBudget(const Config& config, MemoryShareLease& lease, Executor& executor, Device& device,
               const Shape& first, bool measured, std::function<void(const std::string&)> say);
  ~SharedBudget();
  SharedBudget(const SharedBudget&) = delete;
  SharedBudget& operator=(const SharedBudget&) = delete;

  // Between steps, before step `step` of input `next` is enqueued (Note [Following a shared
  // budget]). Throws when the ledger lost the job (it cannot hold memory it was not granted).
  void before_step(const Shape& next, int64_t step);
  // At a drain of the metrics: `steps` steps took `seconds`. Reports what the job holds and its
  // measured step time; re-registers its curve on a drift.
  void drained(int64_t steps, double seconds);

  // metrics.jsonl's fields for a logged step: the budget it ran within, the share, the grant,
  // the bytes held, the device's peak since the budget took effect and the re-plans so far.
  nlohmann::json fields() const;
  // The end-of-run line: budgets run, switches and drift re-registrations.
  std::string end_line() const;
  int64_t switches() const { return switches_; }

 private:
  // The budget the grant asks for now.
  static uint64_t target_of(const JobGrant& g) { return std::min(g.share, g.granted); }
  void switch_to(uint64_t budget, const Shape& next, int64_t step);

  const Config& config_;
  MemoryShareLease& lease_;
  Executor& executor_;
  Device& device_;
  std::function<void(const std::string&)> say_;
  JobGrant grant_;
  uint64_t reserve_ = 0;   // a budget is its target less this (lease.reserve())
  ShareCurve curve_;       // as registered, in held bytes (scaled on drifts)
  uint64_t planning_ = 0;  // the budget being planned ahead (0: none)
  double planning_since_ = 0;
  bool switched_in_interval_ = true;  // also: the first interval pays for first touches
  int64_t window_steps_ = 0;          // the drift window so far
  double window_seconds_ = 0;
  int64_t switches_ = 0;
  int64_t drifts_ = 0;
  std::vector<uint64_t> budgets_;  // every budget run, in order
};

}  // namespace ferry
