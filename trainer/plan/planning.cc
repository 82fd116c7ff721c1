// Offline planning.
#include "trainer/plan/planning.h"
#include "trainer/configured/model.h"

#include <algorithm>
#include <map>

#include <fmt/format.h>

#include "common/bytes.h"
#include "common/error.h"
#include "device/backend_traits.h"
#include "trainer/exec/parameter_store.h"
#include "trainer/exec/step_kernels.h"
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
  // Note [bf16 kernels at plan time]
  // A GPU backend's bf16 kernels are a property of the build, its kernel table (with no GPU here
  // the CUDA table answers: Note [Workspaces without a GPU]), so a plan or a simulation of a
  // model with a step the backend cannot run in bf16 is refused now, as training would refuse
  // it before step 1. The cpu backend's answer also depends on this machine's instructions
  // (avx512_bf16), and a plan is made for any machine, so there training alone refuses.
  if (config.device.precision == Precision::kBf16 &&
      backend_traits(config.device.backend).real_gpus) {
    check_bf16_kernels(graph, lower_graph(graph, *kernels_, /*training=*/true), *kernels_,
                       config.model.name, config.device.backend);
  }
  const int slots = optimizer_slots(optimizer_options(config));
  persistent_ = ParameterStore::plan_bytes(graph, slots,
                                           /*accumulation=*/config.optim.accumulate > 1,
                                           config.device.precision);
  inputs_.param_bytes = persistent_.weights;
  inputs_.buffers = persistent_.buffers;
  // What the model state's formula leaves out: bf16's working weights and the accumulation block.
  working_weights_ = persistent_.working_weights;
  accumulation_bytes_ = persistent_.gradients - persistent_.weights;
  inputs_.slots = slots;
  inputs_.bucket_bytes = static_cast<uint64_t>(config.comm.bucket_mb * 1048576.0);
  // Note [Model state per rank]: gradients more than one node writes are held through backward.
  std::map<TensorId, int> writers;
  for (const Node& node : graph.nodes()) {
    for (TensorId id : node.params) ++writers[id];
  }
  for (const auto& [id, n] : writers) {
    const uint64_t bytes = (graph.tensor(id).desc.bytes() + 63) / 64 * 64;
    if (n > 1) {
      inputs_.held_params.push_back(bytes);
    } else {
      inputs_.largest_unheld = std::max(inputs_.largest_unheld, bytes);
    }
  }
  for (TensorId id : graph.params()) {
    inputs_.largest_param =
        std::max<uint64_t>(inputs_.largest_param, (graph.tensor(id).desc.bytes() + 63) / 64 * 64);
  }
  static_input_ = largest_input(config);
  set_ranks(1);
}

void OfflinePlanner::set_ranks(int ranks) {
  inputs_.ranks = std::max(ranks, 1);
  ModelStateChoice c;
  if (config_.memory.zero != ZeroStage::kAuto) c.zero = config_.memory.zero;
  if (config_.memory.optimizer != OptimizerPlacement::kAuto) c.optimizer = config_.memory.optimizer;
  set_model_state(c);
}

void OfflinePlanner::set_model_state(const ModelStateChoice& choice) {
  state_ = ferry::model_state(inputs_, choice);
  persistent_ = state_.persistent(inputs_.buffers);
  persistent_.working_weights = working_weights_;
  // The accumulation block has the (padded) parameter block's layout; zero 2's staged gradients
  // accumulate in the shard instead (Note [Accumulating micro-batches]).
  if (accumulation_bytes_ > 0 && !state_.staged_gradients) persistent_.gradients += state_.weights;
  static_.reset();
}

double OfflinePlanner::model_state_seconds(const ModelState& s) const {
  // The collective's rate is taken as the host link's (the cost model has no network rate).
  return ferry::model_state_seconds(s, inputs_.slots, cost_.link_gbps, cost_.link_gbps,
                                    cost_.host_update_gbps);
}

ModelStateDecision OfflinePlanner::weigh_model_states(
    MemoryPolicy policy, int64_t batch, const std::vector<ModelStateChoice>& candidates) {
  const auto plan_with = [&](const PersistentBytes& p) {
    PlanOptions o = options(policy, config_.memory.budget);
    o.persistent = p;
    return plan_memory(lowered(batch).tape, o);
  };
  return choose_model_state(inputs_, candidates, config_.memory.host_limit, plan_with,
                            [this](const ModelState& s) { return model_state_seconds(s); });
}

ModelStateDecision OfflinePlanner::resolve_model_state(MemoryPolicy policy, int64_t batch) {
  const std::vector<ModelStateChoice> candidates =
      model_state_candidates(config_.memory.zero, config_.memory.optimizer);
  const auto plan_with = [&](const PersistentBytes& p) {
    PlanOptions o = options(policy, config_.memory.budget);
    o.persistent = p;
    return plan_memory(lowered(batch).tape, o);
  };
  ModelStateDecision d = weigh_model_states(policy, batch, candidates);
  if (d.chosen >= 0) {
    set_model_state(d.choice().state.choice);
    return d;
  }
  // Nothing fits. Host memory short while the device would hold it: name both numbers.
  for (const ModelStateOption& o : d.options) {
    if (o.why_not.rfind("memory.host_limit", 0) == 0) {
      bool device_fits = true;
      try {
        (void)plan_with(o.state.persistent(inputs_.buffers));
      } catch (const ConfigError&) {
        device_fits = false;
      }
      if (device_fits) {
        throw ConfigError(o.why_not,
                          fmt::format("raise memory.host_limit to at least {}",
                                      format_bytes(o.state.host_bytes() + o.plan.host_bytes)));
      }
    }
  }
  // The smallest budget that fits with the least model state there is.
  const ModelState least = ferry::model_state(
      inputs_, {inputs_.ranks > 1 ? ZeroStage::k2 : ZeroStage::k0, OptimizerPlacement::kHost});
  PlanOptions o = options(MemoryPolicy::kAuto, 0);
  o.persistent = least.persistent(inputs_.buffers);
  const Tape& tape = lowered(batch).tape;
  uint64_t good = plan_memory(tape, o).peak_bytes();
  uint64_t bad = plan_memory(tape, o).lower_bound - 1;
  while (good - bad > (uint64_t{1} << 20)) {
    const uint64_t mid = bad + (good - bad) / 2;
    o.budget = mid;
    try {
      (void)plan_memory(tape, o);
      good = mid;
    } catch (const ConfigError&) {
      bad = mid;
    }
  }
  const bool tried_least =
      std::find(candidates.begin(), candidates.end(), least.choice) != candidates.end();
  if (!tried_least) {
    throw BudgetError(
        fmt::format("{} does not fit: {}", describe(d.options.back().state.choice),
                    d.options.back().why_not),
        fmt::format("memory.zero 2 with memory.optimizer host fits it in {} (or use auto); or "
                    "raise memory.budget",
                    format_bytes(good)));
  }
  throw BudgetError(
      fmt::format("memory.budget {} is too small for {} at batch {} on {} rank{} even with "
                  "memory.zero 2, memory.optimizer host and memory.policy auto: the smallest "
                  "budget that fits is {}",
                  format_bytes(config_.memory.budget), config_.model.name, batch, inputs_.ranks,
                  inputs_.ranks == 1 ? "" : "s", format_bytes(good)),
      fmt::format("raise memory.budget to at least {}, or lower data.batch_size",
                  format_bytes(good)));
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
