// A run whose input shape changes per step (data.scales): its plans made ahead of the steps that
// need them, the shapes the budget cannot hold (memory.oversize), one log line per new shape, and
// what metrics.jsonl and summary.json say per shape.
// Invariant: a step counts as waiting for its plan exactly when the executor had to plan it, or
// wait for its planning, between before_step() and after_step() (Note [Planning ahead] in
// program.cc); every rank admits or drops the same batches (Note [Dropping oversize batches]).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "device/shape.h"
#include "trainer/config/enums.h"
#include "trainer/data/loader.h"
#include "trainer/exec/executor.h"

namespace ferry {

// Whether any rank passed true: a collective every rank calls at the same point.
using AnyRank = std::function<bool(bool)>;

class ShapePlans {
 public:
  // `lookahead`: how many batches after the current one are planned ahead. `oversize`: what a
  // shape the budget cannot hold does (memory.oversize). `any_rank`: the ranks' agreement on
  // which shapes to drop (nullptr: one rank).
  ShapePlans(Executor& executor, Device& device, const DataLoader& loader,
             OversizeAction oversize = OversizeAction::kError, AnyRank any_rank = nullptr,
             int lookahead = 4);

  // Starts planning, in the background, the shapes of the `lookahead` batches from `from` on,
  // and publishes those whose planning has finished (rethrowing its error under
  // memory.oversize error: BudgetError naming the shape and the smallest budget, before the
  // step that needs it; remembering the shape as oversize under skip).
  void plan_ahead(LoaderPosition from);
  // Before the enqueue of one training step of `input` (and before admit()).
  void before_step(const Shape& input);
  // Whether batches of `input` are trained: its plan fits the budget (waiting for it when it is
  // not ready). Decided once per shape, with every rank (collective the first time). Under
  // memory.oversize error a shape the budget cannot hold throws its BudgetError instead.
  bool admit(const Shape& input);
  // Counts a dropped batch of `input` (admit() said false) at `step`; returns the warning line
  // of its shape's first drop, else "". ConfigError once every shape the loader can draw is
  // dropped (no step could train).
  std::string skip(const Shape& input, int64_t step);
  // The first position from `from` on whose batch admit() trains (ConfigError as skip()).
  LoaderPosition first_admitted(LoaderPosition from);
  // Returns the log line of a shape seen for the first time, else "".
  std::string after_step(const Shape& input, int64_t step);
  // A drain of the metrics: `seconds` since the previous one, covering the steps since then.
  void interval(double seconds);

  // Steps that waited for their plan, since construction.
  int64_t waited_steps() const { return waited_steps_; }
  // Batches dropped by memory.oversize skip, since construction.
  int64_t skipped_batches() const { return skipped_; }
  // summary.json's "skipped_shapes": each shape dropped, its batches and why.
  nlohmann::json skipped_summary() const;
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
  // The end-of-run line: shapes seen, steps that waited for a plan (and batches dropped).
  std::string end_line() const;

 private:
  struct Seen {
    const Program* program = nullptr;
    int64_t steps = 0;
    int64_t first_step = 0;
    bool waited = false;
  };
  // ConfigError when every shape the loader can draw is dropped; `dropped` names one.
  void check_some_shape_fits(const Shape& dropped) const;
  // Mean measured seconds per step of each shape, from the drained intervals (least squares
  // over intervals; exact when every interval is one step); -1 where unknown.
  std::vector<double> measured_step_seconds() const;

  // A shape no plan fits within the budget (memory.oversize skip): why, and batches dropped.
  struct Oversize {
    std::string why;
    int64_t batches = 0;
  };

  Executor& executor_;
  Device& device_;
  const DataLoader& loader_;
  OversizeAction oversize_action_;
  AnyRank any_rank_;
  int lookahead_;
  // This rank's planning failures (skip), by shape: the error's text.
  std::map<std::vector<int64_t>, std::string> failed_here_;
  // Shapes decided with every rank: admitted (true) or dropped (false).
  std::map<std::vector<int64_t>, bool> admitted_;
  std::map<std::vector<int64_t>, Oversize> oversize_;  // dropped shapes
  std::vector<std::vector<int64_t>> oversize_order_;   // by first drop
  int64_t skipped_ = 0;
  std::vector<std::vector<int64_t>> order_;  // shapes by first use
  std::map<std::vector<int64_t>, Seen> seen_;
  std::vector<int64_t> pending_;  // steps per shape (by order_) since the last drain
  std::vector<std::pair<std::vector<int64_t>, double>> intervals_;  // (steps per shape, s)
  int64_t waits_before_ = 0;
  int64_t waited_steps_ = 0;
};

}  // namespace ferry
