// Per-shape plans of a run: planning ahead, the new-shape log line, per-shape summaries.
#include "trainer/plan/shape_plans.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "common/bytes.h"
#include "common/error.h"

namespace ferry {

ShapePlans::ShapePlans(Executor& executor, Device& device, const DataLoader& loader,
                       OversizeAction oversize, AnyRank any_rank, int lookahead)
    : executor_(executor),
      device_(device),
      loader_(loader),
      oversize_action_(oversize),
      any_rank_(std::move(any_rank)),
      lookahead_(lookahead),
      waits_before_(executor.plan_waits()) {}

void ShapePlans::plan_ahead(LoaderPosition p) {
  for (int i = 0; i < lookahead_; ++i) {
    const Shape input = loader_.input_shape(p);
    if (input[0] > 0 && !failed_here_.count(input.dims())) {
      executor_.prepare(input, /*training=*/true);
      // A plan finished in the background is published now, without waiting: a shape the
      // budget cannot hold stops the run here, steps before the one that needs it (or, under
      // memory.oversize skip, is remembered and not planned again).
      try {
        if (executor_.ready(input, /*training=*/true)) (void)executor_.program(input, true);
      } catch (const BudgetError& e) {
        if (oversize_action_ != OversizeAction::kSkip) throw;
        failed_here_[input.dims()] = e.what();
      }
    }
    if (++p.batch == loader_.batches_per_epoch()) p = LoaderPosition{p.epoch + 1, 0};
  }
}

void ShapePlans::before_step(const Shape& input) {
  (void)input;
  waits_before_ = executor_.plan_waits();
}

// Note [Dropping oversize batches]
// Under memory.oversize skip, a batch whose input shape no plan fits within memory.budget is
// dropped: the loader moves on to the next batch and the step trains that one (run.steps counts
// trained steps; the learning-rate schedule follows them). Data parallel needs every rank to
// drop the same batches, and every rank draws the same shape at each position, but whether a
// plan fits could differ between ranks (each plans with its own measured kernel times). So the
// first time a shape comes up for a step, the ranks agree (any_rank: a collective at the same
// point of every rank's batch sequence): a shape any rank cannot plan is dropped by all. Once
// every shape the loader can draw is dropped, the run ends: no step could train. The decision is
// made at the budget in force when the shape first comes up (memory.share may change it later).
bool ShapePlans::admit(const Shape& input) {
  if (auto it = admitted_.find(input.dims()); it != admitted_.end()) return it->second;
  bool fits = !failed_here_.count(input.dims());
  if (fits) {
    try {
      (void)executor_.program(input, /*training=*/true);
    } catch (const BudgetError& e) {
      if (oversize_action_ != OversizeAction::kSkip) throw;
      failed_here_[input.dims()] = e.what();
      fits = false;
    }
  }
  if (oversize_action_ == OversizeAction::kSkip && any_rank_) fits = !any_rank_(!fits);
  admitted_[input.dims()] = fits;
  return fits;
}

std::string ShapePlans::skip(const Shape& input, int64_t step) {
  ++skipped_;
  auto [it, fresh] = oversize_.try_emplace(input.dims());
  Oversize& o = it->second;
  ++o.batches;
  if (fresh) {
    oversize_order_.push_back(input.dims());
    const auto here = failed_here_.find(input.dims());
    o.why = here != failed_here_.end()
                ? here->second
                : fmt::format("input {}: another rank's plan for it does not fit memory.budget",
                              input.str());
  }
  check_some_shape_fits(input);
  if (!fresh) return "";
  return fmt::format(
      "skip     {}; its batches are dropped on every rank from step {} on (memory.oversize: skip), "
      "counted at the end and in summary.json",
      o.why, step);
}

void ShapePlans::check_some_shape_fits(const Shape& dropped) const {
  const std::vector<Shape> all = loader_.input_shapes();
  if (std::any_of(all.begin(), all.end(), [&](const Shape& s) {
        const auto a = admitted_.find(s.dims());
        return a == admitted_.end() || a->second;
      })) {
    return;
  }
  const auto here = failed_here_.find(dropped.dims());
  throw ConfigError(
      fmt::format("memory.oversize skip: no input shape fits memory.budget, every batch would be "
                  "dropped ({})",
                  here != failed_here_.end() ? here->second : dropped.str()),
      "raise memory.budget, or give data.scales sides that fit");
}

LoaderPosition ShapePlans::first_admitted(LoaderPosition p) {
  while (!admit(loader_.input_shape(p))) {
    check_some_shape_fits(loader_.input_shape(p));
    if (++p.batch == loader_.batches_per_epoch()) p = LoaderPosition{p.epoch + 1, 0};
  }
  return p;
}

nlohmann::json ShapePlans::skipped_summary() const {
  nlohmann::json out = nlohmann::json::array();
  for (const auto& dims : oversize_order_) {
    const Oversize& o = oversize_.at(dims);
    out.push_back({{"shape", dims}, {"batches", o.batches}, {"why", o.why}});
  }
  return out;
}

std::string ShapePlans::after_step(const Shape& input, int64_t step) {
  const bool waited = executor_.plan_waits() > waits_before_;
  if (waited) ++waited_steps_;
  auto [it, fresh] = seen_.try_emplace(input.dims());
  Seen& s = it->second;
  // The program that ran: another one of the same shape after a budget change (memory.share).
  s.program = &executor_.program(input, /*training=*/true);
  if (fresh) {
    order_.push_back(input.dims());
    pending_.push_back(0);
    s.first_step = step;
    s.waited = waited;
  }
  ++s.steps;
  const size_t k =
      static_cast<size_t>(std::find(order_.begin(), order_.end(), input.dims()) - order_.begin());
  ++pending_[k];
  if (!fresh) return "";
  const Program& p = *s.program;
  const MemoryPlan& plan = p.plan;
  const int64_t tape = static_cast<int64_t>(plan.tape.steps.size());
  return fmt::format(
      "shape    {} (step {}): policy {}, moved {}/step, rebuilt {:.3g} GFLOP/step, predicted "
      "step {:.4f}s, peak {}; planned in {:.3f}s {} (step times: {})",
      input.str(), step, policy_name(plan.policy), format_bytes(plan.offload_bytes),
      plan.recompute_flops / 1e9, plan.prediction.step_seconds, format_bytes(plan.peak_bytes()),
      p.plan_seconds, waited ? "while its step waited" : "ahead of its step",
      p.timed_steps == tape ? fmt::format("all {} tape steps measured", tape)
      : p.timed_steps == 0
          ? std::string("estimated by the FLOP model")
          : fmt::format("{} of {} tape steps measured, the new geometries' estimated by the FLOP "
                        "model{}",
                        p.timed_steps, tape,
                        p.estimate_scale > 0
                            ? fmt::format(" scaled to the measured ones (x{:.2f} over all)",
                                          p.estimate_scale)
                            : std::string()));
}

void ShapePlans::interval(double seconds) {
  if (std::all_of(pending_.begin(), pending_.end(), [](int64_t n) { return n == 0; })) return;
  intervals_.emplace_back(pending_, seconds);
  std::fill(pending_.begin(), pending_.end(), 0);
}

const Program* ShapePlans::program(const Shape& input) const {
  auto it = seen_.find(input.dims());
  return it == seen_.end() ? nullptr : it->second.program;
}

uint64_t ShapePlans::measured_peak(const Program& program) const {
  const uint64_t in_use = device_.memory().stats().in_use;
  const uint64_t outside = in_use - std::min(in_use, executor_.arena_bytes());
  return outside + program.arena_touched;
}

// Least squares: seconds_i = sum_k steps_ik * t_k over the drained intervals (the first one
// left out when there are others: it pays for first touches), by the normal equations. A shape
// the intervals cannot separate (a singular system) gets its share of its intervals' time in
// proportion to the predicted step times instead.
std::vector<double> ShapePlans::measured_step_seconds() const {
  const size_t n = order_.size();
  std::vector<double> out(n, -1.0);
  if (n == 0 || intervals_.empty()) return out;
  const size_t skip = intervals_.size() > n ? 1 : 0;
  std::vector<std::vector<double>> a(n, std::vector<double>(n + 1, 0.0));
  for (size_t i = skip; i < intervals_.size(); ++i) {
    const auto& [steps, seconds] = intervals_[i];
    for (size_t r = 0; r < n && r < steps.size(); ++r) {
      for (size_t c = 0; c < n && c < steps.size(); ++c) {
        a[r][c] += static_cast<double>(steps[r] * steps[c]);
      }
      a[r][n] += static_cast<double>(steps[r]) * seconds;
    }
  }
  bool singular = false;
  for (size_t c = 0; c < n && !singular; ++c) {
    size_t pivot = c;
    for (size_t r = c + 1; r < n; ++r) {
      if (std::fabs(a[r][c]) > std::fabs(a[pivot][c])) pivot = r;
    }
    if (std::fabs(a[pivot][c]) < 1e-9) {
      singular = true;
      break;
    }
    std::swap(a[c], a[pivot]);
    for (size_t r = 0; r < n; ++r) {
      if (r == c) continue;
      const double f = a[r][c] / a[c][c];
      for (size_t k = c; k <= n; ++k) a[r][k] -= f * a[c][k];
    }
  }
  if (!singular) {
    for (size_t k = 0; k < n; ++k) out[k] = a[k][n] / a[k][k];
    if (std::all_of(out.begin(), out.end(), [](double t) { return t > 0; })) return out;
  }
  // Proportional to the predicted step times within each interval.
  std::vector<double> seconds(n, 0.0), steps(n, 0.0);
  for (size_t i = skip; i < intervals_.size(); ++i) {
    const auto& [counts, s] = intervals_[i];
    double predicted = 0;
    for (size_t k = 0; k < counts.size(); ++k) {
      predicted += static_cast<double>(counts[k]) *
                   seen_.at(order_[k]).program->plan.prediction.step_seconds;
    }
    for (size_t k = 0; k < counts.size(); ++k) {
      if (counts[k] == 0 || predicted <= 0) continue;
      const double share = static_cast<double>(counts[k]) *
                           seen_.at(order_[k]).program->plan.prediction.step_seconds / predicted;
      seconds[k] += s * share;
      steps[k] += static_cast<double>(counts[k]);
    }
  }
  for (size_t k = 0; k < n; ++k) out[k] = steps[k] > 0 ? seconds[k] / steps[k] : -1.0;
  return out;
}

double ShapePlans::predicted_mean_step() const {
  double seconds = 0;
  int64_t steps = 0;
  for (const auto& [dims, s] : seen_) {
    seconds += static_cast<double>(s.steps) * s.program->plan.prediction.step_seconds;
    steps += s.steps;
  }
  return steps > 0 ? seconds / static_cast<double>(steps) : 0.0;
}

nlohmann::json ShapePlans::summary() const {
  const std::vector<double> measured = measured_step_seconds();
  nlohmann::json shapes = nlohmann::json::array();
  for (size_t k = 0; k < order_.size(); ++k) {
    const Seen& s = seen_.at(order_[k]);
    const Program& p = *s.program;
    shapes.push_back({{"shape", order_[k]},
                      {"steps", s.steps},
                      {"first_step", s.first_step},
                      {"waited_for_plan", s.waited},
                      {"plan_seconds", p.plan_seconds},
                      {"policy", policy_name(p.plan.policy)},
                      {"offload_bytes", p.plan.offload_bytes},
                      {"recompute_flops", p.plan.recompute_flops},
                      {"planned_peak_bytes", p.plan.peak_bytes()},
                      {"measured_peak_bytes", measured_peak(p)},
                      {"predicted_step_s", p.plan.prediction.step_seconds},
                      {"measured_step_s",
                       measured[k] >= 0 ? nlohmann::json(measured[k]) : nlohmann::json(nullptr)},
                      {"kernel_steps_measured", p.timed_steps},
                      {"tape_steps", p.plan.tape.steps.size()}});
  }
  return shapes;
}

std::string ShapePlans::end_line() const {
  std::vector<std::string> parts;
  const std::vector<double> measured = measured_step_seconds();
  for (size_t k = 0; k < order_.size(); ++k) {
    const Seen& s = seen_.at(order_[k]);
    // A shape trained only within the first logging interval, which the timing leaves out, has
    // no measured step: say so rather than print the -1 that marks it.
    const std::string time =
        measured[k] >= 0 ? fmt::format("{:.4f}s", measured[k])
                         : fmt::format("not measured ({})",
                                       s.steps == 1 ? "trained once" : "first interval only");
    parts.push_back(fmt::format("{} x{} {}/{:.4f}s", Shape(order_[k]).str(), s.steps, time,
                                s.program->plan.prediction.step_seconds));
  }
  std::string dropped;
  if (skipped_ > 0) {
    std::vector<std::string> shapes;
    for (const auto& dims : oversize_order_) {
      shapes.push_back(fmt::format("{} x{}", Shape(dims).str(), oversize_.at(dims).batches));
    }
    dropped = fmt::format("; {} batch{} dropped (memory.oversize: skip): {}", skipped_,
                          skipped_ == 1 ? "" : "es", fmt::join(shapes, ", "));
  }
  return fmt::format(
      "shapes   {} seen, {} step{} waited for a plan; per shape steps, measured/predicted step: "
      "{}{}",
      order_.size(), waited_steps_, waited_steps_ == 1 ? "" : "s", fmt::join(parts, ", "), dropped);
}

}  // namespace ferry
