// CPU ranks standing in for a DGX-1-like server's GPUs under mpirun: the rate the node's link
// ledger measured on every emulated link stays within 2% of its capacity; the topology scheduler
// and fifo, and offload (vdnn-all) and none, train to bitwise equal parameters; bad topologies
// and topology keys are one clear error naming the key, exit 2.
#include <fstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tests/trainer/integration/run_util.h"

namespace ferry::testing {
namespace {

std::string quickstart() { return std::string(FERRY_SOURCE_DIR) + "/configs/quickstart.yaml"; }
std::string dgx1() { return std::string(FERRY_SOURCE_DIR) + "/configs/topologies/dgx1-like.yaml"; }

// Three steps of the quickstart on 4 ranks of the DGX-1-like server. emulation_scale 300 makes
// the links slow enough (about 50 MB/s per GPU link) that copies overlap and contend.
std::string args(const std::string& dir, const std::string& more) {
  return " train " + quickstart() + " run.dir=" + dir +
         " run.steps=3 run.log_every=1 checkpoint.every=3 topology.file=" + dgx1() +
         " topology.emulation_scale=300 topology.chunk_mb=0.25 " + more;
}

void expect_links_within_capacity(const std::string& dir, bool expect_traffic) {
  std::ifstream in(dir + "/links.json");
  ASSERT_TRUE(in) << dir + "/links.json";
  const nlohmann::json j = nlohmann::json::parse(in);
  double switch_bytes = 0;
  for (const auto& link : j["links"]) {
    for (int d = 0; d < 2; ++d) {
      const double cap = link["capacity_gbps"][d], peak = link["peak_gbps"][d];
      EXPECT_LE(peak, 1.02 * cap) << link["name"] << " direction " << d;
    }
    if (link["name"].get<std::string>().rfind("switch-uplink", 0) == 0) {
      switch_bytes += link["bytes"][0].get<double>() + link["bytes"][1].get<double>();
    }
  }
  if (expect_traffic) EXPECT_GT(switch_bytes, 1e6);
}

TEST(TopologyEmulation, LinksStayWithinCapacityAndSchedulersTrainBitwiseAlike) {
  if (!have_mpirun()) GTEST_SKIP() << "mpirun (OpenMPI) is not installed";
  const std::string root = scratch("topology_emulation");
  struct Variant {
    std::string name, args;
  };
  const std::vector<Variant> variants{
      {"fifo", "memory.policy=vdnn-all topology.scheduler=fifo"},
      {"topology", "memory.policy=vdnn-all topology.scheduler=topology"},
      {"none", "memory.policy=none topology.scheduler=topology"},
  };
  for (const Variant& v : variants) {
    const Exit e = run("timeout 120 " + mpirun(4) + trainer() + args(root + "/" + v.name, v.args));
    ASSERT_EQ(e.code, 0) << v.name << "\n" << e.output;
    EXPECT_NE(e.output.find("links    busiest"), std::string::npos) << e.output;
    expect_links_within_capacity(root + "/" + v.name, v.name != "none");
  }
  const std::string ckpt = "/checkpoints/step_3.safetensors";
  expect_same_parameters(root + "/topology" + ckpt, root + "/fifo" + ckpt, 0);
  expect_same_parameters(root + "/none" + ckpt, root + "/fifo" + ckpt, 0);
}

// A rank that fails while the others queue for link tokens ends the whole job (MPI_Abort); no
// rank waits forever on the dead rank's tokens.
TEST(TopologyEmulation, AFailureOnOneRankEndsTheJobUnderTheTopologyScheduler) {
  if (!have_mpirun()) GTEST_SKIP() << "mpirun (OpenMPI) is not installed";
  const std::string dir = scratch("topology_failure");
  const Exit e = run("timeout 60 " + mpirun(4) + trainer() +
                     args(dir,
                          "memory.policy=vdnn-all topology.scheduler=topology "
                          "run.steps=50 debug.fail_at_step=3 debug.fail_rank=1"));
  expect_ended_within(e, 40.0);
  EXPECT_NE(e.output.find("rank 1 of 4: error: debug.fail_at_step: injected failure at step 3"),
            std::string::npos)
      << e.output;
}

// One error line naming the key, exit 2.
void expect_config_error(const Exit& e, const std::string& text) {
  EXPECT_EQ(e.code, 2) << e.output;
  EXPECT_NE(e.output.find(text), std::string::npos) << e.output;
}

TEST(TopologyEmulation, BadTopologyInputIsOneErrorNamingTheKey) {
  const std::string dir = scratch("topology_bad_input");
  const std::string base = trainer() + " train " + quickstart() + " run.dir=" + dir +
                           " run.steps=1 memory.policy=vdnn-all topology.file=";
  expect_config_error(run(base + dgx1() + " topology.chunk_mb=0"),
                      "topology.chunk_mb: must be in [0.0625, 1024], got 0");
  expect_config_error(run(base + dgx1() + " topology.chunk_mb=5000"),
                      "topology.chunk_mb: must be in [0.0625, 1024], got 5000");
  expect_config_error(run(base + dgx1() + " topology.duplex_factor=0"),
                      "topology.duplex_factor: must be in (0, 1]");
  // A link of zero speed.
  const std::string zero = dir + "/zero.yaml";
  std::ofstream(zero) << "name: zero-link\npcie: {gbps: 0}\nsockets:\n  - root_complexes:\n"
                         "      - gpus: {count: 2}\n";
  expect_config_error(run(base + zero),
                      "topology.file: " + zero + ":2: 'gbps' must be in [0.01, 1024] GB/s, got 0");
  // Links too slow to train on (issue 15 item 10: 1e-6 GB/s hung `trainer train` silently).
  for (const std::string rate : {"1e-6", "1e-300"}) {
    const std::string slow = dir + "/slow.yaml";
    std::ofstream(slow) << "name: slow-link\npcie: {gbps: " << rate
                        << "}\nsockets:\n  - root_complexes:\n      - gpus: {count: 2}\n";
    const Exit e = run("timeout 60 " + base + slow);
    expect_config_error(
        e, "topology.file: " + slow + ":2: 'gbps' must be in [0.01, 1024] GB/s, got " + rate);
    EXPECT_LT(e.seconds, 20) << "refused at load, not after a hang";
  }
  // Links of unknown speed (an hwloc 1.x export states none).
  const std::string unknown =
      std::string(FERRY_SOURCE_DIR) + "/../shared/topologies/real/2rc-dual-gpu-lstopo.xml";
  if (std::filesystem::exists(unknown)) {
    expect_config_error(run(base + unknown), "has unknown speed");
  }
  // The topology scheduler without a described server.
  expect_config_error(run(trainer() + " train " + quickstart() + " run.dir=" + dir +
                          " run.steps=1 topology.scheduler=topology"),
                      "topology.scheduler: topology needs topology.file");
  // Fewer GPUs than local ranks.
  if (!have_mpirun()) GTEST_SKIP() << "mpirun (OpenMPI) is not installed";
  const std::string one = dir + "/one.yaml";
  std::ofstream(one) << "name: one-gpu\nsockets:\n  - root_complexes:\n      - gpus: {count: 1}\n";
  expect_config_error(run("timeout 60 " + mpirun(2) + base + one),
                      "topology.file: 2 local ranks but topology 'one-gpu' has only 1");
}

}  // namespace
}  // namespace ferry::testing
