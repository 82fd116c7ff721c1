// Mimose's static baseline (Note [One plan for every shape] in prefetch/plan.h): the decisions of
// auto's plan for resnet18_cifar at side 48 carried by name to the tapes of smaller sides. They
// are the same tensors, the plan stays within the budget, it pays where a plan of its own (all
// resident at side 24) does not, and tensors the tape lacks are refused.
#include <algorithm>
#include <set>

#include <gtest/gtest.h>

#include "common/error.h"
#include "device/cpu/cpu_kernels.h"
#include "prefetch/plan.h"
#include "trainer/exec/lower.h"
#include "trainer/exec/parameter_store.h"
#include "trainer/model/zoo/zoo.h"

namespace ferry {
namespace {

struct SideTape {
  Lowered lowered;
  PersistentBytes persistent;
};

SideTape side_tape(int64_t side) {
  static cpu::CpuKernels kernels(1);
  const Graph g = build_model("resnet18_cifar", Shape{8, 3, side, side}, 10);
  return {lower_graph(g, kernels, true), ParameterStore::plan_bytes(g, 1)};
}

PlanOptions auto_options(const SideTape& t, uint64_t budget,
                         std::shared_ptr<const FixedDecisions> fixed = nullptr) {
  PlanOptions o;
  o.policy = MemoryPolicy::kAuto;
  o.budget = budget;
  o.recompute = true;
  o.persistent = t.persistent;
  o.cost.link_gbps = 0.05;  // copies cost more than rebuilds: the plan rebuilds
  o.fixed = std::move(fixed);
  return o;
}

std::set<std::string> names(const MemoryPlan& p, Decision d) {
  std::set<std::string> out;
  for (size_t t = 0; t < p.tensors.size(); ++t) {
    if (p.tensors[t].decision == d) out.insert(p.tape.tensors[t].name);
  }
  return out;
}

std::set<std::string> dropped(const MemoryPlan& p) {
  std::set<std::string> out;
  for (int t : p.dropped) out.insert(p.tape.tensors[static_cast<size_t>(t)].name);
  return out;
}

TEST(FixedDecisions, TheLargestSidesDecisionsCarryToSmallerSidesWithinTheBudget) {
  const SideTape big = side_tape(48);
  PlanOptions none = auto_options(big, 0);
  none.policy = MemoryPolicy::kNone;
  const uint64_t unlimited = plan_memory(big.lowered.tape, none).peak_bytes();
  const uint64_t budget = unlimited - (unlimited - big.persistent.total()) / 3;
  const MemoryPlan largest = plan_memory(big.lowered.tape, auto_options(big, budget));
  ASSERT_LE(largest.peak_bytes(), budget);
  ASSERT_GT(largest.offload_bytes + largest.dropped.size(), 0u) << "side 48 has to move something";
  auto fixed = std::make_shared<const FixedDecisions>(fixed_decisions(largest, "(8, 3, 48, 48)"));
  EXPECT_EQ(fixed->offload.size(), names(largest, Decision::kOffload).size());
  EXPECT_EQ(fixed->recompute.size(), largest.dropped.size());

  // On its own tape the decisions give the same plan's choices.
  const MemoryPlan again = plan_memory(big.lowered.tape, auto_options(big, budget, fixed));
  EXPECT_EQ(names(again, Decision::kOffload), names(largest, Decision::kOffload));
  EXPECT_EQ(dropped(again), dropped(largest));
  EXPECT_LE(again.peak_bytes(), budget);

  for (int64_t side : {24, 32, 40}) {
    SCOPED_TRACE(side);
    const SideTape small = side_tape(side);
    const MemoryPlan fixed_plan =
        plan_memory(small.lowered.tape, auto_options(small, budget, fixed));
    const MemoryPlan own = plan_memory(small.lowered.tape, auto_options(small, budget));
    EXPECT_EQ(fixed_plan.policy, MemoryPolicy::kAuto);
    EXPECT_EQ(names(fixed_plan, Decision::kOffload), names(largest, Decision::kOffload));
    EXPECT_EQ(dropped(fixed_plan), dropped(largest));
    EXPECT_LE(fixed_plan.peak_bytes(), budget);
    EXPECT_LE(own.peak_bytes(), budget);
    if (side == 24) {
      // Side 24 fits with everything resident: only the static plan pays (for its rebuilds).
      EXPECT_GT(fixed_plan.recompute_flops, 0.0);
      EXPECT_EQ(own.offload_bytes, 0u);
      EXPECT_EQ(own.recompute_flops, 0.0);
      EXPECT_GT(fixed_plan.prediction.step_seconds, own.prediction.step_seconds);
    }
  }
}

TEST(FixedDecisions, ATensorTheTapeLacksIsAConfigErrorNamingTheKey) {
  const SideTape t = side_tape(32);
  auto fixed = std::make_shared<FixedDecisions>();
  fixed->from = "(8, 3, 48, 48)";
  fixed->offload = {"no.such.tensor"};
  try {
    (void)plan_memory(t.lowered.tape, auto_options(t, 0, fixed));
    FAIL() << "an unknown tensor was accepted";
  } catch (const BudgetError& e) {
    FAIL() << "not a budget problem: " << e.what();
  } catch (const ConfigError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("memory.per_shape"), std::string::npos) << what;
    EXPECT_NE(what.find("no.such.tensor"), std::string::npos) << what;
    EXPECT_NE(what.find("(8, 3, 48, 48)"), std::string::npos) << what;
  }
}

TEST(FixedDecisions, ABudgetBelowTheLowerBoundIsABudgetError) {
  const SideTape t = side_tape(32);
  EXPECT_THROW((void)plan_memory(t.lowered.tape, auto_options(t, t.persistent.total() + 1)),
               BudgetError);
}

}  // namespace
}  // namespace ferry
