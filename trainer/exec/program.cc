// Planning a program per shape and mode, and indexing its plan by step.
#include "trainer/exec/program.h"

#include <chrono>
#include <map>

#include <fmt/format.h>

#include "common/bytes.h"
#include "common/error.h"
#include "common/host_memory.h"

namespace ferry {

ProgramCache::ProgramCache(Device& device, ParameterStore& store, HostPool& host_pool,
                           GraphFactory factory, PlanOptions options, ShapedGraphFactory shaped)
    : device_(device),
      store_(store),
      host_pool_(host_pool),
      factory_(std::move(factory)),
      shaped_(std::move(shaped)),
      options_(std::move(options)),
      budget_(options_.budget) {}

ProgramCache::~ProgramCache() {
  for (auto& [key, e] : programs_) {
    if (e.planning.valid()) e.planning.wait();  // its thread reads this cache's members
    if (!e.program) continue;
    for (auto& [t, slot] : e.program->offloads) host_pool_.release(slot.host);
  }
}

void ProgramCache::learn_sample(const Graph& g) {
  const Shape in = g.tensor(g.input()).desc.shape;
  sample_ = Shape(std::vector<int64_t>(in.dims().begin() + 1, in.dims().end()));
}

Shape ProgramCache::configured_input(int64_t batch) const {
  std::vector<int64_t> dims{batch};
  dims.insert(dims.end(), sample_.dims().begin(), sample_.dims().end());
  return Shape(dims);
}

Program& ProgramCache::get(int64_t batch, bool training) {
  std::optional<Graph> graph;
  if (sample_.rank() == 0) {
    graph = factory_(batch);
    learn_sample(*graph);
  }
  const Key key{configured_input(batch).dims(), training, budget_};
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = programs_.find(key);
    if (it != programs_.end() && it->second.program) return *it->second.program;
  }
  return publish(key, std::move(graph));
}

Program& ProgramCache::get(const Shape& input, bool training) {
  if (sample_.rank() == 0) learn_sample(factory_(1));
  const Key key{input.dims(), training, budget_};
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = programs_.find(key);
    if (it != programs_.end() && it->second.program) return *it->second.program;
  }
  return publish(key, std::nullopt);
}

// Note [Planning ahead]
// A new input shape (data.scales) needs its own program, and so does a new budget (memory.share:
// the job's grant changed; the budget is passed to the planning thread, never read there). The
// loader knows the shapes of the batches after the current one (a pure function of the
// position), and the ledger the next budget, so the trainer calls prepare() for them while the
// current step runs: the graph is built, lowered and planned on a background thread
// (std::async), which touches only const state of this cache and the device's kernel-plan cache
// (thread-safe). The executor's thread publishes the result at its first get():
// it indexes the plan (host copies, residency machines, persistent addresses: state the executor
// owns) and from then on the program's plan is immutable. The map is guarded by mu_; a Program is
// never moved once made (unique_ptr), so a reference stays valid while the cache lives.
void ProgramCache::prepare(const Shape& input, bool training, uint64_t budget) {
  if (sample_.rank() == 0) learn_sample(factory_(1));
  Key key{input.dims(), training, budget};
  std::lock_guard<std::mutex> lock(mu_);
  if (programs_.count(key)) return;
  std::vector<std::string> keep = keep_alive_;
  Entry& e = programs_[key];
  e.planning = std::async(std::launch::async, [this, input, training, budget, keep] {
    return plan_program(input, training, budget, keep, std::nullopt);
  });
}

bool ProgramCache::ready(const Shape& input, bool training, uint64_t budget) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = programs_.find(Key{input.dims(), training, budget});
  if (it == programs_.end()) return false;
  const Entry& e = it->second;
  return e.program != nullptr ||
         (e.planning.valid() &&
          e.planning.wait_for(std::chrono::seconds(0)) == std::future_status::ready);
}

int64_t ProgramCache::waits() const {
  std::lock_guard<std::mutex> lock(mu_);
  return waits_;
}

std::vector<const Program*> ProgramCache::programs() const {
  std::lock_guard<std::mutex> lock(mu_);
  return order_;
}

Program& ProgramCache::publish(const Key& key, std::optional<Graph> graph) {
  const Shape input(key.input);
  std::future<std::unique_ptr<Program>> planning;
  {
    std::lock_guard<std::mutex> lock(mu_);
    Entry& e = programs_[key];
    if (e.planning.valid()) {
      if (e.planning.wait_for(std::chrono::seconds(0)) != std::future_status::ready) ++waits_;
      planning = std::move(e.planning);
    } else {
      ++waits_;
    }
  }
  std::unique_ptr<Program> p;
  try {
    // Waits outside the lock: prepare() from this thread never runs meanwhile, but a reader of
    // ready() or programs() on another thread must not block on planning.
    p = planning.valid()
            ? planning.get()
            : plan_program(input, key.training, key.budget, keep_alive_, std::move(graph));
  } catch (...) {
    std::lock_guard<std::mutex> lock(mu_);
    programs_.erase(key);  // a later get() tries again and throws again
    throw;
  }
  index_plan(*p);
  std::lock_guard<std::mutex> lock(mu_);
  Entry& e = programs_[key];
  e.program = std::move(p);
  order_.push_back(e.program.get());
  return *e.program;
}

std::shared_ptr<const FixedDecisions> ProgramCache::static_decisions(
    uint64_t budget, const std::vector<std::string>& keep_alive) const {
  std::lock_guard<std::mutex> lock(static_mu_);
  if (auto it = static_.find(budget); it != static_.end()) return it->second;
  const Shape& largest = shape_options_.static_input;
  std::unique_ptr<Program> p;
  try {
    p = plan_program(largest, /*training=*/true, budget, keep_alive, std::nullopt,
                     /*own_decisions=*/true);
  } catch (const BudgetError& e) {
    // Not a shape to skip (memory.oversize): without this plan no shape has one.
    throw ConfigError(
        fmt::format("memory.per_shape false plans every shape with the decisions of the largest, "
                    "which does not fit: {}",
                    e.what()),
        e.hint() + "; or set memory.per_shape=true");
  }
  return static_[budget] =
             std::make_shared<const FixedDecisions>(fixed_decisions(p->plan, largest.str()));
}

std::unique_ptr<Program> ProgramCache::plan_program(const Shape& input, bool training,
                                                    uint64_t budget,
                                                    std::vector<std::string> keep_alive,
                                                    std::optional<Graph> graph,
                                                    bool own_decisions) const {
  const auto start = std::chrono::steady_clock::now();
  auto p = std::make_unique<Program>();
  p->input = input;
  if (graph) {
    p->graph = std::move(*graph);
  } else {
    const bool configured =
        std::vector<int64_t>(input.dims().begin() + 1, input.dims().end()) == sample_.dims();
    if (configured) {
      p->graph = factory_(input[0]);
    } else {
      if (!shaped_) {
        throw ConfigError(
            fmt::format("no model graph for input {}: this executor builds only "
                        "the configured input (N, {})",
                        input.str(), sample_.str()));
      }
      p->graph = shaped_(input);
    }
  }
  p->lowered = lower_graph(p->graph, device_.kernels(), training);
  // The last step reads every kept tensor, so liveness keeps it to the end.
  for (const std::string& name : keep_alive) {
    bool found = false;
    for (size_t t = 0; t < p->lowered.tape.tensors.size(); ++t) {
      if (p->lowered.tape.tensors[t].name != name) continue;
      p->lowered.tape.steps.back().reads.push_back(static_cast<int>(t));
      found = true;
    }
    if (!found) throw ConfigError("keep_alive: no tensor named '" + name + "'");
  }
  PlanOptions options = options_;
  options.budget = budget;
  options.persistent = store_.bytes();
  if (!training) options.policy = MemoryPolicy::kNone;  // nothing is saved for a backward
  if (training && options.policy == MemoryPolicy::kAuto && shape_options_.static_input.rank() > 0 &&
      !own_decisions) {
    options.fixed = static_decisions(budget, keep_alive);
  }
  // Errors name the input when it is not the configured one, or when shapes vary.
  const bool name =
      shape_options_.name_shapes ||
      (sample_.rank() > 0 && input.rank() >= 2 &&
       std::vector<int64_t>(input.dims().begin() + 1, input.dims().end()) != sample_.dims());
  try {
    p->plan = plan_memory(p->lowered.tape, options);
  } catch (const BudgetError& e) {
    if (!name) throw;
    throw BudgetError(fmt::format("input {}: {}", input.str(), e.what()),
                      e.hint() + "; or set memory.oversize=skip to drop the batches of this shape");
  } catch (const ConfigError& e) {
    if (!name) throw;
    throw ConfigError(fmt::format("input {}: {}", input.str(), e.what()), e.hint());
  }
  for (const TapeStep& s : p->plan.tape.steps) {
    if (options_.cost.measured_seconds(s, p->plan.tape) >= 0) ++p->timed_steps;
  }
  if (const auto& m = options_.cost.measured; m && m->estimate_scale.count("")) {
    p->estimate_scale = m->estimate_scale.at("");
  }
  p->plan_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return p;
}

MemoryPlan ProgramCache::plan_within(const Program& program, uint64_t budget) const {
  PlanOptions options = options_;
  options.budget = budget;
  options.persistent = store_.bytes();
  return plan_memory(program.lowered.tape, options);
}

void ProgramCache::index_plan(Program& p) {
  p.persistent.assign(p.graph.tensors().size(), nullptr);
  for (size_t id = 0; id < p.graph.tensors().size(); ++id) {
    if (is_persistent(p.graph.tensors()[id].role)) {
      p.persistent[id] = store_.address(p.graph, static_cast<TensorId>(id));
    }
  }
  p.grads.assign(p.graph.tensors().size(), nullptr);
  p.param_index.assign(p.graph.tensors().size(), -1);
  for (TensorId param : p.graph.params()) {
    p.grads[param] = store_.grad_address(p.graph, param);
    p.param_index[param] = static_cast<int32_t>(store_.param_index(p.graph, param));
  }
  p.working.clear();
  if (store_.has_working_copy()) {
    p.working.assign(p.graph.tensors().size(), nullptr);
    for (TensorId param : p.graph.params())
      p.working[param] = store_.working_address(p.graph, param);
  }
  // The host bytes the offloads need are known now: check them before any step runs.
  const HostPoolStats pool = host_pool_.stats();
  if (pool.reserved + p.plan.host_bytes > host_pool_.limit()) {
    throw OutOfMemoryError(
        OutOfMemoryError::Where::kHostPool,
        fmt::format("offloads of a batch of {}", p.graph.batch()), p.plan.host_bytes, pool.reserved,
        host_pool_.limit(), {},
        fmt::format("raise memory.host_limit to at least {}, or offload less (memory.policy, "
                    "memory.budget)",
                    format_bytes(pool.reserved + p.plan.host_bytes)));
  }
  if (const auto available = available_host_memory(); available && p.plan.host_bytes > *available) {
    throw OutOfMemoryError(OutOfMemoryError::Where::kHostPool, "offloads (machine memory)",
                           p.plan.host_bytes, 0, *available, {},
                           "the machine's free memory cannot hold the offloaded activations: "
                           "lower data.batch_size or give auto a larger memory.budget");
  }
  const size_t steps = p.plan.tape.steps.size();
  p.planned_start.assign(steps + 1, 0.0);
  for (size_t s = 0; s < steps; ++s) {
    p.planned_start[s + 1] =
        p.planned_start[s] + options_.cost.step_seconds(p.plan.tape.steps[s], p.plan.tape);
  }
  p.grads_written.resize(steps);
  p.grads_touched.resize(steps);
  p.release_at.resize(steps);
  p.fetch_at.resize(steps);
  p.needed_at.resize(steps);
  p.offload_after.resize(steps);
  p.dies_at.resize(steps);
  // A gradient is written at its last backward writer (Note [Tied weights] in graph.cc: a tied
  // weight's first writer leaves half of it).
  std::map<size_t, size_t> last_writer;  // parameter index -> step
  for (size_t s = 0; s < steps; ++s) {
    if (p.plan.tape.steps[s].phase != StepPhase::kBackward) continue;
    const StepBinding& b = p.lowered.bindings[p.plan.origin[s]];
    for (int slot : b.grad_params) {
      last_writer[store_.param_index(p.graph, persistent_id(slot))] = s;
    }
  }
  for (size_t s = 0; s < steps; ++s) {
    if (p.plan.tape.steps[s].phase != StepPhase::kBackward) continue;
    const StepBinding& b = p.lowered.bindings[p.plan.origin[s]];
    for (int slot : b.grad_params) {
      const size_t param = store_.param_index(p.graph, persistent_id(slot));
      if (last_writer[param] == s) p.grads_written[s].push_back(param);
      p.grads_touched[s].push_back(param);
    }
  }
  for (size_t t = 0; t < p.plan.tensors.size(); ++t) {
    const TensorPlan& tp = p.plan.tensors[t];
    const int tensor = static_cast<int>(t);
    if (tp.decision == Decision::kOffload) {
      // Note [Life of an offloaded activation] (executor.h), step 3: the tensor's four steps
      // become entries of the per-step lists, and it gets a residency machine and a host copy.
      p.release_at[tp.release_at].push_back(tensor);
      p.fetch_at[tp.fetch_at].push_back(tensor);
      p.needed_at[tp.needed_at].push_back(tensor);
      p.offload_after[tp.offload_after].push_back(tensor);
      const TapeTensor& info = p.plan.tape.tensors[t];
      OffloadSlot slot;
      slot.residency = std::make_unique<ResidentTensor>(device_, info.name, info.bytes);
      slot.host = host_pool_.acquire(info.bytes, "offload of " + info.name);
      p.offloads.emplace(tensor, std::move(slot));
    }
    for (size_t r = 0; r < tp.residency.size(); ++r) {
      // Freed by an offload's release, or handed on to a tensor computed in place: not dead.
      const bool released_by_offload = tp.decision == Decision::kOffload && r == 0;
      if (!released_by_offload && !tp.residency[r].handed_on) {
        p.dies_at[tp.residency[r].end].push_back(tensor);
      }
    }
  }
}

}  // namespace ferry
