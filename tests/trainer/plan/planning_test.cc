// The offline planner (trainer plan, --max-batch, the banner): a cuda plan without a GPU models
// its workspaces with stand-ins and says so.
#include "trainer/plan/planning.h"

#include <gtest/gtest.h>

#include "device/device.h"
#include "trainer/config/config.h"

namespace ferry {
namespace {

TEST(OfflinePlanner, ACudaPlanWithoutAGpuModelsTheWorkspaces) {
  const Config cpu = parse_config_text("model: {name: lenet5}\n");
  EXPECT_FALSE(OfflinePlanner(cpu).substituted());
  const Config cuda = parse_config_text("model: {name: lenet5}\ndevice: {backend: cuda}\n");
  OfflinePlanner planner(cuda);
  EXPECT_EQ(planner.substituted(), cuda_device_count() == 0);
  EXPECT_GT(planner.plan(MemoryPolicy::kNone, 8).peak_bytes(), 0u);
}

}  // namespace
}  // namespace ferry
