// Recompute chains and their insertion into the tape.
#include "prefetch/recompute.h"

#include <algorithm>
#include <map>

namespace ferry {

RecomputeChain recompute_chain(const Tape& tape, const Liveness& live, int target,
                               const std::vector<bool>& saved, int max_steps) {
  RecomputeChain chain;
  chain.target = target;
  std::vector<int> pending = {target};
  while (!pending.empty()) {
    const int t = pending.back();
    pending.pop_back();
    const int p = live.tensors[static_cast<size_t>(t)].produced;
    if (p < 0) return {};
    const TapeStep& step = tape.steps[static_cast<size_t>(p)];
    if (step.phase != StepPhase::kForward || !step.recomputable) return {};
    if (std::find(chain.steps.begin(), chain.steps.end(), p) != chain.steps.end()) continue;
    if (static_cast<int>(chain.steps.size()) == max_steps) return {};
    chain.steps.push_back(p);
    chain.flops += step.flops;
    if (t != target) chain.temps.push_back(t);
    for (int in : step.reads) {
      const TapeTensorKind kind = tape.tensors[static_cast<size_t>(in)].kind;
      if (saved[static_cast<size_t>(in)] || kind == TapeTensorKind::kInput) continue;
      pending.push_back(in);  // not kept: rebuild it too
    }
  }
  std::sort(chain.steps.begin(), chain.steps.end());
  return chain;
}

Tape insert_recompute(const Tape& tape, const Liveness& live,
                      const std::vector<RecomputeChain>& chains, std::vector<int>& origin) {
  // Chains to insert before each input step, in the order given.
  std::map<int, std::vector<const RecomputeChain*>> before;
  for (const auto& c : chains) {
    before[live.tensors[static_cast<size_t>(c.target)].first_backward_use].push_back(&c);
  }
  Tape out;
  out.tensors = tape.tensors;
  origin.clear();
  for (int s = 0; s < static_cast<int>(tape.steps.size()); ++s) {
    if (auto it = before.find(s); it != before.end()) {
      for (const RecomputeChain* c : it->second) {
        for (int fwd : c->steps) {
          const TapeStep& f = tape.steps[static_cast<size_t>(fwd)];
          TapeStep r = f;
          r.phase = StepPhase::kRecompute;
          // It rewrites only what the chain rebuilds (not aux state), plus its workspace.
          r.writes.clear();
          for (int w : f.writes) {
            const bool rebuilt =
                w == c->target || std::find(c->temps.begin(), c->temps.end(), w) != c->temps.end();
            if (rebuilt ||
                tape.tensors[static_cast<size_t>(w)].kind == TapeTensorKind::kWorkspace) {
              r.writes.push_back(w);
            }
          }
          out.steps.push_back(std::move(r));
          origin.push_back(fwd);
        }
      }
    }
    out.steps.push_back(tape.steps[static_cast<size_t>(s)]);
    origin.push_back(s);
  }
  return out;
}

}  // namespace ferry
