// The timed host update (Note [A timed host update] in trainer/plan/host_update_timing.h): a
// finite positive rate for SGD with momentum and AdamW; a device profile times it only when asked,
// keeps it in its cache per state-block count, and gives it to the cost model.
#include "trainer/plan/host_update_timing.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <fstream>

#include "tests/support/temp_dir.h"
#include "trainer/exec/lower.h"
#include "trainer/model/zoo/zoo.h"
#include "trainer/plan/device_profile.h"

namespace ferry {
namespace {

OptimizerOptions adamw() {
  OptimizerOptions o;
  o.kind = OptimizerKind::kAdamW;
  o.weight_decay = 0.1f;
  return o;
}

TEST(HostUpdateTiming, ARateForEachOptimizer) {
  for (const OptimizerOptions& o : {OptimizerOptions{}, adamw()}) {
    const double gbps = time_host_update(o, int64_t{1} << 20);
    EXPECT_TRUE(std::isfinite(gbps));
    EXPECT_GT(gbps, 0.01);
    EXPECT_LT(gbps, 10000.0) << "no host streams 10 TB/s";
  }
}

TEST(HostUpdateTiming, TheProfileTimesItWhenAskedCachesItAndTheCostModelTakesIt) {
  DeviceOptions d;
  d.memory = 256ull << 20;
  d.cpu.threads = 1;
  auto device = create_device(d);
  const Graph graph = build_model("lenet5", Shape{8, 3, 32, 32}, 10);
  const Lowered lowered = lower_graph(graph, device->kernels(), true);
  ProfileOptions po;
  const testing::TempDir dir;
  po.cache_path = dir.file("cost_profile.json");
  po.device_key = profile_device_key(*device, 0);
  const DeviceProfile plain = measure_device(*device, graph, lowered, std::nullopt, po);
  EXPECT_EQ(plain.host_update_gbps, 0);
  CostModel cost;
  apply_profile(plain, lowered.tape, cost, false);
  EXPECT_EQ(cost.host_update_gbps, CostModel{}.host_update_gbps) << "untimed: the default";

  po.host_update = adamw();
  const DeviceProfile timed = measure_device(*device, graph, lowered, std::nullopt, po);
  EXPECT_GT(timed.host_update_gbps, 0);
  std::ifstream in(po.cache_path);
  const nlohmann::json cache = nlohmann::json::parse(in);
  EXPECT_EQ(cache["devices"][po.device_key]["host_update_gbps"]["2 slots"].get<double>(),
            timed.host_update_gbps);
  const DeviceProfile again = measure_device(*device, graph, lowered, std::nullopt, po);
  EXPECT_EQ(again.host_update_gbps, timed.host_update_gbps) << "from the cache";
  apply_profile(timed, lowered.tape, cost, /*keep_link=*/true);
  EXPECT_EQ(cost.host_update_gbps, timed.host_update_gbps);
  EXPECT_NE(describe_profile(timed).find("host update"), std::string::npos);
}

}  // namespace
}  // namespace ferry
