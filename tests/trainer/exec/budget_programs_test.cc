// Programs per budget (Note [Following a shared budget] in trainer/share/budget.h),
// through a Session of alexnet_cifar under auto: a budget prepared ahead is ready without a wait
// and cached beside the others; a switch frees the arena, the next step allocates the new plan's
// after telling the listener the bytes the device will hold; a budget run again reuses its
// program; a device holding whole granules (memory.share) tells exactly the granules it will
// hold; and training across switches gives the losses of a run that never switched, bit for bit
// (poison mode), with persistent state where it was.
#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "device/backend_traits.h"
#include "trainer/configured/model.h"
#include "trainer/session/session.h"

namespace ferry {
namespace {

Config budget_config() {
  Config c = default_config();
  c.model.name = "alexnet_cifar";
  c.data.batch_size = 8;
  c.device.memory = 1ull << 30;
  c.memory.policy = MemoryPolicy::kAuto;
  c.memory.measure = false;
  c.memory.link_gbps = 0.05;  // copies look slow: a smaller budget changes the plan
  c.memory.debug_poison = true;
  return c;
}

// One training step of a constant batch of 8 images of `input` through `e`, to its end; its loss.
float constant_step(Executor& e, const Shape& input, uint64_t step) {
  const std::vector<float> images(8 * 3 * 32 * 32, 0.25f);
  const std::vector<int32_t> labels(8, 3);
  e.enqueue({images.data(), labels.data(), 8, input}, true, step);
  return e.read_metrics().loss;
}

// Trains `budgets.size()` steps, step k within budgets[k] (0: the session's own, memory.budget);
// returns the losses. `check` sees the session after each step.
std::vector<float> train(const Config& c, const std::vector<uint64_t>& budgets,
                         const std::function<void(Session&, size_t)>& check = nullptr) {
  Session session(c, RankInfo{}, /*training=*/true);
  std::vector<float> images(8 * 3 * 32 * 32);
  std::vector<int32_t> labels(8);
  std::vector<float> losses;
  const uint64_t own = session.executor().budget();
  for (size_t k = 0; k < budgets.size(); ++k) {
    session.executor().set_budget(budgets[k] > 0 ? budgets[k] : own);
    for (size_t i = 0; i < images.size(); ++i) images[i] = float((i * 7 + k * 13) % 17) / 17.0f;
    for (size_t i = 0; i < labels.size(); ++i) labels[i] = int32_t((i + k) % 10);
    session.forward_backward({images.data(), labels.data(), 8, configured_input(c, 8)}, k + 1);
    session.reduce_gradients();
    session.update(0.01f);
    losses.push_back(session.metrics().loss);
    if (check) check(session, k);
  }
  return losses;
}

TEST(BudgetPrograms, ASwitchFreesTheArenaAndTheNextStepTellsTheBytesBeforeTakingThem) {
  const Config c = budget_config();
  Session session(c, RankInfo{}, /*training=*/true);
  Executor& e = session.executor();
  const Shape input = configured_input(c, 8);
  const Program& wide = e.program(input, true);
  const uint64_t persistent = wide.plan.persistent.total();
  const uint64_t tight = (wide.plan.lower_bound + wide.plan.peak_bytes()) / 2;
  const uint64_t own = e.budget();
  // Planned ahead within another budget: cached beside the current one, not instead of it.
  e.prepare(input, true, tight);
  for (int i = 0; i < 6000 && !e.ready(input, true, tight); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ASSERT_TRUE(e.ready(input, true, tight));
  EXPECT_TRUE(e.ready(input, true)) << "the current budget's program is still there";
  std::vector<uint64_t> told;
  e.on_arena_growth([&](uint64_t bytes) {
    told.push_back(bytes);
    EXPECT_LT(session.device().memory().stats().in_use, bytes) << "told before it is taken";
  });
  (void)constant_step(e, input, 1);
  ASSERT_EQ(told.size(), 1u);
  EXPECT_EQ(told[0], persistent + wide.plan.arena_bytes);
  EXPECT_EQ(session.device().memory().stats().in_use, told[0]);
  const int64_t waits = e.plan_waits();
  e.set_budget(tight);
  EXPECT_EQ(e.budget(), tight);
  EXPECT_EQ(session.device().memory().stats().in_use, persistent) << "the arena is freed";
  const Program& narrow = e.program(input, true);
  EXPECT_EQ(e.plan_waits(), waits) << "planned ahead";
  EXPECT_NE(&narrow, &wide);
  EXPECT_EQ(narrow.plan.budget, tight);
  EXPECT_LE(narrow.plan.peak_bytes(), tight);
  EXPECT_LT(narrow.plan.arena_bytes, wide.plan.arena_bytes);
  EXPECT_GT(narrow.plan.offload_bytes + narrow.plan.recompute_flops, 0.0) << "nothing given up";
  EXPECT_TRUE(std::isfinite(constant_step(e, input, 2))) << "a poisoned tensor was read";
  ASSERT_EQ(told.size(), 2u);
  EXPECT_EQ(told[1], narrow.plan.peak_bytes());
  EXPECT_EQ(session.device().memory().stats().in_use, narrow.plan.peak_bytes());
  // Back to the first budget: its program again, not a new one.
  e.set_budget(own);
  EXPECT_EQ(&e.program(input, true), &wide);
  EXPECT_EQ(e.programs().size(), 2u);
  e.on_arena_growth(nullptr);
}

// memory.share: the device holds whole granules (Note [Backing a heap on use] in device/heap.h),
// and the listener is told exactly what it will hold, the granules, before they are taken.
TEST(BudgetPrograms, ADeviceHoldingGranulesTellsTheGranulesItWillHold) {
  Config c = budget_config();
  c.memory.share = true;
  Session session(c, RankInfo{}, /*training=*/true);
  Executor& e = session.executor();
  const DeviceHeap& heap = session.device().memory();
  ASSERT_EQ(heap.granule(), kSharedGranule);
  const Shape input = configured_input(c, 8);
  const Program& wide = e.program(input, true);
  const uint64_t tight = (wide.plan.lower_bound + wide.plan.peak_bytes()) / 2;
  const auto granules = [](uint64_t bytes) {
    return (bytes + kSharedGranule - 1) / kSharedGranule * kSharedGranule;
  };
  std::vector<uint64_t> told;
  e.on_arena_growth([&](uint64_t bytes) {
    told.push_back(bytes);
    EXPECT_LT(heap.stats().held, bytes) << "told before it is taken";
  });
  (void)constant_step(e, input, 1);
  ASSERT_EQ(told.size(), 1u);
  // Persistent blocks from offset 0, then the arena: one run, held in whole granules.
  EXPECT_EQ(heap.stats().in_use, wide.plan.peak_bytes());
  EXPECT_EQ(told[0], granules(wide.plan.peak_bytes()));
  EXPECT_EQ(heap.stats().held, told[0]);
  e.set_budget(tight);
  EXPECT_EQ(heap.stats().held, granules(wide.plan.persistent.total())) << "the arena went back";
  (void)constant_step(e, input, 2);
  ASSERT_EQ(told.size(), 2u);
  EXPECT_EQ(told[1], granules(e.program(input, true).plan.peak_bytes()));
  EXPECT_EQ(heap.stats().held, told[1]);
  e.on_arena_growth(nullptr);
}

TEST(BudgetPrograms, TrainingAcrossSwitchesGivesTheLossesOfARunThatNeverSwitched) {
  const Config c = budget_config();
  uint64_t tight = 0;
  void* weights = nullptr;
  {
    Session probe(c, RankInfo{}, true);
    const Program& p = probe.executor().program(configured_input(c, 8), true);
    tight = (p.plan.lower_bound + p.plan.peak_bytes()) / 2;
  }
  const uint64_t wide = c.device.memory;  // what memory.budget 0 leaves
  const std::vector<float> reference = train(c, std::vector<uint64_t>(6, 0));
  const std::vector<float> switched =
      train(c, {0, tight, tight, 0, tight, 0}, [&](Session& s, size_t k) {
        const MemoryStats m = s.device().memory().stats();
        EXPECT_LE(m.in_use, k == 1 || k == 2 || k == 4 ? tight : wide) << "step " << k + 1;
        void* w = s.store().address(s.graph(), s.graph().params().front());
        if (k == 0) weights = w;
        EXPECT_EQ(w, weights) << "the weights moved at step " << k + 1;
      });
  ASSERT_EQ(switched.size(), reference.size());
  for (size_t k = 0; k < reference.size(); ++k)
    EXPECT_EQ(std::memcmp(&switched[k], &reference[k], sizeof(float)), 0) << "step " << k + 1;
}

}  // namespace
}  // namespace ferry
