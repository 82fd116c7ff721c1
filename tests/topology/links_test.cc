// Links, their bandwidths and defaults, the path of a GPU to a NUMA node's memory, and the
// groups of GPUs sharing each link.
#include "topology/links.h"

#include <cmath>

#include <gtest/gtest.h>

#include "common/error.h"
#include "tests/topology/fixtures.h"

namespace ferry {
namespace {

using testing::real;
using testing::synthetic;

std::vector<LinkKind> kinds(const LinkMap& m, const std::vector<int>& path) {
  std::vector<LinkKind> out;
  for (int id : path) out.push_back(m.link(id).kind);
  return out;
}

TEST(Links, Dgx2PathCrossesBothSwitchLevelsThenTheRootComplex) {
  FERRY_REQUIRE_REAL_TOPOLOGIES();
  const Topology& t = real("nvidiaDGX2.xml");
  const LinkMap m(t);
  const auto local = m.gpu_path(0, 0);
  EXPECT_EQ(kinds(m, local),
            (std::vector<LinkKind>{LinkKind::kGpuUplink, LinkKind::kSwitchUplink,
                                   LinkKind::kSwitchUplink, LinkKind::kRootComplex}));
  EXPECT_EQ(local[0], m.gpu_uplink(0));
  EXPECT_EQ(local[1], m.switch_uplink(t.gpus()[0].switches[0]));  // nearest switch first
  EXPECT_EQ(local[2], m.switch_uplink(t.gpus()[0].switches[1]));
  const auto remote = m.gpu_path(0, 1);
  ASSERT_EQ(remote.size(), 5u);
  EXPECT_EQ(m.link(remote.back()).kind, LinkKind::kInterSocket);
  EXPECT_EQ(remote.back(), m.inter_socket_link(0, 1));
  EXPECT_NEAR(m.bottleneck_gbps(local), 15.754, 0.001);
}

TEST(Links, Dgx2SharedLinksFollowTheSwitchTree) {
  FERRY_REQUIRE_REAL_TOPOLOGIES();
  const Topology& t = real("nvidiaDGX2.xml");
  const LinkMap m(t);
  auto shared = [&](int a, int b) {
    return LinkMap::shared(m.gpu_path(a, t.local_numa(a)), m.gpu_path(b, t.local_numa(b))).size();
  };
  EXPECT_EQ(shared(0, 1), 3u);  // inner switch, outer switch, root complex
  EXPECT_EQ(shared(0, 2), 2u);  // outer switch, root complex
  EXPECT_EQ(shared(0, 4), 0u);  // another root complex
  EXPECT_EQ(shared(0, 8), 0u);
  // Offloads to the far socket's memory meet on the inter-socket link.
  const auto s = LinkMap::shared(m.gpu_path(0, 1), m.gpu_path(8, 0));
  ASSERT_EQ(s.size(), 1u);
  EXPECT_EQ(m.link(s[0]).kind, LinkKind::kInterSocket);
}

TEST(Links, Dgx2Groups) {
  FERRY_REQUIRE_REAL_TOPOLOGIES();
  const LinkMap m(real("nvidiaDGX2.xml"));
  const auto rc = m.gpu_groups(LinkKind::kRootComplex);
  ASSERT_EQ(rc.size(), 4u);
  EXPECT_EQ(rc[1], (std::vector<int>{4, 5, 6, 7}));
  const auto sw = m.gpu_groups(LinkKind::kSwitchUplink);
  // 4 first-level switches of 4 GPUs, 8 second-level of 2; the NVSwitch trees hold no GPU.
  ASSERT_EQ(sw.size(), 12u);
  EXPECT_EQ(sw[0], (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(sw[1], (std::vector<int>{0, 1}));
  EXPECT_EQ(sw[2], (std::vector<int>{2, 3}));
  const auto sockets = m.gpu_groups(LinkKind::kInterSocket);
  ASSERT_EQ(sockets.size(), 1u);
  EXPECT_EQ(sockets[0].size(), 16u);
}

TEST(Links, IdsAreDenseAndOrderedByKind) {
  const LinkMap m(synthetic("dgx1-like.yaml"));
  // 8 GPU uplinks, 4 NIC uplinks, 4 switch uplinks, 2 root complexes, 1 inter-socket link.
  ASSERT_EQ(m.links().size(), 19u);
  for (size_t i = 0; i < m.links().size(); ++i) {
    EXPECT_EQ(m.links()[i].id, static_cast<int>(i));
    EXPECT_GT(m.links()[i].gbps, 0);
    if (i > 0) {
      EXPECT_LE(m.links()[i - 1].kind, m.links()[i].kind);
    }
  }
  EXPECT_EQ(m.link(m.inter_socket_link(0, 1)).gbps, 38.4);
  EXPECT_TRUE(m.link(m.inter_socket_link(0, 1)).known);
  EXPECT_EQ(m.inter_socket_link(0, 0), -1);
  EXPECT_EQ(m.inter_socket_link(0, 5), -1);
  // GPU uplinks and switch uplinks come from gen3 x16.
  EXPECT_EQ(m.link(m.switch_uplink(0)).basis, "15.75 GB/s (gen3 x16)");
  EXPECT_STREQ(link_kind_name(m.link(m.switch_uplink(0)).kind), "switch-uplink");
}

TEST(Links, UnknownSpeedsTakeTheConfiguredDefault) {
  FERRY_REQUIRE_REAL_TOPOLOGIES();
  const Topology& t = real("2rc-dual-gpu-lstopo.xml");  // hwloc 1.x: every speed is 0
  LinkOptions o;
  o.default_pcie_gbps = 8.0;
  o.inter_socket_gbps = 30.0;
  const LinkMap m(t, o);
  const Link& up = m.link(m.gpu_uplink(0));
  EXPECT_FALSE(up.known);
  EXPECT_DOUBLE_EQ(up.gbps, 8.0);
  EXPECT_NE(up.basis.find("default"), std::string::npos);
  EXPECT_DOUBLE_EQ(m.link(m.inter_socket_link(0, 1)).gbps, 30.0);
  EXPECT_FALSE(m.link(m.inter_socket_link(0, 1)).known);
  for (const auto& l : m.links()) {
    EXPECT_TRUE(std::isfinite(l.gbps) && l.gbps > 0) << l.name;
  }
  o.root_complex_gbps = 50.0;
  const LinkMap m2(t, o);
  EXPECT_DOUBLE_EQ(m2.link(m2.root_complex_link(0)).gbps, 50.0);
}

TEST(Links, RootComplexDefaultsToTheSumOfItsPhysicalLinks) {
  FERRY_REQUIRE_REAL_TOPOLOGIES();
  // g4dn root ports report 2 GB/s while the T4s behind them report 15.75 GB/s; the link is the
  // T4's, and the root complex carries two of them.
  const Topology& t = real("g4dnmetal.xml");
  const LinkMap m(t);
  const Link& rc = m.link(m.root_complex_link(t.gpus()[0].root_complex));
  EXPECT_NEAR(rc.gbps, 2 * 15.754, 0.01);
  EXPECT_FALSE(rc.known);
  EXPECT_NEAR(m.bottleneck_gbps(m.gpu_path(0, 0)), 15.754, 0.001);
}

TEST(Links, FunctionsOfOneNicShareItsLink) {
  FERRY_REQUIRE_REAL_TOPOLOGIES();
  const Topology& t = real("ipa20.xml");
  const LinkMap m(t);
  int f0 = -1, f1 = -1;
  for (const auto& n : t.nics()) {
    if (n.addr.str() == "0000:4d:00.0") f0 = n.index;
    if (n.addr.str() == "0000:4d:00.1") f1 = n.index;
  }
  ASSERT_GE(f0, 0);
  ASSERT_GE(f1, 0);
  EXPECT_EQ(m.nic_uplink(f0), m.nic_uplink(f1));
  EXPECT_EQ(m.link(m.nic_uplink(f0)).nics, (std::vector<int>{f0, f1}));
  // The HCA and the GPU on that switch share the switch uplink on their way to memory.
  const auto shared = LinkMap::shared(m.gpu_path(0, 3), m.nic_path(f0, 3));
  ASSERT_EQ(shared.size(), 2u);
  EXPECT_EQ(m.link(shared[0]).kind, LinkKind::kSwitchUplink);
}

TEST(Links, SubNumaHopsInsideASocketAddNoLink) {
  const Topology& t = synthetic("h100-snc4.yaml");
  const LinkMap m(t);
  EXPECT_EQ(m.gpu_path(0, 0), m.gpu_path(0, 1));  // NUMA 0 and 1 are both on package 0
  EXPECT_EQ(m.gpu_path(0, 4).size(), m.gpu_path(0, 1).size() + 1);
}

TEST(Links, BadQueriesAndOptionsAreConfigErrors) {
  const Topology& t = synthetic("workstation-4gpu.yaml");
  const LinkMap m(t);
  EXPECT_THROW(m.gpu_path(4, 0), ConfigError);
  EXPECT_THROW(m.gpu_path(-1, 0), ConfigError);
  EXPECT_THROW(m.gpu_path(0, 7), ConfigError);
  EXPECT_THROW(m.nic_path(1, 0), ConfigError);
  EXPECT_TRUE(m.gpu_groups(LinkKind::kInterSocket).empty());  // one socket
  for (double bad : std::vector<double>{0.0, -1.0, std::nan(""), 1e9}) {
    LinkOptions o;
    o.default_pcie_gbps = bad;
    EXPECT_THROW(LinkMap(t, o), ConfigError) << bad;
  }
}

}  // namespace
}  // namespace ferry
