// Planning without training: the memory plan of a config's model at a batch size under a
// policy, with no device and no activation memory (`trainer plan`, --max-batch, the banner).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "device/kernels.h"
#include "device/shape.h"
#include "prefetch/plan.h"
#include "trainer/config/config.h"
#include "trainer/configured/options.h"
#include "trainer/exec/lower.h"
#include "trainer/plan/model_state.h"

namespace ferry {

class OfflinePlanner {
 public:
  // Uses the configured backend's kernels for workspace sizes (on a GPU: the workspaces of the
  // cuDNN algorithms found there). When they cannot answer here (`substituted()`: no CUDA
  // build or no GPU), stand-ins do (create_planning_kernels in device/backend_traits.h).
  explicit OfflinePlanner(const Config& config);
  ~OfflinePlanner();

  // The tape of the model at `batch` (lowered once per batch size, then cached).
  const Lowered& lowered(int64_t batch);
  // Plans `batch` under `policy` (ConfigError when it does not fit memory.budget; without
  // `enforce_budget`, the plan the policy makes with no budget).
  MemoryPlan plan(MemoryPolicy policy, int64_t batch, bool enforce_budget = true);
  // Plans `batch` under `policy` within `budget` bytes instead of memory.budget (0: unlimited);
  // ConfigError when it does not fit. The ladder a job sharing its device registers.
  MemoryPlan plan_at(MemoryPolicy policy, int64_t batch, uint64_t budget);
  // The tape of the model at a full input shape (lowered once per shape, then cached).
  const Lowered& lowered_shape(const Shape& input);
  // Plans the full input shape `input` (data.scales: one per side) under `policy`, as plan().
  // Under memory.per_shape false, auto takes the decisions of the static input's plan (Note [One
  // plan for every shape] in prefetch/plan.h; ConfigError when that plan does not fit).
  MemoryPlan plan_shape(MemoryPolicy policy, const Shape& input, bool enforce_budget = true);
  // The input whose plan's decisions every shape takes under memory.per_shape false; default
  // largest_input(config).
  void set_static_input(const Shape& input);
  // Whether `batch` fits memory.budget under `policy`.
  bool fits(MemoryPolicy policy, int64_t batch);
  // The largest batch that fits memory.budget under `policy` (0 when none does), searched up
  // to `limit`.
  int64_t max_batch(MemoryPolicy policy, int64_t limit = 1 << 16);

  // Plans with `cost` instead of cost_model(config) (a hardware profile, a contended link).
  void set_cost(const CostModel& cost) {
    cost_ = cost;
    static_.reset();
  }
  const CostModel& cost() const { return cost_; }

  // Plans for a job of `ranks` data-parallel ranks (trainer plan --ranks; default 1): the model
  // state per rank of memory.zero and memory.optimizer (Note [Model state per rank]).
  void set_ranks(int ranks);
  // Plan the model state training allocates on this build (ModelStateInputs::whole_gradients).
  void set_whole_gradients(bool on) {
    inputs_.whole_gradients = on;
    set_ranks(inputs_.ranks);
  }
  int ranks() const { return inputs_.ranks; }
  const ModelStateInputs& model_state_inputs() const { return inputs_; }
  // The model state every later plan holds (persistent()); set_ranks resets it to the config's
  // when memory.zero and memory.optimizer name one, else to zero 0 + device until resolved.
  void set_model_state(const ModelStateChoice& choice);
  const ModelState& model_state() const { return state_; }
  // Weighs every combination memory.zero and memory.optimizer allow at `batch` under `policy`
  // (auto's choice), adopts the chosen one, and returns the decision. When none fits: a
  // BudgetError naming the smallest budget that fits with zero 2 and the host optimizer (or the
  // host-limit line when only host memory is short).
  ModelStateDecision resolve_model_state(MemoryPolicy policy, int64_t batch);
  // choose_model_state over `candidates` with this planner's plans and cost model; adopts nothing.
  ModelStateDecision weigh_model_states(MemoryPolicy policy, int64_t batch,
                                        const std::vector<ModelStateChoice>& candidates);
  // Seconds a step spends on model state beyond its memory plan (model_state_seconds with this
  // planner's cost model).
  double model_state_seconds(const ModelState& s) const;

  bool substituted() const { return !substitute_.empty(); }
  // What stands in for the backend's kernels, in words; empty when they answer themselves.
  const std::string& substitute() const { return substitute_; }
  const PersistentBytes& persistent() const { return persistent_; }
  // auto keeps resident what cost().link_gbps cannot hide (PlanOptions::keep_unhidden).
  void set_contention_aware(bool on) {
    contention_aware_ = on;
    static_.reset();
  }

 private:
  // The config's plan options with this planner's cost model and persistent bytes.
  PlanOptions options(MemoryPolicy policy, uint64_t budget) const;

  Config config_;
  std::unique_ptr<Kernels> kernels_;
  std::string substitute_;
  PersistentBytes persistent_;
  uint64_t accumulation_bytes_ = 0;  // optim.accumulate > 1: the accumulation block
  ModelStateInputs inputs_;
  ModelState state_;
  CostModel cost_;
  std::map<int64_t, std::unique_ptr<Lowered>> tapes_;
  std::map<std::vector<int64_t>, std::unique_ptr<Lowered>> shaped_tapes_;
  bool contention_aware_ = false;
  Shape static_input_;
  std::shared_ptr<const FixedDecisions> static_;  // of static_input_'s plan, with this cost
};

// A tape's tensor bytes by storage (every tensor of the step once, not the peak): how much of
// the step device.precision narrowed (Note [Which tensors are bf16] in trainer/model/precision.h).
struct DTypeBytes {
  uint64_t bf16 = 0;
  uint64_t f32 = 0;
  uint64_t other = 0;      // integers and bytes: tokens, labels, masks
  uint64_t workspace = 0;  // kernels' scratch
};
DTypeBytes tape_dtype_bytes(const Tape& tape);
// "bf16 1.2 GiB, fp32 3.4 MiB, int/u8 12 MiB, workspace 1 MiB".
std::string dtype_bytes_text(const DTypeBytes& b);

}  // namespace ferry
