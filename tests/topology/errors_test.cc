// Bad inputs give typed, one-line, named errors with hints: missing and malformed files, XML
// versions hwloc 2.9 cannot read, malformed YAML, wrong types, huge numbers, unknown keys.
#include <gtest/gtest.h>

#include "common/error.h"
#include "tests/support/temp_dir.h"
#include "tests/topology/fixtures.h"
#include "topology/hwloc_topology.h"
#include "topology/load.h"
#include "topology/synthetic.h"

namespace ferry {
namespace {

// Runs `f`, expects an exception of type E whose message contains `needle`, is one line, and
// carries a hint.
template <typename E, typename F>
void expect_error(F f, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "no error; expected one containing '" << needle << "'";
  } catch (const E& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find(needle), std::string::npos) << what;
    EXPECT_EQ(what.find('\n'), std::string::npos) << what;
    EXPECT_FALSE(e.hint().empty()) << what;
  }
}

std::string dgx2_xml() { return testing::read_text(testing::real_dir() + "/nvidiaDGX2.xml"); }

TEST(XmlErrors, MissingFileAndDirectory) {
  expect_error<DataError>([] { load_xml("/nonexistent/machine.xml"); }, "no such file");
  const testing::TempDir dir;
  expect_error<DataError>([&] { load_xml(dir.str()); }, "not a regular file");
}

TEST(XmlErrors, EmptyGarbageAndTruncated) {
  const testing::TempDir dir;
  expect_error<DataError>([&] { load_xml(dir.write("empty.xml", "")); }, "empty");
  expect_error<DataError>([&] { load_xml(dir.write("garbage.xml", "garbage<<")); },
                          "not a valid hwloc XML");
  expect_error<DataError>([] { HwlocTopology::from_xml_buffer("<topology>", "buffer"); },
                          "not a valid hwloc XML");
  FERRY_REQUIRE_REAL_TOPOLOGIES();
  const std::string xml = dgx2_xml();
  expect_error<DataError>(
      [&] { load_xml(dir.write("truncated.xml", xml.substr(0, xml.size() / 2))); },
      "truncated.xml");
}

TEST(XmlErrors, Version3IsRejectedWithAClearMessage) {
  FERRY_REQUIRE_REAL_TOPOLOGIES();
  std::string xml = dgx2_xml();
  const size_t at = xml.find("version=\"2.0\"");
  ASSERT_NE(at, std::string::npos);
  xml.replace(at, 13, "version=\"3.0\"");
  const testing::TempDir dir;
  expect_error<DataError>([&] { load_xml(dir.write("v3.xml", xml)); },
                          "XML version 3.0 is newer than this hwloc");
}

TEST(XmlErrors, ImplausibleLinkSpeedIsRejected) {
  FERRY_REQUIRE_REAL_TOPOLOGIES();
  std::string xml = dgx2_xml();
  const std::string speed = "pci_link_speed=\"15.753846\"";
  const size_t at = xml.find(speed);
  ASSERT_NE(at, std::string::npos);
  xml.replace(at, speed.size(), "pci_link_speed=\"1e30\"");
  expect_error<DataError>([&] { HwlocTopology::from_xml_buffer(xml, "fast").model(); },
                          "GB/s is outside [0.01, 1024] GB/s");
  // As slow: a 1e-6 GB/s link made `trainer train` hang.
  xml = dgx2_xml();
  xml.replace(xml.find(speed), speed.size(), "pci_link_speed=\"0.000001\"");
  expect_error<DataError>([&] { HwlocTopology::from_xml_buffer(xml, "slow").model(); },
                          "link speed 1e-06 GB/s is outside [0.01, 1024] GB/s");
  // Zero (what hwloc 1.x writes) is not an error: the speed is unknown.
  xml = dgx2_xml();
  xml.replace(xml.find(speed), speed.size(), "pci_link_speed=\"0\"");
  const Topology t = HwlocTopology::from_xml_buffer(xml, "zero").model();
  int unknown = 0;
  for (const auto& n : t.pci()) unknown += n.kind != PciKind::kHostBridge && !n.link.known();
  EXPECT_GE(unknown, 1);
}

TEST(YamlErrors, MissingFileAndBadExtension) {
  expect_error<ConfigError>([] { load_yaml("/nonexistent/dgx.yaml"); }, "does not exist");
  expect_error<ConfigError>([] { load_topology("machine.txt"); }, "neither 'live'");
}

TEST(YamlErrors, MalformedYamlNamesTheLine) {
  expect_error<ConfigError>([] { parse_yaml("sockets:\n  - cores: [1, 2\n", "bad.yaml"); },
                            "bad.yaml:");
  expect_error<ConfigError>([] { parse_yaml("sockets:\n  - cores: [1, 2\n", "bad.yaml"); },
                            "malformed YAML");
  expect_error<ConfigError>([] { parse_yaml("", "empty.yaml"); }, "must be a map");
  expect_error<ConfigError>([] { parse_yaml("- 1\n- 2\n", "list.yaml"); }, "must be a map");
}

TEST(YamlErrors, WrongTypes) {
  expect_error<ConfigError>([] { parse_yaml("sockets: 3\n", "t.yaml"); },
                            "'sockets' must be a non-empty list");
  expect_error<ConfigError>([] { parse_yaml("sockets: [{cores: many}]\n", "t.yaml"); },
                            "'cores' must be an integer, got 'many'");
  expect_error<ConfigError>([] { parse_yaml("sockets: [{cores: 2.5}]\n", "t.yaml"); },
                            "must be an integer");
  expect_error<ConfigError>(
      [] { parse_yaml("sockets: [{root_complexes: [{gpus: [1, 2]}]}]\n", "t.yaml"); },
      "entries of 'gpus' must be maps");
  expect_error<ConfigError>(
      [] { parse_yaml("sockets: [{root_complexes: {gpus: 1}}]\n", "t.yaml"); }, "must be a list");
  expect_error<ConfigError>([] { parse_yaml("sockets: [{memory: lots}]\n", "t.yaml"); },
                            "'memory' must be a size");
  expect_error<ConfigError>([] { parse_yaml("sockets: [7]\n", "t.yaml"); }, "must be a map");
  expect_error<ConfigError>(
      [] { parse_yaml("sockets: [{root_complexes: [{nics: {kind: token-ring}}]}]\n", "t.yaml"); },
      "NIC kind 'token-ring' is unknown");
}

TEST(YamlErrors, HugeNumbers) {
  expect_error<ConfigError>(
      [] { parse_yaml("sockets: [{cores: 99999999999999999999999999}]\n", "t.yaml"); },
      "out of range");
  expect_error<ConfigError>([] { parse_yaml("sockets: [{count: 1000000}]\n", "t.yaml"); },
                            "out of range");
  expect_error<ConfigError>([] { parse_yaml("sockets: [{cores: -4}]\n", "t.yaml"); },
                            "out of range");
  expect_error<ConfigError>(
      [] { parse_yaml("inter_socket_gbps: 1e400\nsockets: [{}]\n", "t.yaml"); },
      "t.yaml:1: 'inter_socket_gbps' must be in [0.01, 1024] GB/s, got 1e400");
  expect_error<ConfigError>(
      [] { parse_yaml("pcie: {gen: 9, width: 16}\nsockets: [{}]\n", "t.yaml"); }, "out of range");
  expect_error<ConfigError>(
      [] { parse_yaml("pcie: {gen: 3, width: 3}\nsockets: [{}]\n", "t.yaml"); },
      "width x3 does not exist");
  expect_error<ConfigError>([] { parse_yaml("sockets: [{memory: 99999999999TiB}]\n", "t.yaml"); },
                            "'memory' must be a size");
  // Within every per-entry limit, but too many PCI buses in total.
  expect_error<ConfigError>(
      [] { parse_yaml("sockets: [{root_complexes: [{count: 200, gpus: 30}]}]\n", "t.yaml"); },
      "PCI buses");
  expect_error<ConfigError>(
      [] { parse_yaml("sockets: [{count: 64, cores: 4096, threads_per_core: 8}]\n", "t.yaml"); },
      "too many CPUs");
}

// Link rates outside [0.01, 1024] GB/s are refused wherever a file gives one: a 1e-300 GB/s link
// hung `trainer train` and gave `trainer simulate` absurd numbers.
TEST(YamlErrors, LinkRatesOutsideTheTestedRange) {
  for (const std::string rate : {"1e-300", "1e-6", "0.009", "0", "-5", "1025"}) {
    expect_error<ConfigError>(
        [&] {
          parse_yaml("sockets: [{root_complexes: [{gpus: 1, pcie: {gbps: " + rate + "}}]}]\n",
                     "t.yaml");
        },
        "t.yaml:1: 'gbps' must be in [0.01, 1024] GB/s, got " + rate);
    expect_error<ConfigError>(
        [&] { parse_yaml("root_complex_gbps: " + rate + "\nsockets: [{}]\n", "t.yaml"); },
        "'root_complex_gbps' must be in [0.01, 1024] GB/s");
    expect_error<ConfigError>(
        [&] { parse_yaml("sockets: [{root_complexes: [{gbps: " + rate + "}]}]\n", "t.yaml"); },
        "'gbps' must be in [0.01, 1024] GB/s");
  }
  // The edges are in.
  parse_yaml("sockets: [{root_complexes: [{gpus: 1, pcie: {gbps: 0.01}}]}]\n", "t.yaml");
  parse_yaml("sockets: [{root_complexes: [{gpus: 1, pcie: {gbps: 1024}}]}]\n", "t.yaml");
}

TEST(YamlErrors, DuplicateKeys) {
  expect_error<ConfigError>([] { parse_yaml("name: a\nsockets: [{}]\nname: b\n", "t.yaml"); },
                            "t.yaml:3: the topology: duplicate key 'name' (first given at line 1)");
  expect_error<ConfigError>([] { parse_yaml("sockets: [{cores: 4, cores: 8}]\n", "t.yaml"); },
                            "duplicate key 'cores'");
}

TEST(YamlErrors, UnknownKeysSuggestTheNearest) {
  try {
    parse_yaml("sockets: [{root_complexes: [{gpu: 2}]}]\n", "t.yaml");
    ADD_FAILURE() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("unknown key 'gpu'"), std::string::npos) << e.what();
    EXPECT_EQ(e.hint(), "did you mean 'gpus'?");
  }
  expect_error<ConfigError>([] { parse_yaml("sockets: [{}]\nnumbr: 3\n", "t.yaml"); },
                            "unknown key 'numbr'");
}

TEST(YamlErrors, InconsistentDescriptions) {
  expect_error<ConfigError>([] { parse_yaml("sockets: [{cores: 5, numa_nodes: 2}]\n", "t.yaml"); },
                            "do not split evenly");
  expect_error<ConfigError>(
      [] { parse_yaml("sockets: [{numa_nodes: 1, root_complexes: [{numa: 3}]}]\n", "t.yaml"); },
      "has no NUMA node 3");
  expect_error<ConfigError>(
      [] { parse_yaml("sockets: [{root_complexes: [{pcie: {gen: 3}}]}]\n", "t.yaml"); },
      "needs gen and width");
}

TEST(ModelYamlErrors, BadModelsAreConfigErrors) {
  const std::string head =
      "ferry_topology_model: 1\npackages: [0]\nnuma_nodes: [{os_index: 0, package: 0, cores: "
      "[\"0\"]}]\n";
  expect_error<ConfigError>([&] { parse_yaml("ferry_topology_model: 2\n", "m.yaml"); },
                            "version 2 is not supported");
  expect_error<ConfigError>(
      [&] { parse_yaml(head + "pci: [{kind: device, parent: 3, addr: 00:01.0}]\n", "m.yaml"); },
      "out of range");
  expect_error<ConfigError>(
      [&] { parse_yaml(head + "pci: [{kind: host_bridge, addr: nowhere}]\n", "m.yaml"); },
      "PCI address 'nowhere' is malformed");
  expect_error<ConfigError>([&] { parse_yaml(head + "pci: [{kind: gpu}]\n", "m.yaml"); },
                            "kind 'gpu' is unknown");
  expect_error<ConfigError>(
      [&] {
        parse_yaml(
            head +
                "pci: [{kind: host_bridge, addr: 00:00.0, numa: \"0\"}, {kind: device, parent: "
                "0, addr: 01:00.0}, {kind: device, parent: 0, addr: 01:00.0}]\n",
            "m.yaml");
      },
      "two PCI functions at 0000:01:00.0");
  expect_error<ConfigError>(
      [&] {
        parse_yaml(head + "pci: [{kind: host_bridge, addr: 00:00.0, numa: \"5\"}]\n", "m.yaml");
      },
      "NUMA node 5, which does not exist");
  expect_error<ConfigError>(
      [&] {
        parse_yaml("ferry_topology_model: 1\npackages: [0]\nnuma_nodes: [{os_index: 0}]\npci: []\n",
                   "m.yaml");
      },
      "no NUMA node has CPUs");
  expect_error<ConfigError>(
      [&] {
        parse_yaml(head +
                       "pci: [{kind: host_bridge, addr: 00:00.0, numa: \"0\"}, {kind: device, "
                       "parent: 0, addr: 01:00.0, link_gbps: 1e-6}]\n",
                   "m.yaml");
      },
      "'link_gbps' must be in [0.01, 1024] GB/s, got 1e-6");
}

}  // namespace
}  // namespace ferry
