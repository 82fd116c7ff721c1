// The auto policy: meet the arena budget at the least predicted cost (Note [Choosing what to
// offload or recompute]). Invariant: with memory.recompute never predicted slower than without.
#include <algorithm>
#include <limits>
#include <numeric>
#include <unordered_map>

#include <fmt/format.h>

#include "common/bytes.h"
#include "common/error.h"
#include "prefetch/planner_impl.h"

namespace ferry::planner {

// Note [Choosing what to offload or recompute]
// The auto policy: meet the arena budget at the least predicted cost. Candidates are the saved
// activations; each can be offloaded (cost: the copy time the compute in its idle gap cannot
// hide) or, with memory.recompute, dropped and rebuilt (cost: the rebuild's compute time, a
// convolution's included). Cheapest bytes go first until the plan fits; then each prefetch is
// moved as early, and each release as late, as the budget allows, so copies land before they
// are needed. With memory.recompute the plan is never predicted slower than without it.

namespace {

struct Candidate {
  int tensor = -1;
  bool recompute = false;
  uint64_t bytes = 0;
  double cost = 0;  // predicted seconds added per step
  // Input-tape steps whose memory it frees (estimate); -1: from its liveness.
  int free_from = -1, free_to = -1;
};

// Cheapest seconds per byte first; among equals, the larger first.
bool cheaper(const Candidate& a, const Candidate& b) {
  const double ca = a.cost / static_cast<double>(a.bytes);
  const double cb = b.cost / static_cast<double>(b.bytes);
  if (ca != cb) return ca < cb;
  return a.bytes > b.bytes;
}

std::vector<bool> saved_mask(const Tape& input, const Liveness& live) {
  std::vector<bool> mask(input.tensors.size(), false);
  for (int t : saved_tensors(input, live, false)) mask[t] = true;
  return mask;
}

// The chains that rebuild d.dropped.
void derive_chains(const Tape& input, const Liveness& live, const std::vector<bool>& saved,
                   Decisions& d) {
  d.recompute = recompute_chains(input, live, d.dropped, saved);
}

std::vector<double> step_times(const Tape& tape, const CostModel& cost) {
  std::vector<double> t(tape.steps.size());
  for (size_t s = 0; s < t.size(); ++s) t[s] = cost.step_seconds(tape.steps[s], tape);
  return t;
}

// Candidates with their cost. `whole_copies`: an offload costs its whole round trip, as if no
// compute hid it (Note [Recompute is never slower]: when many offloads share the link, each
// one's idle gap does not hide them all).
std::vector<Candidate> candidates(const Tape& input, const Liveness& live, const PlanOptions& o,
                                  bool allow_recompute, bool whole_copies) {
  const std::vector<int> saved = saved_tensors(input, live, false);
  const std::vector<bool> saved_mask = ::ferry::planner::saved_mask(input, live);
  const std::vector<double> times = step_times(input, o.cost);
  std::vector<double> prefix(times.size() + 1, 0.0);
  std::partial_sum(times.begin(), times.end(), prefix.begin() + 1);
  std::vector<Candidate> out;
  for (int t : saved) {
    const TensorLiveness& tl = live.tensors[t];
    const uint64_t bytes = input.tensors[t].bytes;
    if (bytes < 4096 || tl.first_backward_use - tl.last_forward_use < 2) continue;
    const double gap =
        prefix[tl.first_backward_use] - prefix[static_cast<size_t>(tl.last_forward_use) + 1];
    const double copy = o.cost.round_trip_seconds(bytes);
    Candidate c{t, false, bytes, whole_copies ? copy : std::max(0.0, copy - gap)};
    if (allow_recompute) {
      // Alone, from kept (or fetched) inputs: the steps its rebuild adds. Chains of several
      // dropped tensors run each step once (recompute_chains), so these costs add up.
      const RecomputeChain chain = recompute_chain(input, live, t, saved_mask);
      if (!chain.steps.empty()) {
        double rebuild = 0;
        for (int s : chain.steps) rebuild += times[s];
        if (rebuild < c.cost) {
          c.recompute = true;
          c.cost = rebuild;
        }
      }
    }
    out.push_back(c);
  }
  // Gradients that wait across a stretch of backward (a residual block's skip gradient) can be
  // offloaded over their idle gap too.
  const Materialized plain = materialize(input, live, {});
  for (int t = 0; t < static_cast<int>(input.tensors.size()); ++t) {
    if (input.tensors[t].kind != TapeTensorKind::kGradient) continue;
    const uint64_t bytes = input.tensors[t].bytes;
    const OffloadTiming gap = gap_timing(plain, t);
    if (bytes < 4096 || gap.fetch_at <= gap.release_at) continue;
    const double idle = prefix[gap.needed_at] - prefix[gap.release_at];
    Candidate c{t, false, bytes, std::max(0.0, o.cost.round_trip_seconds(bytes) - idle)};
    c.free_from = gap.release_at;
    c.free_to = gap.fetch_at - 1;
    out.push_back(std::move(c));
  }
  std::stable_sort(out.begin(), out.end(), cheaper);
  return out;
}

// Offload timings for the current decisions: vDNN's, or just-in-time fetches when `jit`.
std::vector<OffloadTiming> base_timing(const Materialized& m, const Decisions& d, bool jit) {
  std::vector<OffloadTiming> timing;
  for (int t : d.offload) {
    OffloadTiming tm = offload_timing(m, t);
    if (jit) tm.fetch_at = tm.needed_at;
    timing.push_back(tm);
  }
  return timing;
}

// Lays `d` out with vDNN's timings (or just-in-time fetches when `jit`) into m, timing and
// plans; true when the layout's peak is within `arena_budget`.
bool lay_out(const Tape& input, const Liveness& live, const Decisions& d, bool jit,
             uint64_t arena_budget, Materialized& m, std::vector<OffloadTiming>& timing,
             std::vector<TensorPlan>& plans) {
  m = materialize(input, live, d);
  timing = base_timing(m, d, jit);
  plans = stretches(m, d, timing);
  return layout_plans(m.tape, plans) <= arena_budget;
}

// Moves fetches earlier and releases later, within `limit` live bytes per step, toward the
// points where the cost model says the copies are hidden.
std::vector<OffloadTiming> relax(const Materialized& m, const Decisions& d,
                                 std::vector<OffloadTiming> timing, const CostModel& cost,
                                 uint64_t limit) {
  std::vector<TensorPlan> plans = stretches(m, d, timing);
  std::vector<uint64_t> live = live_bytes(m.tape, plans);
  const std::vector<double> times = step_times(m.tape, cost);
  std::vector<size_t> order(d.offload.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return plans[d.offload[a]].needed_at < plans[d.offload[b]].needed_at;
  });
  for (size_t i : order) {
    const int t = d.offload[i];
    const TensorPlan& p = plans[t];
    const uint64_t size = arena_aligned(m.tape.tensors[t].bytes);
    const uint64_t bytes = m.tape.tensors[t].bytes;
    const double copy_in = cost.transfer_seconds(bytes, /*to_host=*/false);
    const double copy_out = cost.transfer_seconds(bytes, /*to_host=*/true);
    // Fetch: as early as needed to land before needed_at, as the budget allows.
    double ahead = 0;
    int want = p.needed_at;
    while (want - 1 > m.live.forward_end + 1 && ahead < copy_in) ahead += times[--want];
    OffloadTiming& tm = timing[i];
    for (int g = tm.fetch_at - 1; g >= want && g > tm.release_at; --g) {
      if (live[g] + size > limit) break;
      live[g] += size;
      tm.fetch_at = g;
    }
    // Release: late enough for the copy to finish, as the budget allows.
    double behind = 0;
    int until = p.offload_after + 1;
    while (until < tm.fetch_at - 1 && behind < copy_out) behind += times[until++];
    for (int g = tm.release_at; g < until && g + 1 < tm.fetch_at; ++g) {
      if (live[g] + size > limit) break;
      live[g] += size;
      tm.release_at = g + 1;
    }
  }
  return timing;
}

// Takes candidates cheapest bytes first, estimated on the input tape's live bytes, until the
// real layout fits. True when it does.
template <typename Fits>
bool greedy(const Tape& input, const Liveness& live, const PlanOptions& o, uint64_t arena_budget,
            bool allow_recompute, bool whole_copies, Decisions& d, Fits& fits) {
  d = {};
  std::vector<TensorPlan> none = stretches(materialize(input, live, d), d, {});
  std::vector<uint64_t> estimate = live_bytes(input, none);
  std::vector<bool> taken(input.tensors.size(), false);
  const std::vector<bool> saved = saved_mask(input, live);
  const std::vector<Candidate> all = candidates(input, live, o, allow_recompute, whole_copies);
  for (size_t i = 0; i < all.size(); ++i) {
    const Candidate& c = all[i];
    const TensorLiveness& tl = live.tensors[c.tensor];
    if (taken[c.tensor]) continue;
    int free_from = tl.last_forward_use + 1, free_to = tl.first_backward_use - 1;
    if (c.free_from >= 0) {
      free_from = c.free_from;
      free_to = c.free_to + 1;  // offloads below take one step off for the early fetch
    }
    if (c.recompute) {
      d.dropped.push_back(c.tensor);
    } else {
      d.offload.push_back(c.tensor);
      free_to -= 1;  // fetched one step ahead
    }
    taken[c.tensor] = true;
    const uint64_t size = arena_aligned(c.bytes);
    for (int s = free_from; s <= free_to; ++s) estimate[s] -= size;
    const bool last = i + 1 == all.size();
    if (*std::max_element(estimate.begin(), estimate.end()) <= arena_budget || last) {
      derive_chains(input, live, saved, d);
      if (fits(false) || fits(true)) return true;
    }
  }
  return false;
}

// Fetch early and release late where the budget leaves room; keep the layout within budget by
// shrinking the allowance by what fragmentation costs. False when even the tight timing does
// not fit.
bool settle(const Tape& input, const Liveness& live, const PlanOptions& o, uint64_t arena_budget,
            const Decisions& d, Materialized& m, std::vector<OffloadTiming>& timing,
            std::vector<TensorPlan>& plans) {
  m = materialize(input, live, d);
  std::vector<OffloadTiming> tight;
  for (bool jit : {false, true}) {
    tight = base_timing(m, d, jit);
    plans = stretches(m, d, tight);
    if (layout_plans(m.tape, plans) <= arena_budget) break;
    if (jit) return false;
  }
  uint64_t limit = arena_budget;
  for (int attempt = 0; attempt < 5; ++attempt) {
    timing = relax(m, d, tight, o.cost, limit);
    plans = stretches(m, d, timing);
    const uint64_t arena = layout_plans(m.tape, plans);
    if (arena <= arena_budget) return true;
    const uint64_t excess = arena - arena_budget;
    if (excess >= limit) break;
    limit -= excess;
  }
  // Fragmentation did not shrink by the excess: search the largest allowance that lays out
  // within budget (an allowance of 0 is the tight timing, which does).
  uint64_t lo = 0, hi = limit;
  std::vector<OffloadTiming> best = tight;
  for (int probe = 0; probe < 10 && hi - lo > (1u << 20); ++probe) {
    const uint64_t mid = lo + (hi - lo) / 2;
    std::vector<OffloadTiming> trial = relax(m, d, tight, o.cost, mid);
    plans = stretches(m, d, trial);
    if (layout_plans(m.tape, plans) <= arena_budget) {
      lo = mid;
      best = std::move(trial);
    } else {
      hi = mid;
    }
  }
  timing = std::move(best);
  plans = stretches(m, d, timing);
  layout_plans(m.tape, plans);
  return true;
}

// The cost model's prediction of a planned tape with these offloads.
Prediction predicted(const Materialized& m, const std::vector<TensorPlan>& plans,
                     const CostModel& cost) {
  std::vector<SimTransfer> transfers;
  for (size_t t = 0; t < plans.size(); ++t) {
    const TensorPlan& tp = plans[t];
    if (tp.decision != Decision::kOffload) continue;
    const uint64_t bytes = m.tape.tensors[t].bytes;
    transfers.push_back({true, bytes, tp.offload_after, tp.release_at});
    transfers.push_back({false, bytes, tp.fetch_at - 1, tp.needed_at});
  }
  return simulate(m.tape, cost, transfers);
}

// Note [Keeping what a shared link cannot hide]
// The greedy takes candidates by their cost alone, each as if it had the link to itself, and
// stops only once the layout fits, so it often moves more than the budget needs. Where copies
// are hidden that costs nothing; on a link shared with other GPUs it is the step time. So the
// contention-aware planner (keep_unhidden) tries to keep each offloaded tensor resident again,
// largest first, and keeps it whenever the plan still fits and the cost model, at the
// bandwidth this GPU gets, predicts a faster step.
void keep_unhidden(const Tape& input, const Liveness& live, const PlanOptions& o,
                   uint64_t arena_budget, Decisions& d, Materialized& m,
                   std::vector<OffloadTiming>& timing, std::vector<TensorPlan>& plans) {
  const Prediction first = predicted(m, plans, o.cost);
  double best = first.step_seconds, stall = first.stall_seconds;
  std::vector<int> order = d.offload;
  std::stable_sort(order.begin(), order.end(),
                   [&](int a, int b) { return input.tensors[a].bytes > input.tensors[b].bytes; });
  constexpr size_t kTries = 96;  // bounds planning time on deep networks
  const auto try_decisions = [&](Decisions trial) {
    Materialized tm;
    std::vector<OffloadTiming> tt;
    std::vector<TensorPlan> tp;
    if (!settle(input, live, o, arena_budget, trial, tm, tt, tp)) return false;
    const Prediction p = predicted(tm, tp, o.cost);
    if (!(p.step_seconds < best * (1 - 1e-9))) return false;
    best = p.step_seconds;
    stall = p.stall_seconds;
    d = std::move(trial);
    m = std::move(tm);
    timing = std::move(tt);
    plans = std::move(tp);
    return true;
  };
  // Keep resident, or (with memory.recompute) rebuild instead of copying.
  const std::vector<bool> saved = saved_mask(input, live);
  for (size_t i = 0; i < order.size() && i < kTries; ++i) {
    // Without a stall no move can win: keeping a copy resident leaves the compute as it is,
    // rebuilding adds to it.
    if (stall <= 0) break;
    Decisions trial = d;
    trial.offload.erase(std::find(trial.offload.begin(), trial.offload.end(), order[i]));
    if (try_decisions(trial) || !o.recompute) continue;
    if (recompute_chain(input, live, order[i], saved).steps.empty()) continue;
    trial.dropped.push_back(order[i]);
    derive_chains(input, live, saved, trial);
    try_decisions(trial);
  }
}

// Note [Copies the link cannot hide]
// The greedy prices each copy by what its own idle gap cannot hide, as if it had the link to
// itself. When the link is slow against compute (a CPU's paced link, PCIe against a fast GPU on
// a small model, a new shape whose geometry was estimated), the copies it takes queue behind one
// another and the settled plan stalls, though rebuilding some of them or keeping them resident
// would cost less. Then the plan is reconsidered as a contention-aware one is (keep_unhidden),
// each of auto's plans (offload only, and with recompute) with what its own rule allows.
// Reconsidering costs up to kTries layouts, so it runs only on a plan that stalls, and only
// while it can still win: it never lowers a plan's compute (it keeps copies resident or rebuilds
// them, and removes no rebuild), so a plan whose compute alone is no faster than the best step
// so far is passed over, cheapest compute first. The plan kept is the one the reconsidering of
// every plan would have kept.
bool stalls_on_copies(const Prediction& p) {
  constexpr double kStallShare = 0.02;
  return p.stall_seconds > kStallShare * p.step_seconds;
}

// One auto plan: the greedy (recomputing where `recompute`), settled, then (keep_unhidden) the
// copies the link cannot hide reconsidered. False when the greedy cannot fit the budget; then
// `d`, `m` and `plans` hold the tightest plan it tried.
bool plan_once(const Tape& input, const Liveness& live, const PlanOptions& o, uint64_t arena_budget,
               bool recompute, bool whole_copies, Decisions& d, Materialized& m,
               std::vector<OffloadTiming>& timing, std::vector<TensorPlan>& plans) {
  const auto fits = [&](bool jit) {
    return lay_out(input, live, d, jit, arena_budget, m, timing, plans);
  };
  if (!greedy(input, live, o, arena_budget, recompute, whole_copies, d, fits)) return false;
  settle(input, live, o, arena_budget, d, m, timing, plans);
  if (o.keep_unhidden) {
    PlanOptions po = o;
    po.recompute = recompute;
    keep_unhidden(input, live, po, arena_budget, d, m, timing, plans);
  }
  return true;
}

}  // namespace

void plan_auto(const Tape& input, const Liveness& live, const PlanOptions& o, uint64_t arena_budget,
               Decisions& d, Materialized& m, std::vector<OffloadTiming>& timing,
               std::vector<TensorPlan>& plans) {
  const auto fits = [&](bool jit) {
    return lay_out(input, live, d, jit, arena_budget, m, timing, plans);
  };
  d = {};
  if (fits(false)) return;  // everything resident fits

  // Note [Recompute is never slower]
  // Recomputing keeps a chain's inputs on device and adds compute; offloading only frees the
  // most memory and may hide its copies. With memory.recompute both plans are made and the one
  // the cost model predicts faster is kept (offload only on a tie), so turning recompute on
  // never makes auto's predicted step slower, and a budget that offloading alone meets fits.
  // A third plan prices every copy at its whole round trip: where many saved tensors compete
  // for one link (a transformer's blocks each save several), the idle gap of each hides it
  // alone but not all together, and rebuilding the cheap ones (layer norms, GELU, linear
  // outputs) beats copying them; it too is kept only when predicted faster.
  struct Variant {
    bool recompute = false;
    Decisions d;
    Materialized m;
    std::vector<OffloadTiming> timing;
    std::vector<TensorPlan> plans;
    Prediction p;
  };
  std::vector<Variant> variants;  // the plans that fit, offload only first
  for (const auto& [recompute, whole_copies] :
       {std::pair{false, false}, std::pair{true, false}, std::pair{true, true}}) {
    if (recompute && !o.recompute) continue;
    Variant v{recompute, {}, {}, {}, {}, {}};
    if (!plan_once(input, live, o, arena_budget, recompute, whole_copies, v.d, v.m, v.timing,
                   v.plans)) {
      if (!recompute) {  // the tightest plan it tried: what the error below reports
        m = std::move(v.m);
        plans = std::move(v.plans);
      }
      continue;
    }
    v.p = predicted(v.m, v.plans, o.cost);
    variants.push_back(std::move(v));
  }
  if (variants.empty()) {
    // Every candidate offloaded: report what the tightest plan needs.
    const uint64_t arena = layout_plans(m.tape, plans);
    throw BudgetError(
        fmt::format("memory.policy auto cannot fit memory.budget {}: with every saved activation "
                    "{} the peak is {}",
                    format_bytes(arena_budget + o.persistent.total()),
                    o.recompute ? "offloaded or recomputed" : "offloaded",
                    format_bytes(arena + o.persistent.total())),
        fmt::format("raise memory.budget to at least {}{}, or lower data.batch_size",
                    format_bytes(arena + o.persistent.total()),
                    o.recompute ? "" : ", set memory.recompute=true"));
  }
  // Note [Copies the link cannot hide]
  if (!o.keep_unhidden) {
    std::vector<size_t> order(variants.size());
    std::iota(order.begin(), order.end(), size_t{0});
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
      return variants[a].p.compute_seconds < variants[b].p.compute_seconds;
    });
    double best = std::numeric_limits<double>::infinity();
    for (const Variant& v : variants) best = std::min(best, v.p.step_seconds);
    for (size_t i : order) {
      Variant& v = variants[i];
      if (v.p.compute_seconds >= best) break;
      if (!stalls_on_copies(v.p)) continue;
      PlanOptions po = o;
      po.recompute = v.recompute;
      keep_unhidden(input, live, po, arena_budget, v.d, v.m, v.timing, v.plans);
      v.p = predicted(v.m, v.plans, o.cost);
      best = std::min(best, v.p.step_seconds);
    }
  }
  // Offload only unless a plan with recompute is predicted faster.
  size_t keep = 0;
  for (size_t i = 1; i < variants.size(); ++i) {
    if (variants[i].p.step_seconds < variants[keep].p.step_seconds * (1 - 1e-9)) keep = i;
  }
  d = std::move(variants[keep].d);
  m = std::move(variants[keep].m);
  timing = std::move(variants[keep].timing);
  plans = std::move(variants[keep].plans);
}

void plan_fixed(const Tape& input, const Liveness& live, const PlanOptions& o,
                uint64_t arena_budget, Decisions& d, Materialized& m,
                std::vector<OffloadTiming>& timing, std::vector<TensorPlan>& plans) {
  const FixedDecisions& f = *o.fixed;
  std::unordered_map<std::string, int> by_name;  // -1: the name is not unique
  for (int t = 0; t < static_cast<int>(input.tensors.size()); ++t) {
    auto [it, fresh] = by_name.emplace(input.tensors[t].name, t);
    if (!fresh) it->second = -1;
  }
  const char* hint = "set memory.per_shape=true: a plan per input shape";
  const auto find = [&](const std::string& name) {
    const auto it = by_name.find(name);
    if (it == by_name.end() || it->second < 0) {
      throw ConfigError(fmt::format("memory.per_shape false: tensor '{}' of the plan for input {} "
                                    "is {} in this tape",
                                    name, f.from, it == by_name.end() ? "not" : "not unique"),
                        hint);
    }
    return it->second;
  };
  const std::vector<bool> saved = saved_mask(input, live);
  d = {};
  for (const std::string& name : f.offload) d.offload.push_back(find(name));
  for (const std::string& name : f.recompute) {
    const int t = find(name);
    if (!saved[t] || recompute_chain(input, live, t, saved).steps.empty()) {
      throw ConfigError(fmt::format("memory.per_shape false: tensor '{}', rebuilt by the plan for "
                                    "input {}, cannot be rebuilt in this tape",
                                    name, f.from),
                        hint);
    }
    d.dropped.push_back(t);
  }
  derive_chains(input, live, saved, d);
  if (!settle(input, live, o, arena_budget, d, m, timing, plans)) {
    throw BudgetError(
        fmt::format("memory.per_shape false: the decisions of the plan for input {} do not fit "
                    "memory.budget {} on this tape",
                    f.from, format_bytes(arena_budget + o.persistent.total())),
        hint);
  }
}

}  // namespace ferry::planner
