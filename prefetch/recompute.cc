// Recompute chains and their insertion into the tape.
#include "prefetch/recompute.h"

#include <algorithm>
#include <map>

#include "common/error.h"

namespace ferry {

namespace {

// The chain back from `target` to tensors for which `available` holds (and the inputs). Empty
// when a producer is not a recomputable forward step, when a tensor to rebuild is a step's aux
// state (a recompute writes scratch in its place) or an output its step cannot rebuild alone
// (TapeStep::not_rebuilt), or past `max_steps` (< 0: no limit).
template <typename Available>
RecomputeChain build_chain(const Tape& tape, const Liveness& live, int target,
                           const Available& available, int max_steps) {
  RecomputeChain chain;
  chain.target = target;
  std::vector<int> pending = {target};
  while (!pending.empty()) {
    const int t = pending.back();
    pending.pop_back();
    if (tape.tensors[t].kind == TapeTensorKind::kAux) return {};
    const int p = live.tensors[t].produced;
    if (p < 0) return {};
    const TapeStep& step = tape.steps[p];
    if (step.phase != StepPhase::kForward || !step.recomputable) return {};
    if (std::find(step.not_rebuilt.begin(), step.not_rebuilt.end(), t) != step.not_rebuilt.end())
      return {};
    if (t != target && std::find(chain.temps.begin(), chain.temps.end(), t) == chain.temps.end())
      chain.temps.push_back(t);
    if (std::find(chain.steps.begin(), chain.steps.end(), p) != chain.steps.end()) continue;
    if (static_cast<int>(chain.steps.size()) == max_steps) return {};
    chain.steps.push_back(p);
    chain.flops += step.flops;
    for (int in : step.reads) {
      const TapeTensorKind kind = tape.tensors[in].kind;
      if (kind == TapeTensorKind::kInput || available(in)) continue;
      pending.push_back(in);  // not kept: rebuild it too
    }
  }
  std::sort(chain.steps.begin(), chain.steps.end());
  return chain;
}

}  // namespace

RecomputeChain recompute_chain(const Tape& tape, const Liveness& live, int target,
                               const std::vector<bool>& saved, int max_steps) {
  return build_chain(
      tape, live, target, [&](int t) { return saved[t]; }, max_steps);
}

std::vector<RecomputeChain> recompute_chains(const Tape& tape, const Liveness& live,
                                             const std::vector<int>& dropped,
                                             const std::vector<bool>& saved) {
  std::vector<int> order = dropped;
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
    return live.tensors[a].first_backward_use < live.tensors[b].first_backward_use;
  });
  std::vector<bool> is_dropped(tape.tensors.size(), false), rebuilt(tape.tensors.size(), false);
  for (int t : dropped) is_dropped[t] = true;
  std::vector<RecomputeChain> out;
  for (int t : order) {
    if (rebuilt[t]) continue;  // an earlier chain rebuilt it
    // A dropped tensor is available once an earlier chain has rebuilt it.
    RecomputeChain chain = build_chain(
        tape, live, t, [&](int u) { return saved[u] && (!is_dropped[u] || rebuilt[u]); }, -1);
    FERRY_ASSERT(!chain.steps.empty(), "a dropped tensor that cannot be rebuilt");
    rebuilt[t] = true;
    for (int u : chain.temps) {
      if (is_dropped[u]) rebuilt[u] = true;
    }
    out.push_back(std::move(chain));
  }
  return out;
}

Tape insert_recompute(const Tape& tape, const Liveness& live,
                      const std::vector<RecomputeChain>& chains, std::vector<int>& origin) {
  // Chains to insert before each input step, in the order given.
  std::map<int, std::vector<const RecomputeChain*>> before;
  for (const auto& c : chains) {
    before[live.tensors[c.target].first_backward_use].push_back(&c);
  }
  Tape out;
  out.tensors = tape.tensors;
  origin.clear();
  for (int s = 0; s < static_cast<int>(tape.steps.size()); ++s) {
    if (auto it = before.find(s); it != before.end()) {
      for (const RecomputeChain* c : it->second) {
        for (int fwd : c->steps) {
          const TapeStep& f = tape.steps[fwd];
          TapeStep r = f;
          r.phase = StepPhase::kRecompute;
          // It rewrites only what the chain rebuilds (not aux state), plus its workspace.
          r.writes.clear();
          for (int w : f.writes) {
            const bool rebuilt =
                w == c->target || std::find(c->temps.begin(), c->temps.end(), w) != c->temps.end();
            if (rebuilt || tape.tensors[w].kind == TapeTensorKind::kWorkspace) {
              r.writes.push_back(w);
            }
          }
          out.steps.push_back(std::move(r));
          origin.push_back(fwd);
        }
      }
    }
    out.steps.push_back(tape.steps[s]);
    origin.push_back(s);
  }
  return out;
}

}  // namespace ferry
