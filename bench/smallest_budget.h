// The benchmarks' search for the smallest budget memory.policy auto accepts: one bisection shared
// by bench_plan_table and bench_precision_plan, so their columns mean the same thing.
#pragma once

#include <cstdint>

#include "trainer/config/config.h"
#include "trainer/plan/planning.h"

namespace ferry {

// The smallest budget (to 1 MiB) auto accepts, by bisection between the bound and none's peak.
inline uint64_t smallest_auto_budget(const Config& base, int64_t batch, uint64_t lower,
                                     uint64_t upper) {
  uint64_t bad = lower - 1, good = upper;
  while (good - bad > (1u << 20)) {
    const uint64_t mid = bad + (good - bad) / 2;
    Config c = base;
    c.memory.budget = mid;
    OfflinePlanner planner(c);
    (planner.fits(MemoryPolicy::kAuto, batch) ? good : bad) = mid;
  }
  return good;
}

}  // namespace ferry
