// Following a shared budget between steps (Note [Following a shared budget] in budget.h).
#include "trainer/share/budget.h"

#include <algorithm>
#include <chrono>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "common/bytes.h"
#include "common/error.h"
#include "jobs/share_controller.h"

namespace ferry {

namespace {

[[noreturn]] void throw_gone() {
  throw Error("memory.share: the node's job ledger no longer lists this job, so it holds no grant",
              "another process removed the job ledger's block (/dev/shm): start the job again");
}

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace

SharedBudget::SharedBudget(const Config& config, MemoryShareLease& lease, Executor& executor,
                           Device& device, const Shape& first, bool measured,
                           std::function<void(const std::string&)> say)
    : config_(config),
      lease_(lease),
      executor_(executor),
      device_(device),
      say_(std::move(say)),
      grant_(lease.grant()),
      reserve_(lease.reserve()),
      curve_(lease.curve()) {
  budgets_.push_back(executor_.budget());
  executor_.on_arena_growth([this](uint64_t device_bytes) {
    // Before the memory is taken: the ledger refuses more than the grant.
    grant_ = lease_.ledger().report(grant_.id, device_bytes);
    if (grant_.gone) throw_gone();
  });
  device_.memory().start_window();
  if (measured) {
    const Program& p = executor_.program(first, /*training=*/true);
    const ShareCurve curve =
        held_curve(share_curve([&](uint64_t budget) { return executor_.plan_within(p, budget); },
                               lease_.cap()),
                   reserve_);
    bool same = curve.lower == curve_.lower && curve.peak == curve_.peak &&
                curve.ladder.size() == curve_.ladder.size();
    for (size_t k = 0; same && k < curve_.ladder.size(); ++k)
      same = curve.ladder[k].budget == curve_.ladder[k].budget &&
             curve.ladder[k].step_s == curve_.ladder[k].step_s;
    if (!same) {
      curve_ = curve;
      grant_ =
          lease_.ledger().update_curve(grant_.id, curve_, "planned with the measured cost model");
      say_(fmt::format(
          "share    curve planned again with the measured cost model: lower bound {}, "
          "peak {}, predicted step {:.4f}s at the peak",
          format_bytes(curve_.lower), format_bytes(curve_.peak), curve_.ladder.back().step_s));
    }
  }
}

SharedBudget::~SharedBudget() { executor_.on_arena_growth(nullptr); }

void SharedBudget::before_step(const Shape& next, int64_t step) {
  grant_ = lease_.ledger().poll(grant_.id);
  if (grant_.gone) throw_gone();
  const uint64_t target = target_of(grant_);
  // No longer admitted (earlier jobs' lower bounds grew): the job keeps running on its grant,
  // which the ledger leaves it until it confirms a share. (curve_.lower >= reserve_, so a target at
  // or above it leaves a budget.)
  if (grant_.waiting || target < curve_.lower || target - reserve_ == executor_.budget()) {
    planning_ = 0;
    return;
  }
  const uint64_t budget = target - reserve_;  // Note [A shared budget in held bytes]
  if (planning_ != budget) {
    executor_.prepare(next, /*training=*/true, budget);
    planning_ = budget;
    planning_since_ = now_s();
  }
  // A shrink keeps its old grant until it confirms, and a growth waits for nothing it needs: in
  // both, the current plan runs on until the new one is ready.
  if (executor_.ready(next, /*training=*/true, budget)) switch_to(budget, next, step);
}

void SharedBudget::switch_to(uint64_t budget, const Shape& next, int64_t step) {
  const uint64_t from = executor_.budget();
  const double waited_s = now_s() - planning_since_;
  const std::string reason = grant_.reason;
  for (;;) {
    executor_.set_budget(budget);  // the device is idle and the arena freed from here on
    grant_ = lease_.ledger().confirm(grant_.id, device_.memory().stats().held);
    if (budget + reserve_ <= grant_.granted) break;
    // The share fell again while this job switched: plan the smaller one now (the step waits).
    const uint64_t target = target_of(grant_);
    budget = target - std::min(target, reserve_);
  }
  planning_ = 0;
  const Program& p = executor_.program(next, /*training=*/true);
  device_.memory().start_window();
  switched_in_interval_ = true;
  ++switches_;
  budgets_.push_back(budget);
  const MemoryPlan& plan = p.plan;
  say_(fmt::format(
      "budget   {} -> {} at step {}: {}; share {} of {}; policy {}, predicted step {:.4f}s, "
      "peak {}, moved {}/step, rebuilt {:.3g} GFLOP/step; planned in {:.3f}s, {:.3f}s before "
      "the switch",
      format_bytes(from), format_bytes(budget), step, reason.empty() ? "re-divided" : reason,
      format_bytes(grant_.share), format_bytes(grant_.capacity), policy_name(plan.policy),
      plan.prediction.step_seconds, format_bytes(plan.peak_bytes()),
      format_bytes(plan.offload_bytes), plan.recompute_flops / 1e9, p.plan_seconds, waited_s));
}

void SharedBudget::drained(int64_t steps, double seconds) {
  const bool measured = !switched_in_interval_ && steps > 0 && seconds > 0;
  switched_in_interval_ = false;
  if (measured) {
    window_steps_ += steps;
    window_seconds_ += seconds;
  } else {
    window_steps_ = 0;
    window_seconds_ = 0;
  }
  const double step_s = measured ? seconds / static_cast<double>(steps) : -1;
  grant_ = lease_.ledger().report(grant_.id, device_.memory().stats().held, step_s);
  const double drift = config_.memory.share_drift;
  if (window_steps_ < kDriftWindow || drift <= 0) return;
  const int64_t window_n = window_steps_;
  const double window_s = window_seconds_ / static_cast<double>(window_n);
  window_steps_ = 0;
  window_seconds_ = 0;
  ShareJob job;
  job.curve = curve_;
  job.measured_step_s = window_s;
  job.current = executor_.budget() + reserve_;  // in held bytes, as the ladder
  if (!share_drifted(job, drift)) return;
  const double predicted = ladder_step(curve_.ladder, job.current);
  const double scale = window_s / predicted;
  for (SharePoint& p : curve_.ladder) p.step_s *= scale;
  ++drifts_;
  const std::string why = fmt::format(
      "measured step {:.4f}s (mean of {} steps) against {:.4f}s predicted at {}, "
      "beyond memory.share_drift {}: curve scaled by {:.3f}",
      window_s, window_n, predicted, format_bytes(job.current), drift, scale);
  grant_ = lease_.ledger().update_curve(grant_.id, curve_, why);
  say_("drift    " + why + ", the device divided again");
}

nlohmann::json SharedBudget::fields() const {
  const MemoryStats m = device_.memory().stats();
  return {{"budget", executor_.budget()},       {"share", grant_.share},
          {"granted", grant_.granted},          {"held", m.held},
          {"budget_peak_bytes", m.window_peak}, {"replans", switches_}};
}

std::string SharedBudget::end_line() const {
  std::vector<std::string> budgets;
  for (uint64_t b : budgets_) budgets.push_back(format_bytes(b));
  return fmt::format("share    budgets {} ({} re-plan{}, {} drift re-registration{})",
                     fmt::join(budgets, " -> "), switches_, switches_ == 1 ? "" : "s", drifts_,
                     drifts_ == 1 ? "" : "s");
}

}  // namespace ferry
