// A run whose input shape changes per step (data.scales): its plans made ahead of the steps that
// need them, one log line per new shape, and what metrics.jsonl and summary.json say per shape.
// Invariant: a step counts as waiting for its plan exactly when the executor had to plan it, or
// wait for its planning, when the step was enqueued (Note [Planning ahead] in program.cc).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "device/shape.h"
#include "trainer/data/loader.h"
#include "trainer/exec/executor.h"

namespace ferry {

class ShapePlans {
 public:
  // `lookahead`: how many batches after the current one are planned ahead.
  ShapePlans(Executor& executor, Device& device, const DataLoader& loader, int lookahead = 4);

  // Starts planning, in the background, the shapes of the `lookahead` batches from `from` on,
  // and publishes those whose planning has finished (rethrowing its error: ConfigError naming
  // the shape and the smallest budget, before the step that needs it).
  void plan_ahead(LoaderPosition from);
  // Around the enqueue of one training step of `input`.
  void before_step(const Shape& input);
  // Returns the log line of a shape seen for the first time, else "".
  std::string after_step(const Shape& input, int64_t step);
  // A drain of the metrics: `seconds` since the previous one, covering the steps since then.
  void interval(double seconds);

  // Steps that waited for their plan, since construction.
  int64_t waited_steps() const { return waited_steps_; }
  // The program of `input` (planned: after its first step).
  const Program* program(const Shape& input) const;
  // The measured device peak while `program` runs: the device bytes outside the arena plus the
  // highest arena byte the executor addressed for it.
  uint64_t measured_peak(const Program& program) const;
  // The predicted step time averaged over the steps run (each at its shape's prediction).
  double predicted_mean_step() const;
  // Input shapes seen so far.
  size_t shape_count() const { return order_.size(); }
  // summary.json's "shapes": one entry per shape seen, in order of first use.
  nlohmann::json summary() const;
  // The end-of-run line: shapes seen, steps that waited for a plan.
  std::string end_line() const;

 private:
  struct Seen {
    const Program* program = nullptr;
    int64_t steps = 0;
    int64_t first_step = 0;
    bool waited = false;
  };
  // Mean measured seconds per step of each shape, from the drained intervals (least squares
  // over intervals; exact when every interval is one step); -1 where unknown.
  std::vector<double> measured_step_seconds() const;

  Executor& executor_;
  Device& device_;
  const DataLoader& loader_;
  int lookahead_;
  std::vector<std::vector<int64_t>> order_;  // shapes by first use
  std::map<std::vector<int64_t>, Seen> seen_;
  std::vector<int64_t> pending_;  // steps per shape (by order_) since the last drain
  std::vector<std::pair<std::vector<int64_t>, double>> intervals_;  // (steps per shape, s)
  int64_t waits_before_ = 0;
  int64_t waited_steps_ = 0;
};

}  // namespace ferry
