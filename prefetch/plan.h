// A memory plan: for every arena tensor, whether it stays resident, is offloaded to pinned
// host memory and prefetched back, or is recomputed; where it lives in the arena during each
// interval of device residency; and the predicted peak. Made once per input shape.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "prefetch/arena.h"
#include "prefetch/liveness.h"
#include "prefetch/policy.h"
#include "prefetch/tape.h"

namespace ferry {


// Device bytes that live for the whole run, by lifetime class.
struct PersistentBytes {
  uint64_t weights = 0;
  uint64_t gradients = 0;
  uint64_t optimizer = 0;
  uint64_t buffers = 0;  // BN running statistics, metrics
  uint64_t total() const { return weights + gradients + optimizer + buffers; }
};

enum class Decision : uint8_t { kResident, kOffload, kRecompute };

// One stretch of device residency at one arena offset.
struct Residency {
  int begin = 0;
  int end = 0;
  uint64_t offset = 0;
};

struct TensorPlan {
  Decision decision = Decision::kResident;
  std::vector<Residency> residency;  // 1 interval, or 2 (before offload/drop, after fetch/recompute)
  // kOffload: the copy to host is issued after step `offload_after`; compute waits for it
  // before step `release_at` (from which the space is reused); the copy back is issued before
  // step `fetch_at` and compute waits for it before step `needed_at`.
  // kRecompute: the producer's forward runs again just before step `needed_at`.
  int offload_after = -1;
  int release_at = -1;
  int fetch_at = -1;
  int needed_at = -1;
};

struct MemoryPlan {
  MemoryPolicy policy = MemoryPolicy::kNone;
  uint64_t budget = 0;
  PersistentBytes persistent;
  uint64_t arena_bytes = 0;       // activations + gradients + workspaces, laid out
  uint64_t activation_bytes = 0;  // of the arena peak: activations, aux and inputs
  uint64_t workspace_bytes = 0;   // of the arena peak: workspaces
  uint64_t gradient_bytes = 0;    // of the arena peak: activation gradients
  uint64_t offload_bytes = 0;     // copied to host per step (= prefetched back)
  uint64_t host_bytes = 0;        // pinned host memory the offloads need
  double recompute_flops = 0;
  uint64_t lower_bound = 0;       // persistent + the largest single-step working set
  int lower_bound_step = -1;      // the step that sets it
  std::vector<TensorPlan> tensors;

  uint64_t peak_bytes() const { return persistent.total() + arena_bytes; }
};

struct PlanOptions {
  MemoryPolicy policy = MemoryPolicy::kNone;
  uint64_t budget = 0;  // device bytes the plan must fit (0 = unlimited)
  bool recompute = false;
  PersistentBytes persistent;
};

// Plans `tape`. Policies other than kNone may throw ConfigError when the budget cannot be met.
MemoryPlan plan_memory(const Tape& tape, const Liveness& live, const PlanOptions& options);

// The largest single-step working set (every tensor a step reads or writes) plus the
// persistent bytes: no plan of this tape can peak lower.
uint64_t working_set_bound(const Tape& tape, const PersistentBytes& persistent, int* step);

}  // namespace ferry
