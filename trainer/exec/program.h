// Programs: everything planned for one input shape and mode (the graph, its lowered tape, the
// memory plan), indexed by step for the executor, and a cache that plans each once on first use.
// Invariant: a cached program never changes; its offloads' pinned host copies are held as long as
// the cache lives.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
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

// Builds the model's graph for a batch size.
using GraphFactory = std::function<Graph(int64_t batch)>;

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
};

// Plans a program per (batch size, mode) on first use and keeps it
// (Note [Life of an offloaded activation] in executor.h, step 2).
class ProgramCache {
 public:
  // `options` plans every training program (evaluation plans under kNone); its persistent bytes
  // are taken from `store`.
  ProgramCache(Device& device, ParameterStore& store, HostPool& host_pool, GraphFactory factory,
               PlanOptions options);
  // Returns the offloads' host copies to the pool: call only when no copy is in flight.
  ~ProgramCache();
  ProgramCache(const ProgramCache&) = delete;
  ProgramCache& operator=(const ProgramCache&) = delete;

  // The program for a batch size and mode, planned on first use (ConfigError when the plan
  // cannot meet the budget; OutOfMemoryError when the host pool cannot hold its offloads).
  Program& get(int64_t batch, bool training);

  // Keeps the named activations alive to the end of each step (read them back; tests,
  // debugging). Applies to programs planned from now on.
  void keep_alive(std::vector<std::string> names) { keep_alive_ = std::move(names); }

 private:
  struct Key {
    int64_t batch;
    bool training;
    auto operator<=>(const Key&) const = default;
  };
  // Turns the plan into the per-step lists, resolves persistent addresses, and gives each
  // offloaded tensor its residency machine and host copy.
  void index_plan(Program& p);

  Device& device_;
  ParameterStore& store_;
  HostPool& host_pool_;
  GraphFactory factory_;
  PlanOptions options_;
  std::vector<std::string> keep_alive_;
  std::map<Key, std::unique_ptr<Program>> programs_;
};

}  // namespace ferry
