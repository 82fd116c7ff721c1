// The planner's cost model on hand-built tapes whose answers are worked out by hand: a step's
// time (the slower of its FLOPs and its bytes, per-op rates, measured times), copy times per
// direction, and the step simulation's stalls when compute waits for a copy that queues FIFO on
// its own direction's stream.
#include "prefetch/cost_model.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace ferry {
namespace {

constexpr double kEps = 1e-12;

TapeStep step(StepPhase phase, const std::string& op, double flops, std::vector<int> reads = {},
              std::vector<int> writes = {}) {
  TapeStep s;
  s.phase = phase;
  s.name = op + "1";
  s.op = op;
  s.flops = flops;
  s.reads = std::move(reads);
  s.writes = std::move(writes);
  return s;
}

TapeStep forward(const std::string& op, double flops, std::vector<int> reads = {},
                 std::vector<int> writes = {}) {
  return step(StepPhase::kForward, op, flops, std::move(reads), std::move(writes));
}

// 1 GFLOP/s, 1 GB/s of memory, 1 GB/s each way on the link, no launch cost: a step of 1e6 FLOPs
// takes 1 ms, a copy of 1e6 bytes 1 ms.
CostModel slow_model() {
  CostModel c;
  c.compute_flops = 1e9;
  c.memory_gbps = 1;
  c.link_gbps = 1;
  c.step_overhead_s = 0;
  return c;
}

// Steps of 1, 2, 2, 1 and 1 ms that move no bytes (load, two forwards, two backwards).
Tape five_steps() {
  Tape t;
  t.tensors = {{"x", 0, TapeTensorKind::kInput}};
  t.steps = {step(StepPhase::kLoad, "load", 1e6, {}, {0}), forward("conv2d", 2e6, {0}),
             forward("relu", 2e6, {0}), step(StepPhase::kBackward, "relu", 1e6, {0}),
             step(StepPhase::kBackward, "conv2d", 1e6, {0})};
  return t;
}

TEST(CostModel, AStepTakesTheSlowerOfItsFlopsAndItsBytesPlusItsLaunch) {
  CostModel c = slow_model();
  c.step_overhead_s = 1e-4;
  Tape t;
  t.tensors = {{"a", 2'000'000}, {"b", 1'000'000}};
  // Reads 2 MB and writes 1 MB: 3 ms of memory against 1 ms of compute.
  EXPECT_NEAR(c.step_seconds(forward("relu", 1e6, {0}, {1}), t), 3e-3 + 1e-4, kEps);
  // 5 ms of compute against the same 3 ms of memory.
  EXPECT_NEAR(c.step_seconds(forward("relu", 5e6, {0}, {1}), t), 5e-3 + 1e-4, kEps);
}

TEST(CostModel, PerOpRatesReplaceTheDefaultsForTheirOpOnly) {
  CostModel c = slow_model();
  c.op_flops = {{"conv2d", 1e10}};
  c.op_memory_gbps = {{"batchnorm2d", 3}};
  Tape t;
  t.tensors = {{"a", 3'000'000}, {"none", 0}};
  EXPECT_NEAR(c.step_seconds(forward("conv2d", 5e7, {1}), t), 5e-3, kEps);     // at 10 GFLOP/s
  EXPECT_NEAR(c.step_seconds(forward("linear", 5e7, {1}), t), 5e-2, kEps);     // at the default
  EXPECT_NEAR(c.step_seconds(forward("batchnorm2d", 0, {0}), t), 1e-3, kEps);  // at 3 GB/s
  EXPECT_NEAR(c.step_seconds(forward("relu", 0, {0}), t), 3e-3, kEps);         // at 1 GB/s
  // A recompute step is its op: the conv2d rate again.
  EXPECT_NEAR(c.step_seconds(step(StepPhase::kRecompute, "conv2d", 5e7, {1}), t), 5e-3, kEps);
}

TEST(CostModel, AMeasuredTimeReplacesTheModelForTheSameWorkOnly) {
  Tape t;
  t.tensors = {{"x", 4096, TapeTensorKind::kInput}, {"y", 8192}, {"z", 100}};
  const TapeStep conv = forward("conv2d", 1e6, {0}, {1});
  auto measured = std::make_shared<MeasuredSteps>();
  measured->seconds[measured_step_key(conv, t)] = 0.25;
  CostModel c = slow_model();
  c.step_overhead_s = 1e-4;
  c.measured = measured;
  // Taken as measured, with no launch cost added.
  EXPECT_EQ(c.measured_seconds(conv, t), 0.25);
  EXPECT_EQ(c.step_seconds(conv, t), 0.25);
  // A recompute of that forward is the same kernels on the same shapes.
  EXPECT_EQ(c.step_seconds(step(StepPhase::kRecompute, "conv2d", 1e6, {0}, {1}), t), 0.25);
  // Its backward is other work, and so is the forward on another input size: the FLOP model.
  EXPECT_LT(c.measured_seconds(step(StepPhase::kBackward, "conv2d", 1e6, {0}, {1}), t), 0);
  EXPECT_NEAR(c.step_seconds(forward("conv2d", 1e6, {2}, {1}), t), 1e-3 + 1e-4, kEps);
  // A forward's key counts the bytes it reads, not those it writes; a load's counts both.
  EXPECT_EQ(measured_step_key(forward("conv2d", 1e6, {0}, {1}), t),
            measured_step_key(forward("conv2d", 1e6, {0}, {2}), t));
  EXPECT_NE(measured_step_key(step(StepPhase::kLoad, "load", 0, {}, {0}), t),
            measured_step_key(step(StepPhase::kLoad, "load", 0, {}, {2}), t));
  c.measured.reset();
  EXPECT_LT(c.measured_seconds(conv, t), 0);
}

TEST(CostModel, CopiesTakeTheirDirectionsRate) {
  CostModel c;
  c.link_gbps = 10;
  EXPECT_NEAR(c.transfer_seconds(1'000'000'000, true), 0.1, kEps);
  EXPECT_NEAR(c.transfer_seconds(1'000'000'000, false), 0.1, kEps);
  c.link_gbps_to_host = 20;  // measured: to host twice as fast
  EXPECT_NEAR(c.transfer_seconds(1'000'000'000, true), 0.05, kEps);
  EXPECT_NEAR(c.transfer_seconds(1'000'000'000, false), 0.1, kEps);
  EXPECT_NEAR(c.transfer_seconds(1'000'000'000), 0.1, kEps);  // the slower direction
  EXPECT_NEAR(c.round_trip_seconds(1'000'000'000), 0.15, kEps);
  c.link_gbps_to_device = 40;
  EXPECT_NEAR(c.transfer_seconds(1'000'000'000), 0.05, kEps);
}

TEST(StepSimulation, NoCopiesNoStall) {
  const Prediction p = simulate(five_steps(), slow_model(), {});
  EXPECT_NEAR(p.compute_seconds, 7e-3, kEps);
  EXPECT_NEAR(p.step_seconds, 7e-3, kEps);
  EXPECT_EQ(p.stall_seconds, 0);
}

TEST(StepSimulation, ComputeStallsUntilThePrefetchItWaitsForLands) {
  // Steps end at 1, 3, 5, 6 and 7 ms without copies. An offload of 3 ms after step 1 (3 -> 6 ms
  // on the to-host stream) is waited for by no step. A prefetch of 3 ms after step 2 (5 -> 8 ms
  // on the to-device stream, not behind the offload) is waited for before step 4, which is ready
  // at 6 ms: 2 ms of stall, and the step ends at 9 ms.
  const std::vector<SimTransfer> copies = {{true, 3'000'000, 1, -1}, {false, 3'000'000, 2, 4}};
  const Prediction p = simulate(five_steps(), slow_model(), copies);
  EXPECT_NEAR(p.compute_seconds, 7e-3, kEps);
  EXPECT_NEAR(p.stall_seconds, 2e-3, kEps);
  EXPECT_NEAR(p.step_seconds, 9e-3, kEps);
  // At a measured 3 GB/s to the device the prefetch lands at 6 ms, just in time.
  CostModel fast_up = slow_model();
  fast_up.link_gbps_to_device = 3;
  const Prediction q = simulate(five_steps(), fast_up, copies);
  EXPECT_NEAR(q.stall_seconds, 0, kEps);
  EXPECT_NEAR(q.step_seconds, 7e-3, kEps);
}

TEST(StepSimulation, CopiesOfOneDirectionQueueInTheOrderGiven) {
  // Three copies of 2 ms issued after step 0 (1 ms), all waited for before step 1: the two to the
  // device run one after the other (1 -> 3, 3 -> 5 ms), the one to the host beside them (1 ->
  // 3 ms). Step 1 starts at 5 ms: 4 ms of stall; the steps end at 11 ms.
  const std::vector<SimTransfer> copies = {
      {false, 2'000'000, 0, 1}, {true, 2'000'000, 0, 1}, {false, 2'000'000, 0, 1}};
  const Prediction p = simulate(five_steps(), slow_model(), copies);
  EXPECT_NEAR(p.stall_seconds, 4e-3, kEps);
  EXPECT_NEAR(p.step_seconds, 11e-3, kEps);
  EXPECT_NEAR(p.step_seconds, p.compute_seconds + p.stall_seconds, kEps);
}

TEST(StepSimulation, ACopyIssuedBeforeTheFirstStepOrAtItsWaitStallsForAllOfIt) {
  // issue_after -1: issued at 0 and waited for before step 0: 2 ms of stall at the start.
  // issue_after 3 but waited for before step 1: issued when step 1 is ready (at 3 ms), so step 1
  // waits for all of its 1 ms.
  const std::vector<SimTransfer> copies = {{false, 2'000'000, -1, 0}, {true, 1'000'000, 3, 1}};
  const Prediction p = simulate(five_steps(), slow_model(), copies);
  EXPECT_NEAR(p.stall_seconds, 3e-3, kEps);
  EXPECT_NEAR(p.step_seconds, 10e-3, kEps);
}

TEST(StepSimulation, ACopyIssuedAtItsWaitIsNotIssuedAgainLater) {
  // Copy A (to host, 1 ms) is due after step 3 but waited for before step 1: issued at its wait
  // (step 0 ends at 1 ms; A runs 1 -> 2 ms, 1 ms of stall), and never again. Copy B (to host,
  // 1 ms) is issued after step 3 (at 7 ms) and waited for before step 4: it runs 7 -> 8 ms. A
  // phantom re-issue of A after step 3 would hold the to-host stream 7 -> 8 ms and push B to
  // 8 -> 9 ms: 2 ms of stall instead of 1.
  const std::vector<SimTransfer> copies = {{true, 1'000'000, 3, 1}, {true, 1'000'000, 3, 4}};
  const Prediction once = simulate(five_steps(), slow_model(), {copies[0]});
  const Prediction both = simulate(five_steps(), slow_model(), copies);
  // The second copy adds exactly its own 1 ms of stall: step 3 ends, it is issued, step 4 waits.
  EXPECT_NEAR(both.stall_seconds - once.stall_seconds, 1e-3, kEps);
  EXPECT_NEAR(both.step_seconds - once.step_seconds, 1e-3, kEps);
}

}  // namespace
}  // namespace ferry
