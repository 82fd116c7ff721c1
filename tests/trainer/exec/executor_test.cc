// The executor plans once per input shape: a final partial batch gets its own plan (smaller
// arena), planned once and reused; training on both shapes works with the same parameters.
#include "trainer/exec/executor.h"

#include <gtest/gtest.h>

#include "tests/trainer/golden/golden_net.h"

namespace ferry {
namespace {

std::unique_ptr<Device> cpu_device_of_256_mib() {
  DeviceOptions o;
  o.memory = 256 << 20;
  return create_device(o);
}

// The golden net's parameters, initialised, on a 256 MiB CPU device.
struct GoldenNetOnCpu {
  std::unique_ptr<Device> device = cpu_device_of_256_mib();
  Graph graph = build_golden_net(kGoldenBatch);
  ParameterStore store{*device, graph, 1};
  GoldenNetOnCpu() { store.initialize(graph, 0); }
};

TEST(Executor, EachBatchSizeIsPlannedOnceAndRunsWithItsOwnPlan) {
  GoldenNetOnCpu net;
  Device* device = net.device.get();
  ParameterStore& store = net.store;
  int built = 0;
  Executor exec(
      *device, store,
      [&](int64_t n) {
        ++built;
        return build_golden_net(n);
      },
      ExecutorOptions{});
  const Program& full = exec.program(kGoldenBatch, true);
  const Program& partial = exec.program(3, true);
  EXPECT_EQ(built, 2);
  EXPECT_EQ(&exec.program(kGoldenBatch, true), &full) << "cached, not planned again";
  EXPECT_EQ(built, 2);
  EXPECT_LT(partial.plan.arena_bytes, full.plan.arena_bytes);
  EXPECT_EQ(partial.graph.batch(), 3);
  const Program& eval = exec.program(kGoldenBatch, false);
  EXPECT_LT(eval.plan.tape.steps.size(), full.plan.tape.steps.size()) << "no backward in eval";

  std::vector<float> images(kGoldenBatch * kGoldenChannels * kGoldenSize * kGoldenSize, 0.5f);
  std::vector<int32_t> labels(kGoldenBatch, 1);
  for (int64_t n : {kGoldenBatch, int64_t{3}, kGoldenBatch}) {
    exec.enqueue({images.data(), labels.data(), n}, true, 1);
    const StepMetrics m = exec.read_metrics();
    EXPECT_TRUE(std::isfinite(m.loss));
    EXPECT_GT(m.loss, 0.0f);
  }
  EXPECT_EQ(built, 3);  // the eval program, and nothing more
}

// Issue 16: the pinned metrics ring is allocated when the executor is built, for as many steps
// as are staged between drains (run.log_every), so staging never pins memory mid-run (a
// cudaHostAlloc there may synchronise the device; it used to happen every 256 staged steps).
TEST(Executor, TheMetricsRingIsAllocatedUpFrontForTheStepsBetweenDrains) {
  GoldenNetOnCpu net;
  Device* device = net.device.get();
  ParameterStore& store = net.store;
  ExecutorOptions options;
  options.metrics_steps = 300;
  Executor exec(
      *device, store, [](int64_t n) { return build_golden_net(n); }, options);
  const size_t capacity = exec.metrics_capacity();
  EXPECT_GE(capacity, 300u) << "allocated before the first step";
  std::vector<float> images(kGoldenBatch * kGoldenChannels * kGoldenSize * kGoldenSize, 0.5f);
  std::vector<int32_t> labels(kGoldenBatch, 1);
  exec.enqueue({images.data(), labels.data(), kGoldenBatch}, true, 1);
  for (uint64_t step = 1; step <= 300; ++step) exec.stage_metrics(step);
  EXPECT_EQ(exec.metrics_capacity(), capacity) << "staging 300 steps grew the ring";
  const std::vector<StagedMetrics> staged = exec.drain_metrics();
  ASSERT_EQ(staged.size(), 300u);
  EXPECT_EQ(staged.back().step, 300u);
  EXPECT_EQ(staged.front().loss, staged.back().loss);  // the same batch's loss, staged 300 times
  EXPECT_TRUE(std::isfinite(staged.front().loss));
}

}  // namespace
}  // namespace ferry
