// Programs: everything planned for one input shape, mode and budget, indexed by step, and a cache
// that plans each once (Note [Planning ahead] in program.cc). Invariant: a published program's
// plan never changes; its pinned host copies live as long as the cache (Note [A program's life]).
#pragma once

#include <cstdint>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "device/device.h"
#include "device/host_pool.h"
#include "device/residency.h"
#include "prefetch/plan.h"
#include "trainer/exec/lower.h"
#include "trainer/exec/parameter_store.h"
#include "trainer/model/graph.h"

namespace ferry {

// Note [A program's life]
// Programs: everything planned for one input shape, mode and budget (the graph, its lowered tape,
// the memory plan), indexed by step for the executor, and a cache that plans each once: on first
// use, or ahead of it on a background thread (Note [Planning ahead] in program.cc).
// Invariant: a published program's plan never changes (only its offloads' residency state and
// its measured arena extent move while steps run); its offloads' pinned host copies are held as
// long as the cache lives.

// Builds the model's graph for a batch size, at the configured input shape.
using GraphFactory = std::function<Graph(int64_t batch)>;
// Builds the model's graph for a full input shape: (N, C, H, W) images or (N, T) tokens.
using ShapedGraphFactory = std::function<Graph(const Shape& input)>;

// An offloaded tensor's runtime state: its residency machine and its pinned host copy.
struct OffloadSlot {
  std::unique_ptr<ResidentTensor> residency;
  void* host = nullptr;
};

// Everything planned for one input shape and mode. Tensors are tape tensors of the planned tape
// unless named otherwise (Note [Three ids of a tensor] in lower.h).
struct Program {
  Graph graph;
  Lowered lowered;  // the input tape and the OpIo bindings of its steps
  MemoryPlan plan;  // its own tape: the input tape plus recompute steps
  std::vector<std::vector<size_t>> grads_written;  // per planned step
  // Per planned step: the parameters whose gradient it writes at all (first writers too).
  std::vector<std::vector<size_t>> grads_touched;
  // The plan's OffloadTiming (prefetch/plan.h) turned around, per planned step: the offloaded
  // tensors whose release_at, fetch_at, needed_at or offload_after is that step.
  std::vector<std::vector<int>> release_at, fetch_at, needed_at, offload_after;
  // Per planned step: tensors whose stretch ends there and are not offloaded (poison mode).
  std::vector<std::vector<int>> dies_at;
  // Per planned step (and one past the last): its planned start, seconds from the step's start
  // (cost model), for the transfers' deadlines.
  std::vector<double> planned_start;
  std::map<int, OffloadSlot> offloads;  // by tape tensor
  // Addresses resolved once, by TensorId: parameters, buffers and metrics; gradients of params.
  std::vector<void*> persistent;
  std::vector<float*> grads;
  // By TensorId: the parameter's index in ParameterStore::params() (-1: not a parameter).
  std::vector<int32_t> param_index;
  // By TensorId: each parameter's bf16 working copy (Note [The bf16 working copy] in
  // parameter_store.h); empty in fp32.
  std::vector<void*> working;
  // The input tensor's shape, (N, sample...): what the program is keyed by.
  Shape input;
  // Measured while steps run (the executor's thread only): one past the highest arena byte the
  // executor addressed for this program, and the steps it ran.
  mutable uint64_t arena_touched = 0;
  mutable int64_t steps_run = 0;
  // Tape steps the cost model has a measured time for, of all tape steps (the rest: FLOP model,
  // scaled by estimate_scale over all measured steps; 0 = unscaled).
  int64_t timed_steps = 0;
  double estimate_scale = 0;
  // Seconds spent planning it (graph, lowering, plan), on whichever thread did.
  double plan_seconds = 0;
};

// Plans a program per (input shape, mode, budget) and keeps it (Note [Life of an offloaded
// activation] in executor.h, step 2). get() and prepare() are called from one thread (the
// executor's); planning itself may run on background threads. The budget is the cache's current
// one (set_budget) unless a call names another: a job sharing its device (memory.share) plans
// the budget its grant moves to ahead of the switch (Note [Following a shared budget] in
// trainer/share/budget.h).
class ProgramCache {
 public:
  // `options` plans every training program (evaluation plans under kNone); its persistent bytes
  // are taken from `store`. `shaped` builds the graph for input shapes other than the
  // configured one (nullptr: only the configured shape).
  ProgramCache(Device& device, ParameterStore& store, HostPool& host_pool, GraphFactory factory,
               PlanOptions options, ShapedGraphFactory shaped = nullptr);
  // How training programs are planned when the input shape changes per step (the session sets
  // it from the config before the first program is planned).
  struct ShapeOptions {
    // Non-empty (memory.per_shape false, auto): every training program takes the decisions of
    // this input's plan (Note [One plan for every shape] in prefetch/plan.h), planned once.
    Shape static_input;
    // Budget errors name the input shape, the configured one too (data.scales).
    bool name_shapes = false;
  };
  void set_shape_options(ShapeOptions o) { shape_options_ = std::move(o); }
  // Waits for planning in flight, then returns the offloads' host copies to the pool: call only
  // when no copy is in flight.
  ~ProgramCache();
  ProgramCache(const ProgramCache&) = delete;
  ProgramCache& operator=(const ProgramCache&) = delete;

  // The program for a batch size at the configured input shape, and mode.
  Program& get(int64_t batch, bool training);
  // The program for an input shape and mode: the one prepare() made ahead, waiting for it if it
  // is still being planned, or planned here on first use (both count in waits()). ConfigError
  // naming the shape when the plan cannot meet the budget; OutOfMemoryError when the host pool
  // cannot hold its offloads.
  Program& get(const Shape& input, bool training);
  // Starts planning `input` on a background thread unless it is planned or being planned;
  // returns at once. Its errors surface at get().
  void prepare(const Shape& input, bool training) { prepare(input, training, budget_); }
  // The same within `budget` device bytes (0: unlimited) instead of the current budget.
  void prepare(const Shape& input, bool training, uint64_t budget);
  // Whether get(input, training) would return without planning or waiting.
  bool ready(const Shape& input, bool training) const { return ready(input, training, budget_); }
  bool ready(const Shape& input, bool training, uint64_t budget) const;
  // The budget get() plans and finds programs for from now on (at first the options' budget).
  // Programs of other budgets stay cached.
  void set_budget(uint64_t budget) { budget_ = budget; }
  uint64_t budget() const { return budget_; }
  // get() calls that found their program not planned yet (planned it, or waited for it).
  int64_t waits() const;
  // Every program published so far, in the order they were first used.
  std::vector<const Program*> programs() const;
  // The configured input shape for `batch` rows: (batch, sample...).
  Shape configured_input(int64_t batch) const;
  // `program`'s tape planned within `budget` (0: unlimited) with this cache's options, and no
  // program made of it: the curve of a job sharing its device. ConfigError when it cannot fit.
  MemoryPlan plan_within(const Program& program, uint64_t budget) const;

  // Keeps the named activations alive to the end of each step (read them back; tests,
  // debugging). Applies to programs planned from now on.
  void keep_alive(std::vector<std::string> names) { keep_alive_ = std::move(names); }

 private:
  struct Key {
    std::vector<int64_t> input;
    bool training;
    uint64_t budget;  // PlanOptions::budget the program is planned within
    auto operator<=>(const Key&) const = default;
  };
  struct Entry {
    std::future<std::unique_ptr<Program>> planning;  // valid while not yet published
    std::unique_ptr<Program> program;                // published: indexed, plan immutable
  };
  // The graph, its lowering and its plan: pure, safe on a background thread.
  // `graph`: the graph already built for `input`, or empty to build it here.
  // `own_decisions`: plan `input` on its own even with a static input (the static plan itself).
  std::unique_ptr<Program> plan_program(const Shape& input, bool training, uint64_t budget,
                                        std::vector<std::string> keep_alive,
                                        std::optional<Graph> graph,
                                        bool own_decisions = false) const;
  // The decisions of shape_options_.static_input's own plan within `budget`, made once per
  // budget, on whichever thread first needs them (ConfigError, not BudgetError, when that plan
  // does not fit the budget).
  std::shared_ptr<const FixedDecisions> static_decisions(
      uint64_t budget, const std::vector<std::string>& keep_alive) const;
  // The published program of `key`: waits for its planning (or plans it) and indexes it.
  Program& publish(const Key& key, std::optional<Graph> graph);
  // sample_, from a graph of the configured input (built once when not known yet).
  void learn_sample(const Graph& g);
  // Turns the plan into the per-step lists, resolves persistent addresses, and gives each
  // offloaded tensor its residency machine and host copy (on the executor's thread).
  void index_plan(Program& p);

  Device& device_;
  ParameterStore& store_;
  HostPool& host_pool_;
  GraphFactory factory_;
  ShapedGraphFactory shaped_;
  PlanOptions options_;
  uint64_t budget_ = 0;  // the current budget (set_budget); the executor's thread only
  Shape sample_;         // the configured input's shape without its batch dimension
  std::vector<std::string> keep_alive_;
  ShapeOptions shape_options_;
  mutable std::mutex static_mu_;  // guards static_, held while one is planned
  mutable std::map<uint64_t, std::shared_ptr<const FixedDecisions>> static_;  // by budget
  mutable std::mutex mu_;  // guards programs_, order_ and waits_
  std::map<Key, Entry> programs_;
  std::vector<const Program*> order_;
  int64_t waits_ = 0;
};

}  // namespace ferry
