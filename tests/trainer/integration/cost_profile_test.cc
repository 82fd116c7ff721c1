// The measured cost model on the CPU backend: every step of a model's tape gets a time from
// its own kernels, the cache in the run directory is written once and reused, the planner
// takes measured times over the FLOP model (recompute steps find their forward's), and
// `trainer train` / `trainer plan --measure` report predicted against measured step time.
#include <fstream>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "device/device.h"
#include "device/kernel_timing.h"
#include "tests/trainer/integration/run_util.h"
#include "trainer/exec/lower.h"
#include "trainer/model/precision.h"
#include "trainer/model/zoo/zoo.h"
#include "trainer/plan/device_profile.h"
#include "trainer/session/session.h"

namespace ferry::testing {
namespace {

std::string quickstart() { return std::string(FERRY_SOURCE_DIR) + "/configs/quickstart.yaml"; }

std::unique_ptr<Device> cpu_device() {
  DeviceOptions d;
  d.memory = 256ull << 20;
  d.cpu.threads = 1;
  return create_device(d);
}

Config lenet_config() {
  Config c;
  c.model.name = "lenet5";
  c.model.classes = 10;
  c.model.input = {3, 32, 32};
  c.data.batch_size = 8;
  return c;
}

TEST(DeviceProfile, TimesEveryStepAndReusesItsCache) {
  auto device = cpu_device();
  const Config config = lenet_config();
  const Graph graph = build_model("lenet5", Shape{8, 3, 32, 32}, 10);
  const Lowered lowered = lower_graph(graph, device->kernels(), true);
  ProfileOptions po;
  po.cache_path = scratch("cost_profile_cache") + "/cost_profile.json";
  po.device_key = profile_device_key(*device, 0);
  EXPECT_EQ(po.device_key.rfind("cpu (", 0), 0u) << "the ordinal is not part of the key";
  EXPECT_NE(profile_device_key(*device, 2.5).find("link 2.5 GB/s"), std::string::npos);
  const uint64_t in_use = device->memory().stats().in_use;
  const KernelArgs update = update_kernel(config, 62006);

  const DeviceProfile first = measure_device(*device, graph, lowered, update, po);
  EXPECT_EQ(device->memory().stats().in_use, in_use);
  EXPECT_EQ(device->memory().stats().peak, in_use) << "measuring must not count in the peak";
  EXPECT_EQ(first.steps_total, static_cast<int>(lowered.tape.steps.size()));
  EXPECT_EQ(first.steps_measured, first.steps_total) << describe_profile(first);
  EXPECT_EQ(first.failed, 0);
  EXPECT_EQ(first.from_cache, 0);
  EXPECT_GT(first.kernels, 10);
  EXPECT_GT(first.link_gbps_to_host, 0);
  EXPECT_GT(first.link_gbps_to_device, 0);
  EXPECT_GT(first.predicted_compute_s, 0);

  std::ifstream in(po.cache_path);
  const nlohmann::json cache = nlohmann::json::parse(in);
  const nlohmann::json& mine = cache["devices"][po.device_key];
  EXPECT_EQ(mine["kernels"].size(), static_cast<size_t>(first.kernels));
  EXPECT_TRUE(mine["kernels"].contains(kernel_key(update)));
  EXPECT_TRUE(mine["links"].contains("d2h"));

  const DeviceProfile second = measure_device(*device, graph, lowered, update, po);
  EXPECT_EQ(second.from_cache, first.kernels);
  EXPECT_EQ(second.steps->seconds, first.steps->seconds) << "the cache gives back the same times";
  EXPECT_EQ(second.link_gbps_to_host, first.link_gbps_to_host);

  // Another device is another entry: nothing of the first is reused for it.
  po.device_key = "cpu:0 (some other machine)";
  const DeviceProfile other = measure_device(*device, graph, lowered, update, po);
  EXPECT_EQ(other.from_cache, 0);
}

// device.precision bf16: every step is timed with the bf16 kernels it launches, cached under keys
// of their own (an fp32 profile of the same model reuses none of them); `trainer train` plans
// with them, and its device peak is the planned one.
TEST(DeviceProfile, Bf16StepsAreTimedWithBf16KernelsAndTrainAtThePlannedPeak) {
  auto device = cpu_device();
  const Config config = lenet_config();
  Graph graph = build_model("lenet5", Shape{8, 3, 32, 32}, 10);
  apply_precision(graph, Precision::kBf16);
  const Lowered lowered = lower_graph(graph, device->kernels(), true);
  ProfileOptions po;
  po.cache_path = scratch("cost_profile_bf16") + "/cost_profile.json";
  po.device_key = profile_device_key(*device, 0);
  const KernelArgs update = update_kernel(config, 62006);
  const DeviceProfile bf16 = measure_device(*device, graph, lowered, update, po);
  EXPECT_EQ(bf16.steps_measured, bf16.steps_total) << describe_profile(bf16);
  EXPECT_EQ(bf16.failed, 0) << bf16.first_failure;
  std::ifstream in(po.cache_path);
  const nlohmann::json cache = nlohmann::json::parse(in);
  int bf16_keys = 0;
  for (const auto& [key, value] : cache["devices"][po.device_key]["kernels"].items())
    bf16_keys += key.find(" bf16=1") != std::string::npos;
  EXPECT_GT(bf16_keys, 10);
  const Graph fp32_graph = build_model("lenet5", Shape{8, 3, 32, 32}, 10);
  const Lowered fp32_lowered = lower_graph(fp32_graph, device->kernels(), true);
  const DeviceProfile fp32 = measure_device(*device, fp32_graph, fp32_lowered, update, po);
  EXPECT_LE(fp32.from_cache, 1) << "only the fp32 update kernel is shared";

  const std::string dir = scratch("cost_profile_bf16_train");
  const Exit e = run(trainer() + " train " + quickstart() + " run.dir=" + dir +
                     " run.steps=4 run.log_every=2 checkpoint.every=0 device.threads=1 "
                     "device.precision=bf16");
  ASSERT_EQ(e.code, 0) << e.output;
  EXPECT_NE(e.output.find("cost     measured on cpu:0"), std::string::npos) << e.output;
  std::ifstream summary_file(dir + "/summary.json");
  const nlohmann::json summary = nlohmann::json::parse(summary_file);
  EXPECT_EQ(summary["cost_model"], "measured");
  EXPECT_EQ(summary["cost_profile"]["steps_measured"], summary["cost_profile"]["steps"]);
  EXPECT_EQ(summary["device_peak_bytes"], summary["planned_peak_bytes"]);
}

TEST(DeviceProfile, KernelsThatDoNotFitLeaveTheirStepsToTheFlopModel) {
  DeviceOptions d;
  d.memory = 8ull << 20;
  d.cpu.threads = 1;
  auto device = create_device(d);
  const Graph graph = build_model("lenet5", Shape{512, 3, 32, 32}, 10);
  const Lowered lowered = lower_graph(graph, device->kernels(), true);
  ProfileOptions po;  // no cache
  po.device_key = profile_device_key(*device, 0);
  const DeviceProfile p = measure_device(*device, graph, lowered, std::nullopt, po);
  EXPECT_GT(p.failed, 0);
  EXPECT_NE(p.first_failure.find("out of device memory"), std::string::npos) << p.first_failure;
  EXPECT_GT(p.steps_measured, 0);
  EXPECT_LT(p.steps_measured, p.steps_total);
  EXPECT_EQ(device->memory().stats().in_use, 0u);
  CostModel cost;
  apply_profile(p, lowered.tape, cost, false);
  int fallback = 0;
  for (const TapeStep& step : lowered.tape.steps) {
    if (cost.measured_seconds(step, lowered.tape) >= 0) continue;
    ++fallback;
    EXPECT_GT(cost.step_seconds(step, lowered.tape), 0) << step.name << ": the FLOP model answers";
  }
  EXPECT_EQ(fallback, p.steps_total - p.steps_measured);
}

TEST(DeviceProfile, PlannerUsesMeasuredStepTimes) {
  auto device = cpu_device();
  const Graph graph = build_model("lenet5", Shape{8, 3, 32, 32}, 10);
  const Lowered lowered = lower_graph(graph, device->kernels(), true);
  const Tape& tape = lowered.tape;
  auto steps = std::make_shared<MeasuredSteps>();
  for (size_t s = 0; s < tape.steps.size(); ++s) {
    steps->seconds[measured_step_key(tape.steps[s], tape)] = 0.001 * static_cast<double>(s + 1);
  }
  CostModel cost;
  const TapeStep& forward = tape.steps[1];
  const double flop_time = cost.step_seconds(forward, tape);
  cost.measured = steps;
  for (size_t s = 0; s < tape.steps.size(); ++s) {
    EXPECT_DOUBLE_EQ(cost.step_seconds(tape.steps[s], tape), 0.001 * static_cast<double>(s + 1));
  }
  TapeStep recompute = forward;
  recompute.phase = StepPhase::kRecompute;
  recompute.writes.resize(1);
  EXPECT_DOUBLE_EQ(cost.step_seconds(recompute, tape), 0.002);
  // Another batch size is other work: the FLOP model answers.
  const Graph big = build_model("lenet5", Shape{16, 3, 32, 32}, 10);
  const Lowered other = lower_graph(big, device->kernels(), true);
  EXPECT_LT(cost.measured_seconds(other.tape.steps[1], other.tape), 0);
  EXPECT_GT(cost.step_seconds(other.tape.steps[1], other.tape), 0);
  EXPECT_NE(flop_time, 0.002);

  // The simulator and the prediction follow the measured times.
  PlanOptions o;
  o.policy = MemoryPolicy::kNone;
  o.cost = cost;
  const MemoryPlan plan = plan_memory(tape, o);
  const double n = static_cast<double>(tape.steps.size());
  EXPECT_NEAR(plan.prediction.compute_seconds, 0.001 * n * (n + 1) / 2, 1e-9);
}

// A profile measured on one input shape scales the FLOP model's estimates of another shape's
// steps (Note [Estimates scaled to the measured steps]): by the ratio of their kind of step, or
// over every measured step for a kind it never measured; the load step stays the link's.
TEST(DeviceProfile, EstimatesOfAnotherShapeAreScaledToTheMeasuredSteps) {
  auto device = cpu_device();
  const Lowered small =
      lower_graph(build_model("lenet5", Shape{8, 3, 32, 32}, 10), device->kernels(), true);
  const Lowered big =
      lower_graph(build_model("lenet5", Shape{16, 3, 32, 32}, 10), device->kernels(), true);
  CostModel cost;
  // Convolutions measured at 3x the FLOP model's time, linear layers never, the rest at 0.5x.
  auto steps = std::make_shared<MeasuredSteps>();
  double measured = 0, model = 0;
  for (const TapeStep& s : small.tape.steps) {
    if (s.phase == StepPhase::kLoad || s.op == "linear") continue;
    const double t = cost.flop_seconds(s, small.tape);
    const double took = t * (s.op == "conv2d" ? 3.0 : 0.5);
    steps->seconds[measured_step_key(s, small.tape)] = took;
    measured += took;
    model += t;
  }
  DeviceProfile p;
  p.steps = steps;
  apply_profile(p, small.tape, cost, /*keep_link=*/true);
  EXPECT_TRUE(steps->estimate_scale.empty()) << "the profile itself is left as it was";
  int conv = 0, linear = 0, other = 0;
  for (const TapeStep& s : big.tape.steps) {
    // The same work on either batch size (the update) keeps its measured time.
    if (const double m = cost.measured_seconds(s, big.tape); m >= 0) {
      EXPECT_EQ(cost.step_seconds(s, big.tape), m) << s.name;
      continue;
    }
    const double flop = cost.flop_seconds(s, big.tape), got = cost.step_seconds(s, big.tape);
    double want = flop;
    if (s.phase == StepPhase::kLoad) {
      want = flop;
    } else if (s.op == "conv2d") {
      want = 3.0 * flop, ++conv;
    } else if (s.op == "linear") {
      want = flop * measured / model, ++linear;
    } else {
      want = 0.5 * flop, ++other;
    }
    EXPECT_NEAR(got, want, 1e-12 * want) << s.name << " " << static_cast<int>(s.phase);
  }
  EXPECT_GT(conv, 0);
  EXPECT_GT(linear, 0);
  EXPECT_GT(other, 0);
  // Without a profile the FLOP model answers unscaled.
  const CostModel plain;
  for (const TapeStep& s : big.tape.steps) {
    EXPECT_EQ(plain.step_seconds(s, big.tape), plain.flop_seconds(s, big.tape));
  }
}

// The link rates per direction reach the transfer times.
TEST(DeviceProfile, LinkRatesPerDirection) {
  CostModel cost;
  cost.link_gbps = 10;
  EXPECT_DOUBLE_EQ(cost.transfer_seconds(1'000'000'000, true), 0.1);
  DeviceProfile p;
  p.link_gbps_to_host = 50;
  p.link_gbps_to_device = 25;
  apply_profile(p, Tape{}, cost, /*keep_link=*/false);
  EXPECT_DOUBLE_EQ(cost.transfer_seconds(1'000'000'000, true), 0.02);
  EXPECT_DOUBLE_EQ(cost.transfer_seconds(1'000'000'000, false), 0.04);
  EXPECT_DOUBLE_EQ(cost.round_trip_seconds(1'000'000'000), 0.06);
  CostModel kept;
  kept.link_gbps = 10;
  apply_profile(p, Tape{}, kept, /*keep_link=*/true);  // memory.link_gbps set: it wins
  EXPECT_DOUBLE_EQ(kept.transfer_seconds(1'000'000'000, false), 0.1);
}

TEST(DeviceProfile, TrainReportsPredictedAndMeasuredStepTimeAndReusesTheCache) {
  const std::string dir = scratch("cost_profile_train");
  const std::string cmd = trainer() + " train " + quickstart() + " run.dir=" + dir +
                          " run.steps=6 run.log_every=3 checkpoint.every=0 device.threads=1";
  const Exit first = run(cmd);
  ASSERT_EQ(first.code, 0) << first.output;
  EXPECT_NE(first.output.find("cost     measured on cpu:0"), std::string::npos) << first.output;
  EXPECT_NE(first.output.find("(0 from cache)"), std::string::npos) << first.output;
  EXPECT_NE(first.output.find("timing   step"), std::string::npos) << first.output;
  ASSERT_TRUE(std::filesystem::exists(dir + "/cost_profile.json"));
  std::ifstream in(dir + "/summary.json");
  const nlohmann::json s = nlohmann::json::parse(in);
  EXPECT_EQ(s["cost_model"], "measured");
  EXPECT_GT(s["predicted_step_s"].get<double>(), 0);
  EXPECT_GT(s["measured_step_s"].get<double>(), 0);
  // Timed per logging interval (steps 1-3, 4-6); the first interval, with its first touches,
  // is left out.
  EXPECT_EQ(s["measured_steps"].get<int>(), 3);
  EXPECT_EQ(s["cost_profile"]["steps_measured"], s["cost_profile"]["steps"]);
  std::printf("lenet5 b32 on 1 thread: predicted %.4f s, measured %.4f s per step\n",
              s["predicted_step_s"].get<double>(), s["measured_step_s"].get<double>());

  const Exit second = run(cmd);
  ASSERT_EQ(second.code, 0) << second.output;
  const int kernels = s["cost_profile"]["kernels"];
  EXPECT_NE(second.output.find(fmt::format("{} kernels ({} from cache)", kernels, kernels)),
            std::string::npos)
      << second.output;

  const Exit flops = run(trainer() + " train " + quickstart() + " run.dir=" + dir +
                         "/flops run.steps=2 checkpoint.every=0 memory.measure=false");
  ASSERT_EQ(flops.code, 0) << flops.output;
  EXPECT_NE(flops.output.find("FLOP model (memory.measure: false)"), std::string::npos);
  EXPECT_FALSE(std::filesystem::exists(dir + "/flops/cost_profile.json"));
}

TEST(DeviceProfile, PlanMeasuresWhenAskedAndSaysSo) {
  const std::string dir = scratch("cost_profile_plan");
  const std::string base = trainer() + " plan " + quickstart() + " run.dir=" + dir;
  const Exit plain = run(base);
  ASSERT_EQ(plain.code, 0) << plain.output;
  EXPECT_NE(plain.output.find("cost model: FLOP model"), std::string::npos) << plain.output;
  const Exit measured = run(base + " device.threads=1 --measure --json");
  ASSERT_EQ(measured.code, 0) << measured.output;
  const nlohmann::json j = nlohmann::json::parse(measured.output);
  EXPECT_EQ(j["cost_model"].get<std::string>().rfind("measured on cpu:0", 0), 0u) << j.dump();
  EXPECT_GT(j["policies"][0]["predicted_step_s"].get<double>(), 0);
  EXPECT_TRUE(std::filesystem::exists(dir + "/cost_profile.json"));
  // A named GPU's profile is what it plans with, and it says so; this machine is not timed.
  const Exit named = run(trainer() + " plan " + quickstart() + " run.dir=" + dir +
                         "/named --hardware h100-pcie5 --json");
  ASSERT_EQ(named.code, 0) << named.output;
  EXPECT_EQ(nlohmann::json::parse(named.output)["cost_model"].get<std::string>().rfind(
                "hardware profile h100-pcie5", 0),
            0u)
      << named.output;
  EXPECT_FALSE(std::filesystem::exists(dir + "/named/cost_profile.json"));
}

}  // namespace
}  // namespace ferry::testing
