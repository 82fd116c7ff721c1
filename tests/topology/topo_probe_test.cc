// The built topo-probe tool: JSON shape and keys, text output, exit codes and one-line errors.
#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tests/support/temp_dir.h"
#include "tests/topology/fixtures.h"
#include "topology/hwloc_topology.h"

namespace ferry {
namespace {

struct ProbeRun {
  int code = -1;
  std::string out, err;
};

std::string quote(const std::string& s) { return "'" + s + "'"; }

ProbeRun run_probe(const std::string& args) {
  const std::string probe = std::string(FERRY_BINARY_DIR) + "/topo-probe";
  const testing::TempDir scratch("stderr");
  const std::string err_path = scratch.file("topo_probe_stderr.txt");
#if defined(__SANITIZE_ADDRESS__)
  // See Note [Sanitizer runs and hwloc's own leaks] in fixtures.cc: the tool's process cannot
  // take the test's suppressions; the same library code is leak-checked in this process.
  const std::string env = "ASAN_OPTIONS=detect_leaks=0 ";
#else
  const std::string env;
#endif
  const std::string cmd = env + quote(probe) + " " + args + " 2>" + quote(err_path);
  ProbeRun r;
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return r;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) r.out.append(buf, n);
  const int status = pclose(p);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.err = testing::read_text(err_path);
  return r;
}

class TopoProbe : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!std::filesystem::exists(std::string(FERRY_BINARY_DIR) + "/topo-probe")) {
      GTEST_SKIP() << "topo-probe is not built in " << FERRY_BINARY_DIR;
    }
  }
  const testing::TempDir dir_;
};

std::string real_file(const std::string& name) { return quote(testing::real_dir() + "/" + name); }

void expect_one_line_error(const ProbeRun& r) {
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(r.err.rfind("topo-probe: error: ", 0), 0u) << r.err;
  ASSERT_FALSE(r.err.empty());
  EXPECT_EQ(r.err.find('\n'), r.err.size() - 1) << r.err;
  EXPECT_TRUE(r.out.empty()) << r.out;
}

TEST_F(TopoProbe, JsonKeysAndValuesForTheDgx2) {
  FERRY_REQUIRE_REAL_TOPOLOGIES();
  const ProbeRun r = run_probe("--json --xml " + real_file("nvidiaDGX2.xml"));
  ASSERT_EQ(r.code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  std::set<std::string> top;
  for (const auto& [k, v] : j.items()) top.insert(k);
  EXPECT_EQ(top, (std::set<std::string>{"gpus", "nics", "matrix", "groups"}));
  ASSERT_EQ(j["gpus"].size(), 16u);
  std::set<std::string> gpu_keys;
  for (const auto& [k, v] : j["gpus"][0].items()) gpu_keys.insert(k);
  EXPECT_EQ(gpu_keys, (std::set<std::string>{"index", "pci", "vendor_id", "device_id", "name",
                                             "numa", "root_complex", "switch", "link_gbps"}));
  const auto& g0 = j["gpus"][0];
  EXPECT_EQ(g0["index"], 0);
  EXPECT_EQ(g0["pci"], "0000:34:00.0");
  EXPECT_EQ(g0["vendor_id"], "0x10de");
  EXPECT_EQ(g0["device_id"], "0x1db8");
  EXPECT_EQ(g0["name"], "Tesla V100-SXM3-32GB-H");
  EXPECT_EQ(g0["numa"], 0);
  EXPECT_EQ(g0["root_complex"], 0);
  EXPECT_TRUE(g0["switch"].is_number_integer());
  EXPECT_NEAR(g0["link_gbps"].get<double>(), 15.75, 0.01);
  EXPECT_EQ(j["gpus"][15]["numa"], 1);
  // GPUs in PCI order.
  for (size_t i = 1; i < 16; ++i) {
    EXPECT_LT(j["gpus"][i - 1]["pci"].get<std::string>(), j["gpus"][i]["pci"].get<std::string>());
  }
  ASSERT_EQ(j["matrix"].size(), 16u);
  EXPECT_EQ(j["matrix"][0][0], "X");
  EXPECT_EQ(j["matrix"][0][1], "PIX");
  EXPECT_EQ(j["matrix"][0][2], "PXB");
  EXPECT_EQ(j["matrix"][0][4], "NODE");
  EXPECT_EQ(j["matrix"][0][8], "SYS");
  EXPECT_EQ(j["groups"]["root_complex"],
            nlohmann::json::parse("[[0,1,2,3],[4,5,6,7],[8,9,10,11],[12,13,14,15]]"));
  EXPECT_EQ(j["groups"]["switch"][0], nlohmann::json::parse("[0,1,2,3]"));
  EXPECT_EQ(j["groups"]["switch"][1], nlohmann::json::parse("[0,1]"));
  EXPECT_TRUE(j["nics"].empty());
}

TEST_F(TopoProbe, JsonForTheSyntheticDgx1) {
  const ProbeRun r =
      run_probe("--json --synthetic " + quote(testing::config_path("dgx1-like.yaml")));
  ASSERT_EQ(r.code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j["gpus"].size(), 8u);
  ASSERT_EQ(j["nics"].size(), 4u);
  EXPECT_EQ(j["nics"][0]["kind"], "infiniband");
  EXPECT_EQ(j["nics"][0]["os_name"], "mlx5_0");
  ASSERT_EQ(j["matrix"].size(), 12u);   // GPUs then NICs
  EXPECT_EQ(j["matrix"][0][8], "PIX");  // GPU0 with its switch's NIC
  EXPECT_EQ(j["matrix"][0][2], "PHB");
  EXPECT_EQ(j["matrix"][0][4], "SYS");
  EXPECT_EQ(j["groups"]["switch"], nlohmann::json::parse("[[0,1],[2,3],[4,5],[6,7]]"));
  EXPECT_EQ(j["groups"]["root_complex"], nlohmann::json::parse("[[0,1,2,3],[4,5,6,7]]"));
}

TEST_F(TopoProbe, UnknownLinkSpeedIsNullInJson) {
  FERRY_REQUIRE_REAL_TOPOLOGIES();
  const ProbeRun r = run_probe("--json --xml " + real_file("coral-butte-hwloc1.xml"));
  ASSERT_EQ(r.code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j["gpus"].size(), 4u);
  EXPECT_TRUE(j["gpus"][0]["link_gbps"].is_null());
  EXPECT_EQ(j["gpus"][2]["numa"], 8);
}

TEST_F(TopoProbe, TextShowsMatrixLegendAndTree) {
  FERRY_REQUIRE_REAL_TOPOLOGIES();
  const ProbeRun r = run_probe("--xml " + real_file("topo.jwc09n003.xml"));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("CPU Affinity"), std::string::npos);
  EXPECT_NE(r.out.find("NUMA Affinity"), std::string::npos);
  EXPECT_NE(r.out.find("GPU0   X    PIX   SYS   SYS"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("PIX  = Connection traversing at most a single PCIe bridge"),
            std::string::npos);
  EXPECT_NE(r.out.find("NIC4: mlx5_0"), std::string::npos);
  EXPECT_NE(r.out.find("SW1 0000:5b:00.0 [10b5:8764] switch level 1, uplink 15.75 GB/s"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("    GPU0 0000:5d:00.0"), std::string::npos);
  EXPECT_NE(r.out.find("inter-socket package 0-1"), std::string::npos);
}

TEST_F(TopoProbe, LiveMachineWithoutNvidiaGpuExitsZero) {
  const ProbeRun r = run_probe("");
  ASSERT_EQ(r.code, 0) << r.err;
  if (HwlocTopology::live().model().gpus().empty()) {
    EXPECT_EQ(r.out.rfind("No NVIDIA GPU found.", 0), 0u) << r.out;
  }
  EXPECT_NE(r.out.find("RC0 "), std::string::npos);
  const ProbeRun j = run_probe("--json --ranks 2");
  ASSERT_EQ(j.code, 0) << j.err;
  const auto doc = nlohmann::json::parse(j.out);
  ASSERT_EQ(doc["bindings"].size(), 2u);
}

TEST_F(TopoProbe, ExportWritesXmlThatLoadsBack) {
  const std::string path = dir_.file("live_export.xml");
  const ProbeRun r = run_probe("--json --export " + quote(path));
  ASSERT_EQ(r.code, 0) << r.err;
  ASSERT_TRUE(std::filesystem::exists(path));
  const Topology back = load_xml(path);
  const Topology live = HwlocTopology::live().model();
  EXPECT_EQ(back.numa_nodes().size(), live.numa_nodes().size());
  EXPECT_EQ(back.nics().size(), live.nics().size());
  const ProbeRun again = run_probe("--json --xml " + quote(path));
  EXPECT_EQ(nlohmann::json::parse(again.out), nlohmann::json::parse(r.out));
}

TEST_F(TopoProbe, DumpedModelReloadsToTheSameJson) {
  FERRY_REQUIRE_REAL_TOPOLOGIES();
  const std::string path = dir_.file("ipa20_model.yaml");
  const ProbeRun a =
      run_probe("--json --xml " + real_file("ipa20.xml") + " --dump-model " + quote(path));
  ASSERT_EQ(a.code, 0) << a.err;
  const ProbeRun b = run_probe("--json --synthetic " + quote(path));
  ASSERT_EQ(b.code, 0) << b.err;
  EXPECT_EQ(nlohmann::json::parse(a.out), nlohmann::json::parse(b.out));
}

TEST_F(TopoProbe, ErrorsAreOneLineWithExitCode2) {
  expect_one_line_error(run_probe("--xml /nonexistent/machine.xml"));
  expect_one_line_error(run_probe("--synthetic /nonexistent/machine.yaml"));
  const std::string bad_xml = dir_.write("bad.xml", "<topology version=\"2.0\"><object type=");
  expect_one_line_error(run_probe("--xml " + quote(bad_xml)));
  const std::string bad_yaml = dir_.write("bad.yaml", "sockets: [{cores: 4}\n");
  expect_one_line_error(run_probe("--synthetic " + quote(bad_yaml)));
  expect_one_line_error(run_probe("--xml a.xml --synthetic b.yaml"));
  expect_one_line_error(run_probe("--frobnicate"));
  expect_one_line_error(run_probe("--ranks 0"));
  expect_one_line_error(run_probe("--synthetic " + quote(testing::config_path("dgx1-like.yaml")) +
                                  " --export /tmp/x.xml"));
  FERRY_REQUIRE_REAL_TOPOLOGIES();
  std::string xml = testing::read_text(testing::real_dir() + "/power8gpudistances.xml");
  xml.replace(xml.find("version=\"2.0\""), 13, "version=\"3.0\"");
  const std::string v3 = dir_.write("v3.xml", xml);
  const ProbeRun r = run_probe("--xml " + quote(v3));
  expect_one_line_error(r);
  EXPECT_NE(r.err.find("XML version 3.0"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace ferry
