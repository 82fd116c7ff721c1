// Internals shared by the planner's files: the decisions a policy makes on the input tape and
// how they become a planned tape with residency stretches.
#pragma once

#include <vector>

#include "prefetch/plan.h"
#include "prefetch/recompute.h"

namespace ferry::planner {

// What a policy decided, in input-tape terms.
struct Decisions {
  std::vector<int> dropped;               // saved tensors to rebuild in backward
  std::vector<RecomputeChain> recompute;  // the chains that rebuild them (recompute_chains)
  std::vector<int> offload;               // tensors
};

// One step's access to a tensor.
struct Access {
  int step = 0;
  bool writes = false;
};

// The planned tape and its liveness, for a set of decisions.
struct Materialized {
  Tape tape;
  std::vector<int> origin;
  std::vector<int> new_index;  // input step -> planned step
  Liveness live;
  std::vector<bool> rebuilt;                // tensors with a recomputed second life
  std::vector<std::vector<Access>> access;  // per tensor, by ascending step, one per step
};
Materialized materialize(const Tape& input, const Liveness& live, const Decisions& d);

// vDNN's timing for a saved activation: copy after its producer, release right after its last
// forward use, fetch one step before its first backward use (or just before it when that step
// is in the forward pass).
OffloadTiming vdnn_timing(const Materialized& m, int tensor);

// For any tensor: the longest idle stretch between two accesses, fetched one step ahead; a
// release_at >= fetch_at means there is no gap worth a copy.
OffloadTiming gap_timing(const Materialized& m, int tensor);

// The saved activations of a planned tape take vDNN's timing; other tensors (a gradient that
// waits across a residual block) take their longest gap.
OffloadTiming offload_timing(const Materialized& m, int tensor);

// Residency stretches for every tensor (offsets still 0).
std::vector<TensorPlan> stretches(const Materialized& m, const Decisions& d,
                                  const std::vector<OffloadTiming>& timing);

// Aligned live bytes per planned step.
std::vector<uint64_t> live_bytes(const Tape& tape, const std::vector<TensorPlan>& plans);

// Lays out `plans` (fills offsets); returns the arena size.
uint64_t layout_plans(const Tape& tape, std::vector<TensorPlan>& plans);

// The auto policy: chooses decisions and timings that fit `arena_budget` at least predicted
// cost. Throws ConfigError when nothing fits.
void plan_auto(const Tape& input, const Liveness& live, const PlanOptions& options,
               uint64_t arena_budget, Decisions& decisions, Materialized& m,
               std::vector<OffloadTiming>& timing, std::vector<TensorPlan>& plans);

// The auto policy with options.fixed: those decisions on this tape, their timings fitted to
// `arena_budget` (Note [One plan for every shape] in plan.h). ConfigError when a named tensor is
// not in this tape or cannot be rebuilt here; BudgetError when they do not fit.
void plan_fixed(const Tape& input, const Liveness& live, const PlanOptions& options,
                uint64_t arena_budget, Decisions& decisions, Materialized& m,
                std::vector<OffloadTiming>& timing, std::vector<TensorPlan>& plans);

}  // namespace ferry::planner
