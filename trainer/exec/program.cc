// Planning a program per shape and mode, and indexing its plan by step.
#include "trainer/exec/program.h"

#include <map>

#include <fmt/format.h>

#include "common/bytes.h"
#include "common/error.h"
#include "common/host_memory.h"

namespace ferry {

ProgramCache::ProgramCache(Device& device, ParameterStore& store, HostPool& host_pool,
                           GraphFactory factory, PlanOptions options)
    : device_(device),
      store_(store),
      host_pool_(host_pool),
      factory_(std::move(factory)),
      options_(std::move(options)) {}

ProgramCache::~ProgramCache() {
  for (auto& [key, p] : programs_) {
    for (auto& [t, slot] : p->offloads) host_pool_.release(slot.host);
  }
}

Program& ProgramCache::get(int64_t batch, bool training) {
  const Key key{batch, training};
  auto it = programs_.find(key);
  if (it != programs_.end()) return *it->second;
  auto p = std::make_unique<Program>();
  p->graph = factory_(batch);
  p->lowered = lower_graph(p->graph, device_.kernels(), training);
  // The last step reads every kept tensor, so liveness keeps it to the end.
  for (const std::string& name : keep_alive_) {
    bool found = false;
    for (size_t t = 0; t < p->lowered.tape.tensors.size(); ++t) {
      if (p->lowered.tape.tensors[t].name != name) continue;
      p->lowered.tape.steps.back().reads.push_back(static_cast<int>(t));
      found = true;
    }
    if (!found) throw ConfigError("keep_alive: no tensor named '" + name + "'");
  }
  PlanOptions options = options_;
  options.persistent = store_.bytes();
  if (!training) options.policy = MemoryPolicy::kNone;  // nothing is saved for a backward
  p->plan = plan_memory(p->lowered.tape, options);
  index_plan(*p);
  return *programs_.emplace(key, std::move(p)).first->second;
}

void ProgramCache::index_plan(Program& p) {
  p.persistent.assign(p.graph.tensors().size(), nullptr);
  for (size_t id = 0; id < p.graph.tensors().size(); ++id) {
    if (is_persistent(p.graph.tensors()[id].role)) {
      p.persistent[id] = store_.address(p.graph, static_cast<TensorId>(id));
    }
  }
  p.grads.assign(p.graph.tensors().size(), nullptr);
  for (TensorId param : p.graph.params()) {
    p.grads[static_cast<size_t>(param)] = store_.grad_address(p.graph, param);
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
    const StepBinding& b = p.lowered.bindings[static_cast<size_t>(p.plan.origin[s])];
    for (int slot : b.grad_params) {
      last_writer[store_.param_index(p.graph, persistent_id(slot))] = s;
    }
  }
  for (size_t s = 0; s < steps; ++s) {
    if (p.plan.tape.steps[s].phase != StepPhase::kBackward) continue;
    const StepBinding& b = p.lowered.bindings[static_cast<size_t>(p.plan.origin[s])];
    for (int slot : b.grad_params) {
      const size_t param = store_.param_index(p.graph, persistent_id(slot));
      if (last_writer[param] == s) p.grads_written[s].push_back(param);
    }
  }
  for (size_t t = 0; t < p.plan.tensors.size(); ++t) {
    const TensorPlan& tp = p.plan.tensors[t];
    const int tensor = static_cast<int>(t);
    if (tp.decision == Decision::kOffload) {
      // Note [Life of an offloaded activation] (executor.h), step 3: the tensor's four steps
      // become entries of the per-step lists, and it gets a residency machine and a host copy.
      p.release_at[static_cast<size_t>(tp.release_at)].push_back(tensor);
      p.fetch_at[static_cast<size_t>(tp.fetch_at)].push_back(tensor);
      p.needed_at[static_cast<size_t>(tp.needed_at)].push_back(tensor);
      p.offload_after[static_cast<size_t>(tp.offload_after)].push_back(tensor);
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
        p.dies_at[static_cast<size_t>(tp.residency[r].end)].push_back(tensor);
      }
    }
  }
}

}  // namespace ferry
