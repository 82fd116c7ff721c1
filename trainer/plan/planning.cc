// Offline planning.
#include "trainer/plan/planning.h"
#include "trainer/configured/model.h"

#include <fmt/format.h>

#include "common/bytes.h"
#include "common/error.h"
#include "device/backend_traits.h"
#include "trainer/exec/parameter_store.h"
#include "trainer/model/zoo/zoo.h"
#include "trainer/optim/optimizer.h"

namespace ferry {

OfflinePlanner::OfflinePlanner(const Config& config) : config_(config), cost_(cost_model(config)) {
  // A plan is asked for many batch sizes: heuristics, no timing; kernels of this backend, or
  // stand-ins that model its workspaces (Note [Workspaces without a GPU] in
  // device/planning_kernels.cc).
  PlanningKernels k = create_planning_kernels(device_options(config));
  kernels_ = std::move(k.kernels);
  substitute_ = std::move(k.substitute);
  const Graph graph = build_configured_model(config, 1);
  persistent_ = ParameterStore::plan_bytes(graph, optimizer_slots(optimizer_options(config)),
                                           config.device.precision);
  static_input_ = largest_input(config);
}

void OfflinePlanner::set_static_input(const Shape& input) {
  static_input_ = input;
  static_.reset();
}

OfflinePlanner::~OfflinePlanner() = default;

const Lowered& OfflinePlanner::lowered(int64_t batch) {
  auto it = tapes_.find(batch);
  if (it != tapes_.end()) return *it->second;
  const Graph g = build_configured_model(config_, batch);
  auto lowered = std::make_unique<Lowered>(lower_graph(g, *kernels_, /*training=*/true));
  return *tapes_.emplace(batch, std::move(lowered)).first->second;
}

PlanOptions OfflinePlanner::options(MemoryPolicy policy, uint64_t budget) const {
  PlanOptions o = plan_options(config_);
  o.keep_unhidden = contention_aware_;
  o.budget = budget;
  o.policy = policy;
  o.persistent = persistent_;
  o.cost = cost_;
  return o;
}

MemoryPlan OfflinePlanner::plan(MemoryPolicy policy, int64_t batch, bool enforce_budget) {
  return plan_memory(lowered(batch).tape,
                     options(policy, enforce_budget ? config_.memory.budget : 0));
}

MemoryPlan OfflinePlanner::plan_at(MemoryPolicy policy, int64_t batch, uint64_t budget) {
  return plan_memory(lowered(batch).tape, options(policy, budget));
}

const Lowered& OfflinePlanner::lowered_shape(const Shape& input) {
  auto it = shaped_tapes_.find(input.dims());
  if (it == shaped_tapes_.end()) {
    const Graph g = build_configured_model(config_, input);
    it = shaped_tapes_
             .emplace(input.dims(),
                      std::make_unique<Lowered>(lower_graph(g, *kernels_, /*training=*/true)))
             .first;
  }
  return *it->second;
}

MemoryPlan OfflinePlanner::plan_shape(MemoryPolicy policy, const Shape& input,
                                      bool enforce_budget) {
  PlanOptions o = options(policy, enforce_budget ? config_.memory.budget : 0);
  if (policy == MemoryPolicy::kAuto && !config_.memory.per_shape && enforce_budget) {
    if (!static_) {
      try {
        static_ = std::make_shared<const FixedDecisions>(fixed_decisions(
            plan_memory(lowered_shape(static_input_).tape, o), static_input_.str()));
      } catch (const BudgetError& e) {
        throw ConfigError(fmt::format("memory.per_shape false plans every shape with the "
                                      "decisions of the largest, input {}, which does not fit: {}",
                                      static_input_.str(), e.what()),
                          e.hint() + "; or set memory.per_shape=true");
      }
    }
    o.fixed = static_;
  }
  return plan_memory(lowered_shape(input).tape, o);
}

bool OfflinePlanner::fits(MemoryPolicy policy, int64_t batch) {
  try {
    plan(policy, batch);
    return true;
  } catch (const ConfigError&) {
    return false;
  }
}

int64_t OfflinePlanner::max_batch(MemoryPolicy policy, int64_t limit) {
  if (!fits(policy, 1)) return 0;
  int64_t good = 1, bad = 2;
  while (bad <= limit && fits(policy, bad)) {
    good = bad;
    bad *= 2;
  }
  if (bad > limit) return good;
  while (bad - good > 1) {
    const int64_t mid = good + (bad - good) / 2;
    (fits(policy, mid) ? good : bad) = mid;
  }
  return good;
}

DTypeBytes tape_dtype_bytes(const Tape& tape) {
  DTypeBytes b;
  for (const TapeTensor& t : tape.tensors) {
    if (t.kind == TapeTensorKind::kWorkspace) {
      b.workspace += t.bytes;
    } else if (t.dtype == DType::kBF16) {
      b.bf16 += t.bytes;
    } else if (t.dtype == DType::kF32) {
      b.f32 += t.bytes;
    } else {
      b.other += t.bytes;
    }
  }
  return b;
}

std::string dtype_bytes_text(const DTypeBytes& b) {
  return fmt::format("bf16 {}, fp32 {}, int/u8 {}, workspace {}", format_bytes(b.bf16),
                     format_bytes(b.f32), format_bytes(b.other), format_bytes(b.workspace));
}

}  // namespace ferry
