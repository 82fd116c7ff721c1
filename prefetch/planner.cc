// The planner: per-tensor decisions for a policy, then the arena layout of the resulting
// residency intervals.
#include <algorithm>

#include "common/error.h"
#include "prefetch/plan.h"

namespace ferry {

std::string_view policy_name(MemoryPolicy p) {
  switch (p) {
    case MemoryPolicy::kNone: return "none";
    case MemoryPolicy::kVdnnConv: return "vdnn-conv";
    case MemoryPolicy::kVdnnAll: return "vdnn-all";
    case MemoryPolicy::kAuto: return "auto";
  }
  return "?";
}

uint64_t working_set_bound(const Tape& tape, const PersistentBytes& persistent, int* step) {
  uint64_t best = 0;
  int best_step = -1;
  std::vector<int> seen;
  for (int s = 0; s < static_cast<int>(tape.steps.size()); ++s) {
    const TapeStep& st = tape.steps[static_cast<size_t>(s)];
    seen.assign(st.reads.begin(), st.reads.end());
    seen.insert(seen.end(), st.writes.begin(), st.writes.end());
    std::sort(seen.begin(), seen.end());
    seen.erase(std::unique(seen.begin(), seen.end()), seen.end());
    uint64_t bytes = 0;
    for (int t : seen) {
      bytes += (tape.tensors[static_cast<size_t>(t)].bytes + kArenaAlignment - 1) /
               kArenaAlignment * kArenaAlignment;
    }
    if (bytes > best) {
      best = bytes;
      best_step = s;
    }
  }
  if (step) *step = best_step;
  return persistent.total() + best;
}

namespace {

// Lays out every residency interval and fills the plan's byte totals.
void layout(const Tape& tape, MemoryPlan& plan) {
  std::vector<ArenaBlock> blocks;
  std::vector<std::pair<size_t, size_t>> owner;  // block -> (tensor, interval)
  for (size_t t = 0; t < plan.tensors.size(); ++t) {
    for (size_t r = 0; r < plan.tensors[t].residency.size(); ++r) {
      const Residency& res = plan.tensors[t].residency[r];
      blocks.push_back({tape.tensors[t].bytes, res.begin, res.end, 0});
      owner.emplace_back(t, r);
    }
  }
  plan.arena_bytes = layout_arena(blocks);
  FERRY_ASSERT(arena_is_valid(blocks), "arena layout overlaps live blocks");
  for (size_t b = 0; b < blocks.size(); ++b) {
    plan.tensors[owner[b].first].residency[owner[b].second].offset = blocks[b].offset;
  }
  // Split of the arena by kind, at the step where the arena is fullest.
  int last = 0;
  for (const auto& b : blocks) last = std::max(last, b.end);
  uint64_t best = 0;
  for (int s = 0; s <= last; ++s) {
    uint64_t act = 0, ws = 0, grad = 0;
    for (size_t b = 0; b < blocks.size(); ++b) {
      if (blocks[b].begin > s || blocks[b].end < s) continue;
      switch (tape.tensors[owner[b].first].kind) {
        case TapeTensorKind::kWorkspace: ws += blocks[b].bytes; break;
        case TapeTensorKind::kGradient: grad += blocks[b].bytes; break;
        default: act += blocks[b].bytes;
      }
    }
    if (act + ws + grad > best) {
      best = act + ws + grad;
      plan.activation_bytes = act;
      plan.workspace_bytes = ws;
      plan.gradient_bytes = grad;
    }
  }
}

}  // namespace

MemoryPlan plan_memory(const Tape& tape, const Liveness& live, const PlanOptions& options) {
  MemoryPlan plan;
  plan.policy = options.policy;
  plan.budget = options.budget;
  plan.persistent = options.persistent;
  plan.lower_bound = working_set_bound(tape, options.persistent, &plan.lower_bound_step);
  plan.tensors.resize(tape.tensors.size());
  for (size_t t = 0; t < tape.tensors.size(); ++t) {
    const TensorLiveness& tl = live.tensors[t];
    if (tl.produced < 0) continue;  // never written: never allocated
    plan.tensors[t].residency.push_back({tl.produced, tl.last_use, 0});
  }
  if (options.policy != MemoryPolicy::kNone) {
    throw UnsupportedError(std::string("memory.policy ") + std::string(policy_name(options.policy)) +
                           " is not implemented yet");
  }
  layout(tape, plan);
  return plan;
}

}  // namespace ferry
