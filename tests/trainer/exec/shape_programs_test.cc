// Programs per input shape (Note [Planning ahead] in trainer/exec/program.cc), through a Session
// of resnet18_cifar: a shape prepared ahead is ready without a wait, one asked for cold is
// planned (and counted), each is planned once whatever the calls, a shape the budget cannot
// hold is an error naming it, and one arena as large as the largest plan serves every shape.
#include <chrono>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "common/error.h"
#include "trainer/configured/model.h"
#include "trainer/session/session.h"

namespace ferry {
namespace {

Config multi_scale_config() {
  Config c = default_config();
  c.model.name = "resnet18_cifar";
  c.data.batch_size = 2;
  c.data.samples = 64;
  c.data.scales = {16, 24, 32};
  c.device.memory = 1ull << 30;
  c.memory.measure = false;
  c.memory.debug_poison = true;
  return c;
}

void wait_ready(Executor& e, const Shape& s) {
  for (int i = 0; i < 6000 && !e.ready(s, true); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ASSERT_TRUE(e.ready(s, true)) << s.str() << " not planned within 30 s";
}

TEST(ShapePrograms, PreparedShapesAreReadyColdOnesAreCountedEachIsPlannedOnce) {
  const Config c = multi_scale_config();
  Session session(c, RankInfo{}, /*training=*/true);
  Executor& e = session.executor();
  const Shape s16 = configured_input(c, 2, 16), s24 = configured_input(c, 2, 24),
              s32 = configured_input(c, 2, 32);
  EXPECT_EQ(s32, configured_input(c, 2)) << "model.input is 32 x 32";
  const int64_t waits = e.plan_waits();
  EXPECT_FALSE(e.ready(s16, true));
  e.prepare(s16, true);
  e.prepare(s16, true);  // already in flight: nothing new
  wait_ready(e, s16);
  const Program& p16 = e.program(s16, true);
  EXPECT_EQ(e.plan_waits(), waits) << "prepared ahead: no wait";
  EXPECT_EQ(p16.input, s16);
  EXPECT_EQ(p16.graph.tensor(p16.graph.input()).desc.shape, s16);
  // Cold: planned on the caller's thread, counted.
  const Program& p24 = e.program(s24, true);
  EXPECT_EQ(e.plan_waits(), waits + 1);
  EXPECT_EQ(&e.program(s24, true), &p24) << "cached";
  EXPECT_EQ(&e.program(s16, true), &p16) << "cached";
  // The configured shape by batch size and by full shape is one program.
  const Program& by_batch = e.program(int64_t{2}, true);
  EXPECT_EQ(&e.program(s32, true), &by_batch);
  EXPECT_EQ(e.programs().size(), 3u);
  // Larger images, larger activations, same parameters.
  EXPECT_LT(p16.plan.arena_bytes, p24.plan.arena_bytes);
  EXPECT_EQ(p16.plan.persistent.total(), p24.plan.persistent.total());
}

TEST(ShapePrograms, OneArenaAsLargeAsTheLargestPlanServesEveryShape) {
  const Config c = multi_scale_config();
  Session session(c, RankInfo{}, /*training=*/true);
  Executor& e = session.executor();
  std::vector<float> images(2 * 3 * 32 * 32, 0.5f);
  std::vector<int32_t> labels{1, 2};
  uint64_t largest = 0;
  uint64_t step = 0;
  for (int64_t side : {24, 32, 16, 24, 32, 16}) {
    const Shape s = configured_input(c, 2, side);
    e.enqueue({images.data(), labels.data(), 2, s}, true, ++step);
    const float loss = e.read_metrics().loss;
    EXPECT_TRUE(std::isfinite(loss)) << "side " << side << " read a poisoned tensor";
    largest = std::max(largest, e.program(s, true).plan.arena_bytes);
    EXPECT_EQ(e.arena_bytes(), std::max<uint64_t>(largest, kArenaAlignment)) << "side " << side;
    EXPECT_LE(e.program(s, true).arena_touched, e.program(s, true).plan.arena_bytes);
  }
  for (const Program* p : e.programs()) {
    EXPECT_EQ(p->steps_run, 2) << p->input.str();
    EXPECT_EQ(p->arena_touched, p->plan.arena_bytes) << p->input.str();
  }
}

TEST(ShapePrograms, AShapeTheBudgetCannotHoldIsAnErrorNamingIt) {
  Config c = multi_scale_config();
  c.data.scales = {32, 512};
  c.memory.policy = MemoryPolicy::kAuto;
  // Enough for side 32, far too little for side 512.
  Session probe(c, RankInfo{}, true);
  c.memory.budget = probe.executor().program(int64_t{2}, true).plan.peak_bytes() + (4 << 20);
  Session session(c, RankInfo{}, true);
  const Shape big = configured_input(c, 2, 512);
  session.executor().prepare(big, true);
  try {
    (void)session.executor().program(big, true);
    ADD_FAILURE() << "side 512 planned within " << c.memory.budget;
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find(big.str()), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace ferry
