// Where a rank runs (trainer/session/rank_placement.h): the session binds its device's pinned host
// blocks to the rank's NUMA node on the live machine, before first touch (Note [Pinned pages on a
// NUMA node] in device/host_pages.h); the topology scheduler accepts GPU ranks (cuda), given their
// GPU's PCIe path for the link gatekeeper, and CPU ranks only on a described server to emulate.
#include "trainer/session/rank_placement.h"

#include <gtest/gtest.h>

#include <sys/mman.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "common/error.h"
#include "topology/binding.h"
#include "trainer/config/config.h"
#include "trainer/session/session.h"

namespace ferry {
namespace {

// Whether this machine lets a process bind a memory area (some containers refuse).
bool can_bind_areas(const HwlocTopology& live, int numa) {
  const size_t bytes = 1 << 16;
  void* area = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  bool ok = false;
  try {
    ok = bind_memory(live, area, bytes, numa);
  } catch (const LibraryError&) {
  }
  munmap(area, bytes);
  return ok;
}

TEST(HostPlacement, TheSessionsPinnedBlocksAreBoundToTheRanksNumaNode) {
  const Config c = parse_config_text(
      "model: {name: lenet5, classes: 10, input: [3, 32, 32]}\n"
      "data: {source: synthetic, batch_size: 4, samples: 64}\n"
      "device: {backend: cpu, memory: 64MiB, threads: 1}\n");
  Session session(c, RankInfo{}, /*training=*/false);
  const RankPlacement& p = session.placement();
  ASSERT_TRUE(p.live) << "the default topology is the live machine";
  if (!can_bind_areas(*p.live, p.binding.numa)) {
    GTEST_SKIP() << "this machine refuses to bind memory areas to a NUMA node";
  }
  const uint64_t bytes = 1 << 20;
  void* block = session.device().pinned().allocate(bytes);
  const std::vector<int> bound = area_binding(*p.live, block, bytes);
  session.device().pinned().deallocate(block, bytes);
  EXPECT_EQ(bound, std::vector<int>{p.binding.numa});
}

TEST(HostPlacement, ADescribedServerLeavesPlacementToTheOs) {
  RankPlacement described;  // no live topology
  EXPECT_FALSE(host_memory_placement(described));
}

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
