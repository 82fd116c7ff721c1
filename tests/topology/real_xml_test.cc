// Every real hwloc XML export in ../shared/topologies/real against the expected answers of its
// SOURCES.md: GPU count and bus IDs, the GPU matrix, GPU/NIC classes, local NUMA nodes, links.
#include <filesystem>
#include <map>
#include <optional>
#include <ostream>
#include <sstream>

#include <gtest/gtest.h>

#include "tests/topology/fixtures.h"
#include "topology/paths.h"

namespace ferry {
namespace {

using testing::real;

struct GpuExpect {
  const char* pci;
  int numa;
};
struct NicExpect {
  const char* gpu;
  const char* nic;
  const char* cls;
};
struct Machine {
  const char* file;
  std::vector<GpuExpect> gpus;      // in PCI order
  std::vector<std::string> matrix;  // GPU matrix rows, in PCI order
  std::vector<NicExpect> nic_classes;
  std::optional<double> link_gbps;  // of every GPU; nullopt: the export has no speeds
  bool check_link = true;
  int numa_nodes = 2;
  int cpuless_numa_nodes = 0;
};

// Test names and failure messages show the file, not the struct's bytes.
void PrintTo(const Machine& m, std::ostream* os) { *os << m.file; }

std::string row_of(const std::vector<std::string>& cells) {
  std::string s;
  for (const auto& c : cells) s += (s.empty() ? "" : " ") + c;
  return s;
}

// SOURCES.md gives the 16- and 8-GPU matrices as rules over groups of consecutive GPUs.
std::vector<std::string> grouped_matrix(int n, const std::vector<std::pair<int, const char*>>& g) {
  std::vector<std::string> rows;
  for (int i = 0; i < n; ++i) {
    std::vector<std::string> cells;
    for (int j = 0; j < n; ++j) {
      std::string c = "SYS";
      if (i == j) {
        c = "X";
      } else {
        for (const auto& [size, cls] : g) {
          if (i / size == j / size) {
            c = cls;
            break;
          }
        }
      }
      cells.push_back(c);
    }
    rows.push_back(row_of(cells));
  }
  return rows;
}

const std::vector<Machine>& machines() {
  static const std::vector<Machine> m = {
      {"nvidiaDGX2.xml",
       {{"0000:34:00.0", 0},
        {"0000:36:00.0", 0},
        {"0000:39:00.0", 0},
        {"0000:3b:00.0", 0},
        {"0000:57:00.0", 0},
        {"0000:59:00.0", 0},
        {"0000:5c:00.0", 0},
        {"0000:5e:00.0", 0},
        {"0000:b7:00.0", 1},
        {"0000:b9:00.0", 1},
        {"0000:bc:00.0", 1},
        {"0000:be:00.0", 1},
        {"0000:e0:00.0", 1},
        {"0000:e2:00.0", 1},
        {"0000:e5:00.0", 1},
        {"0000:e7:00.0", 1}},
       grouped_matrix(16, {{2, "PIX"}, {4, "PXB"}, {8, "NODE"}}),
       {},
       15.75},
      {"ipa20.xml",
       {{"0000:4e:00.0", 3}, {"0000:5f:00.0", 1}, {"0000:cb:00.0", 7}, {"0000:db:00.0", 5}},
       grouped_matrix(4, {}),
       {{"0000:5f:00.0", "0000:5e:00.0", "PIX"},
        {"0000:4e:00.0", "0000:4d:00.0", "PIX"},
        {"0000:4e:00.0", "0000:4d:00.1", "PIX"},
        {"0000:db:00.0", "0000:da:00.0", "PIX"},
        {"0000:cb:00.0", "0000:da:00.0", "SYS"},
        {"0000:cb:00.0", "0000:4d:00.0", "SYS"},
        {"0000:cb:00.0", "0000:5e:00.0", "SYS"}},
       63.0,
       true,
       8},
      {"topo.jwb0004.xml",
       {{"0000:03:00.0", 3}, {"0000:44:00.0", 1}, {"0000:84:00.0", 7}, {"0000:c4:00.0", 5}},
       grouped_matrix(4, {}),
       {},  // checked exhaustively in JuwelsBoosterEachGpuIsPixOnlyWithItsOwnHca
       31.5,
       true,
       8},
      {"topo.jwc09n003.xml",
       {{"0000:5d:00.0", 0}, {"0000:5e:00.0", 0}, {"0000:88:00.0", 1}, {"0000:89:00.0", 1}},
       grouped_matrix(4, {{2, "PIX"}}),
       {{"0000:5d:00.0", "0000:5f:00.0", "PIX"},
        {"0000:5e:00.0", "0000:5f:00.0", "PIX"},
        {"0000:88:00.0", "0000:8a:00.0", "PIX"},
        {"0000:89:00.0", "0000:8a:00.0", "PIX"}},
       15.75},
      {"g4dnmetal.xml",
       {{"0000:18:00.0", 0},
        {"0000:19:00.0", 0},
        {"0000:35:00.0", 0},
        {"0000:36:00.0", 0},
        {"0000:e7:00.0", 1},
        {"0000:e8:00.0", 1},
        {"0000:f4:00.0", 1},
        {"0000:f5:00.0", 1}},
       grouped_matrix(8, {{2, "PHB"}, {4, "NODE"}}),
       {},
       15.75},
      {"coral-lassen.xml",
       {{"0004:04:00.0", 0}, {"0004:05:00.0", 0}, {"0035:03:00.0", 8}, {"0035:04:00.0", 8}},
       grouped_matrix(4, {{2, "PIX"}}),
       {{"0004:04:00.0", "0003:01:00.0", "NODE"},
        {"0004:05:00.0", "0003:01:00.1", "NODE"},
        {"0035:03:00.0", "0033:01:00.0", "NODE"},
        {"0035:04:00.0", "0033:01:00.1", "NODE"},
        {"0004:04:00.0", "0033:01:00.0", "SYS"},
        {"0035:03:00.0", "0003:01:00.0", "SYS"}},
       std::nullopt,
       false},
      {"coral-butte-hwloc1.xml",
       {{"0004:04:00.0", 0}, {"0004:05:00.0", 0}, {"0035:03:00.0", 8}, {"0035:04:00.0", 8}},
       grouped_matrix(4, {{2, "PIX"}}),
       {},
       std::nullopt,
       true,
       6,
       4},
      {"cts1-pascal.xml",
       {{"0000:04:00.0", 0}, {"0000:07:00.0", 0}},
       {"X PIX", "PIX X"},
       {{"0000:04:00.0", "0000:08:00.0", "PIX"}, {"0000:07:00.0", "0000:08:00.0", "PIX"}},
       std::nullopt,
       false},
      {"2rc-dual-gpu-lstopo.xml",
       {{"0000:06:00.0", 0}, {"0000:07:00.0", 0}, {"0000:84:00.0", 1}, {"0000:85:00.0", 1}},
       grouped_matrix(4, {{2, "PIX"}}),
       {},
       std::nullopt},
      {"power8gpudistances.xml",
       {{"0002:01:00.0", 0}, {"0003:01:00.0", 0}, {"000a:01:00.0", 1}, {"000b:01:00.0", 1}},
       grouped_matrix(4, {{2, "NODE"}}),
       {},
       std::nullopt,
       false},
      {"24em64t-2n6c2t-pci.xml",
       {{"0000:06:00.0", 0}, {"0000:11:00.0", 1}, {"0000:14:00.0", 1}},
       {"X SYS SYS", "SYS X PHB", "SYS PHB X"},
       {},
       4.0},
      {"epyc-corona.xml", {}, {}, {}, std::nullopt, false, 8},
  };
  return m;
}

class RealMachine : public ::testing::TestWithParam<Machine> {
 protected:
  void SetUp() override { FERRY_REQUIRE_REAL_TOPOLOGIES(); }
};

int nic_index(const Topology& t, const std::string& pci) {
  for (const auto& n : t.nics()) {
    if (n.addr.str() == pci) return n.index;
  }
  return -1;
}

TEST_P(RealMachine, GpuCountAndBusIdsInPciOrder) {
  const Machine& m = GetParam();
  const Topology& t = real(m.file);
  ASSERT_EQ(t.gpus().size(), m.gpus.size());
  for (size_t i = 0; i < m.gpus.size(); ++i) {
    EXPECT_EQ(t.gpus()[i].addr.str(), m.gpus[i].pci) << "GPU" << i;
    EXPECT_EQ(t.gpus()[i].index, static_cast<int>(i));
    EXPECT_EQ(t.gpus()[i].vendor_id, 0x10de);
  }
}

TEST_P(RealMachine, GpuMatrix) {
  const Machine& m = GetParam();
  const Topology& t = real(m.file);
  const auto matrix = class_matrix(t);
  ASSERT_EQ(matrix.size(), t.gpus().size() + t.nics().size());
  for (size_t i = 0; i < m.matrix.size(); ++i) {
    std::vector<std::string> gpu_row(matrix[i].begin(), matrix[i].begin() + m.gpus.size());
    EXPECT_EQ(row_of(gpu_row), m.matrix[i]) << m.file << " row GPU" << i;
  }
}

TEST_P(RealMachine, LocalNumaNodes) {
  const Machine& m = GetParam();
  const Topology& t = real(m.file);
  ASSERT_EQ(t.gpus().size(), m.gpus.size());
  for (size_t i = 0; i < m.gpus.size(); ++i) {
    EXPECT_EQ(t.local_numa(static_cast<int>(i)), m.gpus[i].numa) << m.gpus[i].pci;
    EXPECT_TRUE(t.numa(t.local_numa(static_cast<int>(i))).has_cpus());
  }
  EXPECT_EQ(static_cast<int>(t.numa_nodes().size()), m.numa_nodes);
  int cpuless = 0;
  for (const auto& n : t.numa_nodes()) cpuless += n.has_cpus() ? 0 : 1;
  EXPECT_EQ(cpuless, m.cpuless_numa_nodes);
}

TEST_P(RealMachine, GpuNicClasses) {
  const Machine& m = GetParam();
  const Topology& t = real(m.file);
  for (const auto& e : m.nic_classes) {
    int g = -1;
    for (const auto& gpu : t.gpus()) {
      if (gpu.addr.str() == e.gpu) g = gpu.index;
    }
    const int n = nic_index(t, e.nic);
    ASSERT_GE(g, 0) << e.gpu;
    ASSERT_GE(n, 0) << e.nic;
    EXPECT_STREQ(path_class_name(gpu_nic_class(t, g, n)), e.cls) << e.gpu << " - " << e.nic;
  }
}

auto machine_name = [](const auto& info) {
  std::string name = info.param.file;
  name = name.substr(0, name.size() - 4);
  for (char& c : name) {
    if (!isalnum(static_cast<unsigned char>(c))) c = '_';
  }
  return name;
};

INSTANTIATE_TEST_SUITE_P(SharedTopologies, RealMachine, ::testing::ValuesIn(machines()),
                         machine_name);

// Only the machines whose SOURCES.md entry states a GPU link speed (or that it is unknown).
std::vector<Machine> machines_with_link_speed() {
  std::vector<Machine> out;
  for (const auto& m : machines()) {
    if (m.check_link && !m.gpus.empty()) out.push_back(m);
  }
  return out;
}

class RealMachineLinks : public RealMachine {};

TEST_P(RealMachineLinks, GpuLinkSpeed) {
  const Machine& m = GetParam();
  const Topology& t = real(m.file);
  for (const auto& g : t.gpus()) {
    if (m.link_gbps) {
      ASSERT_TRUE(g.link.gbps) << g.addr.str();
      EXPECT_NEAR(*g.link.gbps, *m.link_gbps, 0.05) << g.addr.str();
    } else {
      EXPECT_FALSE(g.link.gbps) << g.addr.str() << ": hwloc 1.x exports report 0 (unknown)";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(SharedTopologies, RealMachineLinks,
                         ::testing::ValuesIn(machines_with_link_speed()), machine_name);

TEST(RealMachines, EveryFileIsCovered) {
  FERRY_REQUIRE_REAL_TOPOLOGIES();
  size_t xml_files = 0;
  for (const auto& entry : std::filesystem::directory_iterator(testing::real_dir())) {
    if (entry.path().extension() == ".xml") ++xml_files;
  }
  EXPECT_EQ(xml_files, machines().size());
}

TEST(RealMachines, Dgx2HasTwoSwitchLevelsAndNvSwitchesAreNotGpus) {
  FERRY_REQUIRE_REAL_TOPOLOGIES();
  const Topology& t = real("nvidiaDGX2.xml");
  int nvswitches = 0;
  for (const auto& n : t.pci()) {
    nvswitches += n.vendor_id == 0x10de && n.class_id == 0x0680 ? 1 : 0;
  }
  EXPECT_EQ(nvswitches, 11);  // the 12th has a zeroed pci_type in the export
  EXPECT_EQ(t.root_complexes().size(), 4u);
  // GPU0 sits under a second-level switch inside a first-level switch.
  ASSERT_EQ(t.gpus()[0].switches.size(), 2u);
  const Switch& inner = t.switches()[t.gpus()[0].switches[0]];
  const Switch& outer = t.switches()[t.gpus()[0].switches[1]];
  EXPECT_EQ(inner.level, 2);
  EXPECT_EQ(outer.level, 1);
  EXPECT_EQ(inner.parent, outer.index);
  EXPECT_EQ(inner.gpus, (std::vector<int>{0, 1}));
  EXPECT_EQ(outer.gpus, (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(t.gpus()[0].name, "Tesla V100-SXM3-32GB-H");
}

TEST(RealMachines, Ipa20CoProcessorsAreNotGpus) {
  FERRY_REQUIRE_REAL_TOPOLOGIES();
  const Topology& t = real("ipa20.xml");
  int coprocessors = 0;
  for (const auto& n : t.pci()) coprocessors += n.class_id == 0x0b40 ? 1 : 0;
  EXPECT_EQ(coprocessors, 4);
  EXPECT_EQ(t.gpus().size(), 4u);
  EXPECT_EQ(t.root_complexes().size(), 9u);
  // Each GPU alone under its own host bridge.
  for (const auto& g : t.gpus()) EXPECT_EQ(t.root_complexes()[g.root_complex].gpus.size(), 1u);
}

TEST(RealMachines, JuwelsBoosterEachGpuIsPixOnlyWithItsOwnHca) {
  FERRY_REQUIRE_REAL_TOPOLOGIES();
  const Topology& t = real("topo.jwb0004.xml");
  const std::map<std::string, std::string> own = {{"0000:44:00.0", "0000:43:00.0"},
                                                  {"0000:03:00.0", "0000:04:00.0"},
                                                  {"0000:c4:00.0", "0000:c3:00.0"},
                                                  {"0000:84:00.0", "0000:83:00.0"}};
  ASSERT_EQ(t.gpus().size(), 4u);
  for (const auto& g : t.gpus()) {
    for (const auto& n : t.nics()) {
      const bool mine = own.at(g.addr.str()) == n.addr.str();
      EXPECT_EQ(gpu_nic_class(t, g.index, n.index), mine ? PathClass::kPix : PathClass::kSys)
          << g.addr.str() << " - " << n.addr.str();
    }
  }
  // The BMC's VGA (1a03:2000, class 0300) is listed, not counted.
  ASSERT_EQ(t.other_gpus().size(), 1u);
  EXPECT_EQ(t.other_gpus()[0].vendor_id, 0x1a03);
}

TEST(RealMachines, PowerNineBusIdsRepeatAcrossDomains) {
  FERRY_REQUIRE_REAL_TOPOLOGIES();
  const Topology& t = real("coral-lassen.xml");
  // Bus 03 and 04 exist in domain 0004 and 0035; only the domain tells them apart.
  EXPECT_GE(t.find(*PciAddress::parse("0035:04:00.0")), 0);
  EXPECT_GE(t.find(*PciAddress::parse("0004:04:00.0")), 0);
  EXPECT_NE(t.find(*PciAddress::parse("0035:04:00.0")), t.find(*PciAddress::parse("0004:04:00.0")));
  // NUMA os indices are sparse: 0 and 8.
  EXPECT_EQ(t.numa_nodes()[1].os_index, 8);
}

TEST(RealMachines, ButteCpuLessNodesAreNeverLocal) {
  FERRY_REQUIRE_REAL_TOPOLOGIES();
  const Topology& t = real("coral-butte-hwloc1.xml");
  for (int os : {252, 253, 254, 255}) {
    EXPECT_FALSE(t.numa(os).has_cpus()) << os;
    // "16 GB each": 15.75 GiB of V100 HBM2 exposed to the host.
    EXPECT_GT(t.numa(os).memory_bytes, 15ull << 30) << os;
    EXPECT_LE(t.numa(os).memory_bytes, 16ull << 30) << os;
  }
  for (const auto& g : t.gpus()) {
    for (int m : g.local_numa) EXPECT_LT(m, 252) << g.addr.str();
  }
}

TEST(RealMachines, CoronaHasNoNvidiaGpuButFiveDisplayDevices) {
  FERRY_REQUIRE_REAL_TOPOLOGIES();
  const Topology& t = real("epyc-corona.xml");
  EXPECT_EQ(t.gpus().size(), 0u);
  ASSERT_EQ(t.other_gpus().size(), 5u);  // filtering on class 0x03xx alone would count these
  std::vector<int> amd_numa;
  for (const auto& o : t.other_gpus()) {
    if (o.vendor_id == 0x1002) amd_numa.push_back(o.local_numa.front());
  }
  EXPECT_EQ(amd_numa, (std::vector<int>{1, 2, 5, 7}));
}

TEST(RealMachines, PascalHasNoIoOnSocketOne) {
  FERRY_REQUIRE_REAL_TOPOLOGIES();
  const Topology& t = real("cts1-pascal.xml");
  ASSERT_EQ(t.root_complexes().size(), 1u);
  EXPECT_EQ(t.root_complexes()[0].locality.package, 0);
  EXPECT_EQ(t.packages().size(), 2u);
}

}  // namespace
}  // namespace ferry
