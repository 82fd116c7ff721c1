// Which runs the topology scheduler accepts at placement: GPU ranks (cuda) get their GPU's PCIe
// path for the link gatekeeper; CPU ranks need a described server to emulate.
#include <gtest/gtest.h>

#include <string>

#include "common/error.h"
#include "trainer/config/config.h"
#include "trainer/session/rank_placement.h"

namespace ferry {
namespace {

std::string dgx1() { return std::string(FERRY_SOURCE_DIR) + "/configs/topologies/dgx1-like.yaml"; }

TEST(LinkPlacement, CudaRanksUnderTheTopologySchedulerGetTheirGpusPath) {
  const Config c = parse_config_text(
      "model: {name: lenet5}\ndevice: {backend: cuda}\n"
      "topology: {scheduler: topology, file: " +
      dgx1() + "}\n");
  const RankPlacement p = place_this_rank(c, RankInfo{});
  ASSERT_TRUE(p.links);
  ASSERT_TRUE(p.binding.gpu.has_value());
  EXPECT_GE(p.link_ids.size(), 2u) << "a GPU's own link and the links above it";
  EXPECT_GT(p.link_gbps, 0);
}

TEST(LinkPlacement, CpuRanksWithoutADescribedServerAreRefusedNamingTheKey) {
  const Config c = parse_config_text(
      "model: {name: lenet5}\ndevice: {backend: cpu}\ntopology: {scheduler: topology}\n");
  try {
    place_this_rank(c, RankInfo{});
    FAIL() << "expected a ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("topology.scheduler"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace ferry
