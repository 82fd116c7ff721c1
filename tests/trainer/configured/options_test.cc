// The config's device.* and memory.workspace_limit keys reach the device options the session
// and the offline planner create kernels with (trainer/configured/options.h).
#include <gtest/gtest.h>

#include <string>

#include "common/error.h"

#include "device/device.h"
#include "trainer/config/config.h"
#include "trainer/configured/options.h"

namespace ferry {
namespace {

constexpr uint64_t kMiB = uint64_t{1} << 20;

TEST(DeviceOptions, DefaultsFollowPyTorch) {
  const DeviceOptions d = device_options(default_config());
  EXPECT_TRUE(d.cuda.conv_tf32);
  EXPECT_FALSE(d.cuda.matmul_tf32);
  EXPECT_FALSE(d.cuda.deterministic);
  EXPECT_EQ(d.cuda.algorithms, AlgorithmSearch::kTimed);
  EXPECT_EQ(d.workspace_limit, 256 * kMiB);  // 4 GiB device: the key, not budget / 8
}

TEST(DeviceOptions, KeysReachTheKernelOptions) {
  const Config c = parse_config_text(
      "device: {backend: cuda, memory: 1GiB, tf32: false, tf32_matmul: true, "
      "deterministic: true}\nmemory: {workspace_limit: 32MiB}\n");
  const DeviceOptions d = device_options(c);
  EXPECT_EQ(d.backend, Backend::kCuda);
  EXPECT_EQ(d.memory, 1024 * kMiB);
  EXPECT_FALSE(d.cuda.conv_tf32);
  EXPECT_TRUE(d.cuda.matmul_tf32);
  EXPECT_TRUE(d.cuda.deterministic);
  EXPECT_EQ(d.workspace_limit, 32 * kMiB);
}

TEST(DeviceOptions, ASharedDeviceMapsOnUse) {
  EXPECT_FALSE(device_options(default_config()).map_on_use);
  const Config c = parse_config_text(
      "device: {backend: cuda, memory: 1GiB}\nmemory: {policy: auto, share: true}\n");
  EXPECT_TRUE(device_options(c).map_on_use);
}

TEST(DeviceOptions, WorkspaceLimitIsAtMostAnEighthOfTheBudget) {
  Config c = parse_config_text("device: {memory: 1GiB}\nmemory: {budget: 200MiB}\n");
  EXPECT_EQ(device_options(c).workspace_limit, 25 * kMiB);
  c = parse_config_text("device: {memory: 64MiB}\n");  // budget = device.memory
  EXPECT_EQ(device_options(c).workspace_limit, 8 * kMiB);
}

// Issue 16, defect 1: the workspace limit is part of every convolution's algorithm choice and
// sizes cuBLAS's workspace, so in deterministic mode a tighter memory.budget must not change it
// (the offload-equivalence runs compare budgets bit for bit).
TEST(DeviceOptions, DeterministicWorkspaceLimitDoesNotDependOnTheBudget) {
  const std::string base = "device: {backend: cuda, memory: 1GiB, deterministic: true}\n";
  const DeviceOptions full = device_options(parse_config_text(base));
  const DeviceOptions tight =
      device_options(parse_config_text(base + "memory: {budget: 200MiB}\n"));
  EXPECT_EQ(tight.workspace_limit, full.workspace_limit);
  EXPECT_EQ(full.workspace_limit, 128 * kMiB);  // an eighth of device.memory
}

TEST(DeviceOptions, AlgorithmsKeyChoosesHowAlgorithmsAreChosen) {
  const Config c = parse_config_text("device: {backend: cuda, algorithms: heuristic}\n");
  EXPECT_EQ(device_options(c).cuda.algorithms, AlgorithmSearch::kHeuristic);
  EXPECT_THROW(parse_config_text("device: {algorithms: fastest}\n"), ConfigError);
}

TEST(DeviceOptions, OnlyDeterministicTimedRunsKeepTheirAlgorithmsInRunDir) {
  const std::string run = "run: {dir: /tmp/r}\n";
  const Config timed = parse_config_text(run + "device: {backend: cuda, deterministic: true}\n");
  EXPECT_EQ(conv_algorithm_file(timed, 3), "/tmp/r/conv_algorithms.rank3.txt");
  EXPECT_EQ(
      conv_algorithm_file(parse_config_text(run + "device: {backend: cuda, deterministic: true, "
                                                  "algorithms: heuristic}\n"),
                          0),
      "")
      << "heuristics repeat by themselves";
  EXPECT_EQ(conv_algorithm_file(parse_config_text(run + "device: {backend: cuda}\n"), 0), "");
  EXPECT_EQ(conv_algorithm_file(parse_config_text(run + "device: {deterministic: true}\n"), 0), "");
}

}  // namespace
}  // namespace ferry
