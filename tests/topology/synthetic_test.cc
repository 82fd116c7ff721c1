// The synthetic descriptions in configs/topologies and the model dump round trip.
#include "topology/synthetic.h"

#include <gtest/gtest.h>

#include "tests/topology/fixtures.h"
#include "topology/links.h"
#include "topology/paths.h"

namespace ferry {
namespace {

using testing::real;
using testing::synthetic;

TEST(SyntheticDgx1, MatrixIsTheDgx1Documentation) {
  const Topology& t = synthetic("dgx1-like.yaml");
  ASSERT_EQ(t.gpus().size(), 8u);
  ASSERT_EQ(t.nics().size(), 4u);
  for (int a = 0; a < 8; ++a) {
    for (int b = 0; b < 8; ++b) {
      if (a == b) continue;
      const PathClass expected = a / 2 == b / 2   ? PathClass::kPix   // one switch
                                 : a / 4 == b / 4 ? PathClass::kPhb   // one socket
                                                  : PathClass::kSys;  // across sockets
      EXPECT_EQ(gpu_pair_class(t, a, b), expected) << "GPU" << a << " GPU" << b;
    }
    for (int n = 0; n < 4; ++n) {
      const PathClass expected = a / 2 == n       ? PathClass::kPix
                                 : a / 4 == n / 2 ? PathClass::kPhb
                                                  : PathClass::kSys;
      EXPECT_EQ(gpu_nic_class(t, a, n), expected) << "GPU" << a << " NIC" << n;
    }
    EXPECT_EQ(t.local_numa(a), a / 4);
  }
}

TEST(SyntheticDgx1, MachineShape) {
  const Topology& t = synthetic("dgx1-like.yaml");
  EXPECT_EQ(t.name(), "dgx1-like");
  ASSERT_EQ(t.packages().size(), 2u);
  ASSERT_EQ(t.numa_nodes().size(), 2u);
  EXPECT_EQ(format_index_list(t.numa(0).cpus), "0-19,40-59");
  EXPECT_EQ(format_index_list(t.numa(1).cpus), "20-39,60-79");
  EXPECT_EQ(t.numa(0).cores.size(), 20u);
  EXPECT_EQ(t.numa(0).cores[3], (std::vector<int>{3, 43}));
  EXPECT_EQ(t.numa(0).memory_bytes, 256ull << 30);
  EXPECT_EQ(t.root_complexes().size(), 2u);
  EXPECT_EQ(t.switches().size(), 4u);
  for (const auto& g : t.gpus()) {
    EXPECT_EQ(g.name, "Tesla V100-SXM2-16GB");
    EXPECT_EQ(g.device_id, 0x1db1);
    EXPECT_EQ(g.link.gen, 3);
    EXPECT_EQ(g.link.width, 16);
    EXPECT_NEAR(*g.link.gbps, 15.754, 0.001);
  }
  EXPECT_EQ(t.nics()[2].os_name, "mlx5_2");
  EXPECT_EQ(t.nics()[2].nic_kind, NicKind::kInfiniband);
  ASSERT_TRUE(t.inter_socket_gbps());
  EXPECT_DOUBLE_EQ(*t.inter_socket_gbps(), 38.4);
}

TEST(SyntheticWorkstation, EveryGpuPairMeetsOnlyInTheRootComplex) {
  const Topology& t = synthetic("workstation-4gpu.yaml");
  ASSERT_EQ(t.gpus().size(), 4u);
  EXPECT_EQ(t.root_complexes().size(), 1u);
  EXPECT_TRUE(t.switches().empty());
  for (int a = 0; a < 4; ++a) {
    for (int b = 0; b < 4; ++b) {
      if (a != b) {
        EXPECT_EQ(gpu_pair_class(t, a, b), PathClass::kPhb);
      }
    }
    EXPECT_EQ(gpu_nic_class(t, a, 0), PathClass::kPhb);
    EXPECT_NEAR(*t.gpus()[a].link.gbps, 31.508, 0.001);  // gen4 x16
    EXPECT_TRUE(t.gpus()[a].switches.empty());
  }
  EXPECT_NEAR(*t.nics()[0].link.gbps, 3.938, 0.001);  // gen3 x4
  EXPECT_EQ(t.nics()[0].nic_kind, NicKind::kEthernet);
  EXPECT_EQ(t.numa(0).cpus.size(), 64u);
}

TEST(SyntheticDgx2, GpuMatrixEqualsTheRealDgx2Export) {
  FERRY_REQUIRE_REAL_TOPOLOGIES();
  const Topology& s = synthetic("dgx2-like.yaml");
  const Topology& r = real("nvidiaDGX2.xml");
  ASSERT_EQ(s.gpus().size(), r.gpus().size());
  for (size_t a = 0; a < s.gpus().size(); ++a) {
    for (size_t b = 0; b < s.gpus().size(); ++b) {
      if (a == b) continue;
      EXPECT_EQ(gpu_pair_class(s, a, b), gpu_pair_class(r, a, b)) << a << "," << b;
    }
    EXPECT_EQ(s.local_numa(a), r.local_numa(a));
    EXPECT_EQ(s.gpus()[a].switches.size(), 2u);
  }
}

TEST(SyntheticSnc, GpusOnSeparateNumaNodesOfOneSocketAreSys) {
  const Topology& t = synthetic("h100-snc4.yaml");
  ASSERT_EQ(t.gpus().size(), 4u);
  EXPECT_EQ(t.numa_nodes().size(), 8u);
  std::vector<int> numa;
  for (const auto& g : t.gpus()) numa.push_back(t.local_numa(g.index));
  EXPECT_EQ(numa, (std::vector<int>{1, 3, 5, 7}));
  EXPECT_EQ(gpu_pair_class(t, 0, 1), PathClass::kSys);  // same socket, different NUMA nodes
  for (int g = 0; g < 4; ++g) {
    for (int n = 0; n < 4; ++n) {
      EXPECT_EQ(gpu_nic_class(t, g, n), g == n ? PathClass::kPix : PathClass::kSys);
    }
  }
  EXPECT_NEAR(*t.gpus()[0].link.gbps, 63.015, 0.001);
}

TEST(Synthetic, MemoryOnlyNodesAreNumberedLastAndNeverLocal) {
  const Topology t = parse_yaml(R"(
sockets:
  - count: 2
    cores: 4
    memory_only_numa_nodes: {count: 2, memory: 16GiB}
    root_complexes:
      - gpus: 2
)",
                                "inline");
  ASSERT_EQ(t.numa_nodes().size(), 6u);
  EXPECT_TRUE(t.numa(0).has_cpus());
  EXPECT_TRUE(t.numa(1).has_cpus());
  for (int os = 2; os < 6; ++os) {
    EXPECT_FALSE(t.numa(os).has_cpus());
    EXPECT_EQ(t.numa(os).memory_bytes, 16ull << 30);
  }
  EXPECT_EQ(t.numa(4).package, 1);
  // The root complex's locality holds its socket's memory-only nodes, the GPU's local node not.
  EXPECT_EQ(t.root_complexes()[0].locality.numa, (std::vector<int>{0, 2, 3}));
  EXPECT_EQ(t.gpus()[0].local_numa, (std::vector<int>{0}));
  EXPECT_EQ(t.gpus()[3].local_numa, (std::vector<int>{1}));
  EXPECT_EQ(t.gpus()[0].name, "synthetic GPU");
}

TEST(Synthetic, ExplicitGbpsAndNestedDefaults) {
  const Topology t = parse_yaml(R"(
pcie: {gen: 2, width: 8}
root_complex_gbps: 20
sockets:
  - root_complexes:
      - pcie: {gen: 4, width: 16}
        switches:
          - pcie: {gbps: 12.5}
            gpus: [{count: 1}, {count: 1, pcie: {gen: 1, width: 1}}]
        nics: 1
)",
                                "inline");
  ASSERT_EQ(t.gpus().size(), 2u);
  EXPECT_DOUBLE_EQ(*t.switches()[0].uplink.gbps, 12.5);
  EXPECT_FALSE(t.switches()[0].uplink.gen);
  EXPECT_DOUBLE_EQ(*t.gpus()[0].link.gbps, 12.5);  // inherits the switch's link
  EXPECT_DOUBLE_EQ(*t.gpus()[1].link.gbps, 0.25);
  EXPECT_NEAR(*t.nics()[0].link.gbps, 31.508, 0.001);  // the root complex's default
  EXPECT_DOUBLE_EQ(*t.root_complexes()[0].gbps, 20.0);
}

// The dump's first line is a comment naming its source, which differs after a reload.
std::string without_comment(const std::string& dump) { return dump.substr(dump.find('\n')); }

// Dump -> load gives the same answers, for every real machine and every shipped description.
void expect_same_model(const Topology& a, const Topology& b) {
  EXPECT_EQ(a.name(), b.name());
  EXPECT_EQ(class_matrix(a), class_matrix(b));
  ASSERT_EQ(a.gpus().size(), b.gpus().size());
  for (size_t i = 0; i < a.gpus().size(); ++i) {
    EXPECT_EQ(a.gpus()[i].addr, b.gpus()[i].addr);
    EXPECT_EQ(a.gpus()[i].name, b.gpus()[i].name);
    EXPECT_EQ(a.gpus()[i].local_numa, b.gpus()[i].local_numa);
    EXPECT_EQ(a.gpus()[i].switches, b.gpus()[i].switches);
  }
  ASSERT_EQ(a.nics().size(), b.nics().size());
  for (size_t i = 0; i < a.nics().size(); ++i) EXPECT_EQ(a.nics()[i].os_name, b.nics()[i].os_name);
  ASSERT_EQ(a.numa_nodes().size(), b.numa_nodes().size());
  for (size_t i = 0; i < a.numa_nodes().size(); ++i) {
    EXPECT_EQ(a.numa_nodes()[i].cores, b.numa_nodes()[i].cores);
    EXPECT_EQ(a.numa_nodes()[i].memory_bytes, b.numa_nodes()[i].memory_bytes);
  }
  const LinkMap la(a), lb(b);
  ASSERT_EQ(la.links().size(), lb.links().size());
  for (size_t i = 0; i < la.links().size(); ++i) {
    EXPECT_EQ(la.links()[i].name, lb.links()[i].name);
    EXPECT_DOUBLE_EQ(la.links()[i].gbps, lb.links()[i].gbps) << la.links()[i].name;
    EXPECT_EQ(la.links()[i].known, lb.links()[i].known);
  }
}

TEST(ModelDump, RoundTripsEveryShippedDescription) {
  for (const char* name :
       {"dgx1-like.yaml", "workstation-4gpu.yaml", "dgx2-like.yaml", "h100-snc4.yaml"}) {
    SCOPED_TRACE(name);
    const Topology& t = synthetic(name);
    const std::string dump = dump_model_yaml(t);
    const Topology back = parse_yaml(dump, "dump");
    expect_same_model(t, back);
    EXPECT_EQ(without_comment(dump_model_yaml(back)), without_comment(dump));
  }
}

TEST(ModelDump, RoundTripsEveryRealMachine) {
  FERRY_REQUIRE_REAL_TOPOLOGIES();
  for (const char* name :
       {"nvidiaDGX2.xml", "ipa20.xml", "topo.jwb0004.xml", "topo.jwc09n003.xml", "g4dnmetal.xml",
        "coral-lassen.xml", "coral-butte-hwloc1.xml", "cts1-pascal.xml", "2rc-dual-gpu-lstopo.xml",
        "power8gpudistances.xml", "24em64t-2n6c2t-pci.xml", "epyc-corona.xml"}) {
    SCOPED_TRACE(name);
    const Topology& t = real(name);
    const std::string dump = dump_model_yaml(t);
    const Topology back = parse_yaml(dump, "dump");
    expect_same_model(t, back);
    EXPECT_EQ(without_comment(dump_model_yaml(back)), without_comment(dump));
  }
}

}  // namespace
}  // namespace ferry
