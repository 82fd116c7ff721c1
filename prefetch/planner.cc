// The planner: policy decisions on the input tape, the planned tape with recompute steps,
// residency stretches, the arena layout, and the plan's totals and prediction.
#include <algorithm>
#include <functional>
#include <map>
#include <numeric>

#include <fmt/format.h>

#include "common/bytes.h"
#include "common/error.h"
#include "prefetch/planner_impl.h"

namespace ferry {

std::string_view policy_name(MemoryPolicy p) {
  switch (p) {
    case MemoryPolicy::kNone:
      return "none";
    case MemoryPolicy::kVdnnConv:
      return "vdnn-conv";
    case MemoryPolicy::kVdnnAll:
      return "vdnn-all";
    case MemoryPolicy::kAuto:
      return "auto";
  }
  return "?";
}

std::string_view decision_name(Decision d) {
  switch (d) {
    case Decision::kResident:
      return "resident";
    case Decision::kOffload:
      return "offload";
    case Decision::kRecompute:
      return "recompute";
  }
  return "?";
}

uint64_t working_set_bound(const Tape& tape, const PersistentBytes& persistent, int* step) {
  uint64_t best = 0;
  int best_step = -1;
  std::vector<int> seen;
  for (int s = 0; s < static_cast<int>(tape.steps.size()); ++s) {
    const TapeStep& st = tape.steps[s];
    seen.assign(st.reads.begin(), st.reads.end());
    seen.insert(seen.end(), st.writes.begin(), st.writes.end());
    std::sort(seen.begin(), seen.end());
    seen.erase(std::unique(seen.begin(), seen.end()), seen.end());
    uint64_t bytes = 0;
    for (int t : seen) bytes += arena_aligned(tape.tensors[t].bytes);
    if (bytes > best) {
      best = bytes;
      best_step = s;
    }
  }
  if (step) *step = best_step;
  return persistent.total() + best;
}

std::vector<int> saved_tensors(const Tape& tape, const Liveness& live, bool conv_inputs_only) {
  std::vector<int> out;
  for (int t = 0; t < static_cast<int>(tape.tensors.size()); ++t) {
    const TensorLiveness& tl = live.tensors[t];
    const TapeTensorKind kind = tape.tensors[t].kind;
    if (tl.produced < 0 || tl.produced > live.forward_end || tl.first_backward_use < 0) continue;
    if (kind == TapeTensorKind::kWorkspace || kind == TapeTensorKind::kGradient) continue;
    if (conv_inputs_only) {
      bool conv_input = false;
      for (int u : tl.uses) {
        const TapeStep& s = tape.steps[u];
        conv_input = conv_input || (s.phase == StepPhase::kForward && s.op == "conv2d");
      }
      if (!conv_input) continue;
    }
    out.push_back(t);
  }
  return out;
}

namespace planner {

Materialized materialize(const Tape& input, const Liveness& live, const Decisions& d) {
  Materialized m;
  m.tape = insert_recompute(input, live, d.recompute, m.origin);
  m.new_index.assign(input.steps.size(), -1);
  for (int s = 0; s < static_cast<int>(m.origin.size()); ++s) {
    if (m.tape.steps[s].phase != StepPhase::kRecompute) {
      m.new_index[m.origin[static_cast<size_t>(s)]] = s;
    }
  }
  m.live = analyse_liveness(m.tape);
  m.access.resize(m.tape.tensors.size());
  for (int s = 0; s < static_cast<int>(m.tape.steps.size()); ++s) {
    const TapeStep& st = m.tape.steps[s];
    const auto note = [&](int t, bool writes) {
      auto& a = m.access[t];
      if (!a.empty() && a.back().step == s) {
        a.back().writes = a.back().writes || writes;
      } else {
        a.push_back({s, writes});
      }
    };
    for (int t : st.reads) note(t, false);
    for (int t : st.writes) note(t, true);
  }
  m.rebuilt.assign(input.tensors.size(), false);
  for (const auto& c : d.recompute) {
    m.rebuilt[c.target] = true;
    for (int t : c.temps) m.rebuilt[t] = true;
  }
  return m;
}

OffloadTiming vdnn_timing(const Materialized& m, int t) {
  const TensorLiveness& tl = m.live.tensors[t];
  OffloadTiming timing;
  timing.offload_after = tl.produced;
  timing.release_at = tl.last_forward_use + 1;
  timing.fetch_at = std::max(tl.first_backward_use - 1, m.live.forward_end + 1);
  timing.needed_at = tl.first_backward_use;
  return timing;
}

OffloadTiming gap_timing(const Materialized& m, int t) {
  const std::vector<Access>& access = m.access[t];
  OffloadTiming best;
  int last_write = -1;
  for (size_t i = 0; i + 1 < access.size(); ++i) {
    if (access[i].writes) last_write = access[i].step;
    const int a = access[i].step, b = access[i + 1].step;
    if (last_write < 0 || b - a <= best.needed_at - best.release_at) continue;
    best = {last_write, a + 1, b - 1, b};
  }
  return best;
}

OffloadTiming offload_timing(const Materialized& m, int t) {
  const TensorLiveness& tl = m.live.tensors[t];
  const bool saved_activation = tl.produced >= 0 && tl.produced <= m.live.forward_end &&
                                tl.first_backward_use > m.live.forward_end;
  return saved_activation ? vdnn_timing(m, t) : gap_timing(m, t);
}

std::vector<TensorPlan> stretches(const Materialized& m, const Decisions& d,
                                  const std::vector<OffloadTiming>& timing) {
  const Tape& tape = m.tape;
  std::vector<TensorPlan> plans(tape.tensors.size());
  std::vector<int> offload_index(tape.tensors.size(), -1);
  for (size_t i = 0; i < d.offload.size(); ++i) offload_index[d.offload[i]] = static_cast<int>(i);
  // Steps that write each tensor by recomputing (a new life starts there).
  std::vector<std::vector<int>> rebirths(tape.tensors.size());
  for (int s = 0; s < static_cast<int>(tape.steps.size()); ++s) {
    const TapeStep& st = tape.steps[s];
    if (st.phase != StepPhase::kRecompute) continue;
    for (int w : st.writes) rebirths[w].push_back(s);
  }
  for (size_t t = 0; t < tape.tensors.size(); ++t) {
    std::vector<int> a;
    for (const Access& x : m.access[t]) a.push_back(x.step);
    if (a.empty()) continue;
    TensorPlan& p = plans[t];
    if (offload_index[t] >= 0) {
      const OffloadTiming& tm = timing[offload_index[t]];
      p.decision = Decision::kOffload;
      static_cast<OffloadTiming&>(p) = tm;
      p.residency = {{a.front(), tm.release_at - 1, 0}, {tm.fetch_at, a.back(), 0}};
      continue;
    }
    if (!rebirths[t].empty()) {
      p.decision = m.rebuilt[t] ? Decision::kRecompute : Decision::kResident;
      // A new stretch starts at each rebirth; the previous one ends at the access before it.
      const std::vector<int>& rb = rebirths[t];
      size_t next = 0;
      Residency cur{a.front(), a.front(), 0};
      for (size_t i = 1; i < a.size(); ++i) {
        while (next < rb.size() && rb[next] <= cur.begin) ++next;
        if (next < rb.size() && a[i] == rb[next]) {
          p.residency.push_back(cur);
          cur = {a[i], a[i], 0};
          ++next;
        } else {
          cur.end = a[i];
        }
      }
      p.residency.push_back(cur);
      if (p.decision == Decision::kRecompute) p.needed_at = p.residency.back().begin;
      continue;
    }
    p.residency = {{a.front(), a.back(), 0}};
  }
  return plans;
}

std::vector<uint64_t> live_bytes(const Tape& tape, const std::vector<TensorPlan>& plans) {
  std::vector<int64_t> delta(tape.steps.size() + 1, 0);
  for (size_t t = 0; t < plans.size(); ++t) {
    const auto bytes = static_cast<int64_t>(arena_aligned(tape.tensors[t].bytes));
    for (const Residency& r : plans[t].residency) {
      delta[r.begin] += bytes;
      delta[static_cast<size_t>(r.end) + 1] -= bytes;
    }
  }
  std::vector<uint64_t> live(tape.steps.size());
  int64_t running = 0;
  for (size_t s = 0; s < live.size(); ++s) {
    running += delta[s];
    live[s] = static_cast<uint64_t>(running);
  }
  return live;
}

// Note [In-place steps]
// A step that computes a tensor in place over one that dies at that step (ReLU over its input,
// a ReLU gradient over the incoming gradient) lets the two share memory: their stretches join
// one arena block. Not when the dying stretch is an offload's first one (its copy to host may
// still be reading it), nor when sizes differ; a stretch hands on or receives memory once.
uint64_t layout_plans(const Tape& tape, std::vector<TensorPlan>& plans) {
  // One node per (tensor, stretch); in-place pairs are unioned into one block.
  std::vector<std::pair<size_t, size_t>> node_of;
  std::vector<std::vector<int>> id(plans.size());
  for (size_t t = 0; t < plans.size(); ++t) {
    for (size_t r = 0; r < plans[t].residency.size(); ++r) {
      plans[t].residency[r].handed_on = false;
      id[t].push_back(static_cast<int>(node_of.size()));
      node_of.emplace_back(t, r);
    }
  }
  std::vector<int> parent(node_of.size());
  std::iota(parent.begin(), parent.end(), 0);
  const std::function<int(int)> root = [&](int x) {
    return parent[x] == x ? x : parent[x] = root(parent[x]);
  };
  std::vector<bool> receives(node_of.size(), false);
  for (int s = 0; s < static_cast<int>(tape.steps.size()); ++s) {
    for (const auto& [r, w] : tape.steps[s].alias) {
      if (tape.tensors[r].bytes != tape.tensors[w].bytes) continue;
      TensorPlan& rp = plans[r];
      const TensorPlan& wp = plans[w];
      int from = -1, to = -1;
      for (size_t i = 0; i < rp.residency.size(); ++i) {
        const bool offload_copy = rp.decision == Decision::kOffload && i == 0;
        if (rp.residency[i].end == s && !offload_copy && !rp.residency[i].handed_on)
          from = static_cast<int>(i);
      }
      for (size_t i = 0; i < wp.residency.size(); ++i) {
        if (wp.residency[i].begin == s) to = static_cast<int>(i);
      }
      if (from < 0 || to < 0) continue;
      const int a = id[r][from];
      const int b = id[w][to];
      if (receives[b] || root(a) == root(b)) continue;
      receives[b] = true;
      rp.residency[from].handed_on = true;
      parent[root(a)] = root(b);
    }
  }
  // One arena block per group, spanning its members.
  std::map<int, size_t> block_of;
  std::vector<ArenaBlock> blocks;
  for (size_t n = 0; n < node_of.size(); ++n) {
    const auto [t, r] = node_of[n];
    const Residency& res = plans[t].residency[r];
    const int g = root(static_cast<int>(n));
    auto [it, fresh] = block_of.emplace(g, blocks.size());
    if (fresh) {
      blocks.push_back({tape.tensors[t].bytes, res.begin, res.end, 0});
    } else {
      ArenaBlock& b = blocks[it->second];
      b.bytes = std::max(b.bytes, tape.tensors[t].bytes);
      b.begin = std::min(b.begin, res.begin);
      b.end = std::max(b.end, res.end);
    }
  }
  const uint64_t size = layout_arena(blocks);
  for (size_t n = 0; n < node_of.size(); ++n) {
    const auto [t, r] = node_of[n];
    plans[t].residency[r].offset = blocks[block_of.at(root(static_cast<int>(n)))].offset;
  }
  return size;
}

}  // namespace planner

FixedDecisions fixed_decisions(const MemoryPlan& plan, std::string from) {
  FixedDecisions f;
  f.from = std::move(from);
  for (size_t t = 0; t < plan.tensors.size(); ++t) {
    if (plan.tensors[t].decision == Decision::kOffload)
      f.offload.push_back(plan.tape.tensors[t].name);
  }
  for (int t : plan.dropped) f.recompute.push_back(plan.tape.tensors[t].name);
  return f;
}

std::vector<SimTransfer> plan_transfers(const MemoryPlan& plan) {
  std::vector<SimTransfer> transfers;
  for (size_t t = 0; t < plan.tensors.size(); ++t) {
    const TensorPlan& tp = plan.tensors[t];
    if (tp.decision != Decision::kOffload) continue;
    const uint64_t bytes = plan.tape.tensors[t].bytes;
    transfers.push_back({true, bytes, tp.offload_after, tp.release_at});
    transfers.push_back({false, bytes, tp.fetch_at - 1, tp.needed_at});
  }
  return transfers;
}

namespace {

using namespace planner;

// Fills totals, the kind split at the fullest step, and the prediction.
void finish(MemoryPlan& plan, const Decisions& d, const CostModel& cost) {
  const Tape& tape = plan.tape;
  const std::vector<uint64_t> live = live_bytes(tape, plan.tensors);
  size_t fullest = 0;
  for (size_t s = 0; s < live.size(); ++s) {
    if (live[s] > live[fullest]) fullest = s;
  }
  for (size_t t = 0; t < plan.tensors.size(); ++t) {
    const TensorPlan& tp = plan.tensors[t];
    for (const Residency& r : tp.residency) {
      if (r.begin > static_cast<int>(fullest) || r.end < static_cast<int>(fullest)) continue;
      const uint64_t bytes = tape.tensors[t].bytes;
      switch (tape.tensors[t].kind) {
        case TapeTensorKind::kWorkspace:
          plan.workspace_bytes += bytes;
          break;
        case TapeTensorKind::kGradient:
          plan.gradient_bytes += bytes;
          break;
        default:
          plan.activation_bytes += bytes;
      }
    }
    if (tp.decision == Decision::kOffload) plan.offload_bytes += tape.tensors[t].bytes;
  }
  plan.host_bytes = plan.offload_bytes;
  for (const auto& c : d.recompute) plan.recompute_flops += c.flops;
  plan.prediction = simulate(tape, cost, plan_transfers(plan));
}

[[noreturn]] void below_lower_bound(const Tape& tape, const PlanOptions& o, uint64_t lower_bound,
                                    int step) {
  const TapeStep& st = tape.steps[step];
  const char* phase = st.phase == StepPhase::kBackward ? "backward" : "forward";
  throw BudgetError(
      fmt::format("memory.budget {} is below the lower bound {}: the {} of '{}' ({}) alone needs "
                  "{} of activations, gradients and workspace, on top of {} of weights, "
                  "gradients and optimizer state",
                  format_bytes(o.budget), format_bytes(lower_bound), phase, st.name, st.op,
                  format_bytes(lower_bound - o.persistent.total()),
                  format_bytes(o.persistent.total())),
      fmt::format("the smallest budget that can work is {}: raise memory.budget (and "
                  "device.memory) to at least that, or lower data.batch_size",
                  format_bytes(lower_bound)));
}

}  // namespace

std::vector<uint64_t> arena_occupancy(const MemoryPlan& plan) {
  return planner::live_bytes(plan.tape, plan.tensors);
}

// Note [Life of an offloaded activation] (trainer/exec/executor.h), step 2.
MemoryPlan plan_memory(const Tape& input, const PlanOptions& o) {
  const Liveness live = analyse_liveness(input);
  MemoryPlan plan;
  plan.policy = o.policy;
  plan.budget = o.budget;
  plan.persistent = o.persistent;
  plan.lower_bound = working_set_bound(input, o.persistent, &plan.lower_bound_step);
  if (o.budget > 0 && o.budget < plan.lower_bound) {
    below_lower_bound(input, o, plan.lower_bound, plan.lower_bound_step);
  }

  Decisions d;
  Materialized m;
  std::vector<OffloadTiming> timing;
  std::vector<TensorPlan> plans;
  if (o.policy == MemoryPolicy::kAuto) {
    const uint64_t arena_budget = o.budget > 0 ? o.budget - o.persistent.total() : UINT64_MAX;
    if (o.fixed) {
      plan_fixed(input, live, o, arena_budget, d, m, timing, plans);
    } else {
      plan_auto(input, live, o, arena_budget, d, m, timing, plans);
    }
  } else {
    if (o.policy != MemoryPolicy::kNone) {
      const bool conv_only = o.policy == MemoryPolicy::kVdnnConv;
      for (int t : saved_tensors(input, live, conv_only)) {
        // vDNN moves what is worth a copy: below 4 KiB a transfer costs more than it frees.
        if (input.tensors[t].bytes >= 4096) d.offload.push_back(t);
      }
    }
    m = materialize(input, live, d);
    std::vector<int> worth;
    for (int t : d.offload) {
      const OffloadTiming tm = vdnn_timing(m, t);
      if (tm.fetch_at <= tm.release_at) continue;  // no step between: nothing to free
      worth.push_back(t);
      timing.push_back(tm);
    }
    d.offload = std::move(worth);
    plans = stretches(m, d, timing);
  }
  plan.arena_bytes = layout_plans(m.tape, plans);
  plan.tensors = std::move(plans);
  plan.tape = std::move(m.tape);
  plan.origin = std::move(m.origin);
  plan.dropped = d.dropped;
  finish(plan, d, o.cost);
  if (o.budget > 0 && plan.peak_bytes() > o.budget) {
    throw BudgetError(
        fmt::format("memory.policy {} plans a peak of {}, above memory.budget {}",
                    policy_name(o.policy), format_bytes(plan.peak_bytes()), format_bytes(o.budget)),
        fmt::format("use memory.policy=auto, raise memory.budget to {}, or lower data.batch_size",
                    format_bytes(plan.peak_bytes())));
  }
  return plan;
}

}  // namespace ferry
