// Rank placement (GPU, NUMA node, CPUs) and its application on this machine through hwloc.
#include "topology/placement.h"

#include <cstdlib>
#include <cstring>
#include <thread>

#include <gtest/gtest.h>

#include "common/error.h"
#include "tests/topology/fixtures.h"
#include "topology/binding.h"
#include "topology/hwloc_topology.h"

namespace ferry {
namespace {

using testing::real;
using testing::synthetic;

TEST(Placement, Dgx1RanksDriveTheirGpuAndSplitTheLocalCores) {
  const Topology& t = synthetic("dgx1-like.yaml");
  const auto b = place_ranks(t, 8);
  ASSERT_EQ(b.size(), 8u);
  for (int r = 0; r < 8; ++r) {
    EXPECT_EQ(b[r].local_rank, r);
    EXPECT_EQ(b[r].gpu, r);
    EXPECT_EQ(b[r].gpu_pci, t.gpus()[r].addr);
    EXPECT_EQ(b[r].numa, r / 4);
    EXPECT_EQ(b[r].cpus.size(), 10u);  // 20 cores x 2 threads over 4 ranks
  }
  EXPECT_EQ(format_index_list(b[0].cpus), "0-4,40-44");
  EXPECT_EQ(format_index_list(b[3].cpus), "15-19,55-59");
  EXPECT_EQ(format_index_list(b[4].cpus), "20-24,60-64");
  EXPECT_EQ(b[5].reason, "local to GPU5");
}

TEST(Placement, WholeNodeSharingAndExplicitGpus) {
  const Topology& t = synthetic("dgx1-like.yaml");
  PlacementOptions o;
  o.cpu_share = CpuShare::kWholeNode;
  o.gpus = {7, 2};
  const auto b = place_ranks(t, 2, o);
  EXPECT_EQ(b[0].gpu, 7);
  EXPECT_EQ(b[0].numa, 1);
  EXPECT_EQ(format_index_list(b[0].cpus), "20-39,60-79");
  EXPECT_EQ(b[1].gpu, 2);
  EXPECT_EQ(b[1].numa, 0);
}

TEST(Placement, CpuLessNodesAreNeverChosen) {
  FERRY_REQUIRE_REAL_TOPOLOGIES();
  const Topology& t = real("coral-butte-hwloc1.xml");
  const auto b = place_ranks(t, 4);
  std::vector<int> numa;
  for (const auto& x : b) {
    numa.push_back(x.numa);
    EXPECT_TRUE(t.numa(x.numa).has_cpus());
    EXPECT_FALSE(x.cpus.empty());
  }
  EXPECT_EQ(numa, (std::vector<int>{0, 0, 8, 8}));
  // CPU-backend ranks spread over the two CPU nodes only, never over the 4 HBM nodes.
  PlacementOptions cpu;
  cpu.use_gpus = false;
  for (const auto& x : place_ranks(t, 6, cpu)) {
    EXPECT_TRUE(x.numa == 0 || x.numa == 8) << x.numa;
    EXPECT_FALSE(x.gpu);
  }
}

TEST(Placement, WithoutNvidiaGpusRanksSpreadOverNumaNodes) {
  FERRY_REQUIRE_REAL_TOPOLOGIES();
  const Topology& t = real("epyc-corona.xml");  // 4 AMD GPUs, no NVIDIA one
  const auto b = place_ranks(t, 10);
  for (int r = 0; r < 10; ++r) {
    EXPECT_FALSE(b[r].gpu);
    EXPECT_FALSE(b[r].gpu_pci);
    EXPECT_EQ(b[r].numa, r % 8);
    EXPECT_EQ(b[r].reason, "no NVIDIA GPU: spread over NUMA nodes");
  }
  // Ranks 0 and 8 share NUMA 0 (6 cores x 2 threads): 3 cores each.
  EXPECT_EQ(format_index_list(b[0].cpus), "0-2,48-50");
  EXPECT_EQ(format_index_list(b[8].cpus), "3-5,51-53");
  EXPECT_EQ(format_index_list(b[2].cpus), "12-17,60-65");  // alone on NUMA 2: all of it
  const std::string table = format_bindings(b);
  EXPECT_NE(table.find("none"), std::string::npos);
  EXPECT_NE(table.find("no NVIDIA GPU"), std::string::npos);
}

TEST(Placement, MoreRanksThanCoresShareCores) {
  FERRY_REQUIRE_REAL_TOPOLOGIES();
  const Topology& t = real("nvidiaDGX2.xml");  // trimmed: 2 cores per socket
  const auto b = place_ranks(t, 8);
  EXPECT_EQ(b[0].cpus, (std::vector<int>{0}));
  EXPECT_EQ(b[1].cpus, (std::vector<int>{1}));
  EXPECT_EQ(b[2].cpus, (std::vector<int>{0}));
}

TEST(Placement, CpuBackendOnAGpuMachine) {
  const Topology& t = synthetic("dgx1-like.yaml");
  PlacementOptions o;
  o.use_gpus = false;
  const auto b = place_ranks(t, 3);
  const auto c = place_ranks(t, 3, o);
  EXPECT_TRUE(b[2].gpu);
  EXPECT_FALSE(c[2].gpu);
  EXPECT_EQ(c[1].numa, 1);
  EXPECT_EQ(c[2].numa, 0);
  EXPECT_EQ(c[1].reason, "CPU backend: spread over NUMA nodes");
}

TEST(Placement, BadRequestsAreConfigErrors) {
  const Topology& t = synthetic("dgx1-like.yaml");
  EXPECT_THROW(place_ranks(t, 9), ConfigError);
  EXPECT_THROW(place_ranks(t, 0), ConfigError);
  PlacementOptions dup;
  dup.gpus = {1, 1};
  EXPECT_THROW(place_ranks(t, 2, dup), ConfigError);
  PlacementOptions bad;
  bad.gpus = {8};
  EXPECT_THROW(place_ranks(t, 1, bad), ConfigError);
  PlacementOptions wrong_count;
  wrong_count.gpus = {0, 1};
  EXPECT_THROW(place_ranks(t, 3, wrong_count), ConfigError);
  try {
    place_ranks(t, 9);
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("only 8 NVIDIA GPUs"), std::string::npos) << e.what();
    EXPECT_NE(e.hint().find("at most 8"), std::string::npos);
  }
}

// This machine has no NVIDIA GPU: placement still works, and binding really happens.
TEST(LiveBinding, BindsAThreadToItsRankCpus) {
  const HwlocTopology live = HwlocTopology::live();
  const Topology t = live.model();
  const auto b = place_ranks(t, 2);
  for (const auto& x : b) EXPECT_TRUE(t.numa(x.numa).has_cpus());
  if (t.gpus().empty()) {
    EXPECT_FALSE(b[0].gpu);
  }
  std::vector<int> seen;
  std::string error;
  std::thread worker([&] {
    try {
      bind_thread(live, b[1]);
      seen = current_thread_cpus(live);
    } catch (const std::exception& e) {
      error = e.what();
    }
  });
  worker.join();
  ASSERT_TRUE(error.empty()) << error;
  EXPECT_EQ(seen, b[1].cpus);
}

TEST(LiveBinding, BindsAMemoryAreaToTheRankNode) {
  const HwlocTopology live = HwlocTopology::live();
  const auto b = place_ranks(live.model(), 1);
  const size_t bytes = 1 << 20;
  void* area = std::aligned_alloc(4096, bytes);
  ASSERT_NE(area, nullptr);
  bool bound = false;
  try {
    bound = bind_memory(live, area, bytes, b[0].numa);
  } catch (const LibraryError& e) {
    std::free(area);
    GTEST_SKIP() << "memory binding refused by this machine: " << e.what();
  }
  if (bound) EXPECT_EQ(area_binding(live, area, bytes), std::vector<int>{b[0].numa});
  std::memset(area, 1, bytes);
  if (bound) {
    const auto where = memory_location(live, area, bytes);
    if (!where.empty()) {
      EXPECT_EQ(where, std::vector<int>{b[0].numa});
    }
  }
  std::free(area);
  if (!bound) GTEST_SKIP() << "this OS cannot bind memory areas";
}

TEST(LiveBinding, AnAreaNeverBoundHasNoBinding) {
  const HwlocTopology live = HwlocTopology::live();
  const size_t bytes = 1 << 16;
  void* area = std::aligned_alloc(4096, bytes);
  ASSERT_NE(area, nullptr);
  EXPECT_TRUE(area_binding(live, area, bytes).empty());
  std::free(area);
}

TEST(LiveBinding, RefusesTopologiesThatAreNotThisMachine) {
  FERRY_REQUIRE_REAL_TOPOLOGIES();
  const HwlocTopology xml = HwlocTopology::from_xml(testing::real_dir() + "/cts1-pascal.xml");
  EXPECT_FALSE(xml.is_live());
  const auto b = place_ranks(xml.model(), 1);
  EXPECT_THROW(bind_thread(xml, b[0]), UnsupportedError);
  const HwlocTopology live = HwlocTopology::live();
  RankBinding impossible = b[0];
  impossible.cpus = {4000};
  EXPECT_THROW(bind_thread(live, impossible), ConfigError);
  impossible.numa = 77;
  int x = 0;
  EXPECT_THROW(bind_memory(live, &x, sizeof x, 77), ConfigError);
}

}  // namespace
}  // namespace ferry
