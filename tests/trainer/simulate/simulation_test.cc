// `trainer simulate` as a user meets it: one JSON object with the step, stall, samples/s and
// every link; the same command prints the same bytes; contention-aware auto under the topology
// scheduler moves less over a shared switch than oblivious auto under fifo; bad input is one
// clear error with exit code 2; `trainer plan` says which link bandwidth it assumed.
#include <fstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "device/backend_traits.h"
#include "tests/trainer/integration/run_util.h"

namespace ferry::testing {
namespace {

std::string config(const std::string& model) {
  return std::string(FERRY_SOURCE_DIR) + "/configs/simulate/" + model + "-dgx1.yaml";
}
std::string topology(const std::string& name) {
  return std::string(FERRY_SOURCE_DIR) + "/configs/topologies/" + name + ".yaml";
}
// Commands run from the source tree: the configs name their topology relative to it.
std::string in_source(const std::string& command) {
  return "cd " + std::string(FERRY_SOURCE_DIR) + " && " + command;
}
std::string simulate(const std::string& args) {
  return in_source(trainer()) + " simulate " + config("vgg16") + " --topology " +
         topology("dgx1-like") + " --hardware v100-pcie3 " + args;
}

double link_seconds(const nlohmann::json& j) {
  double s = 0;
  for (const auto& l : j["links"]) s += l["busy_s"].get<double>();
  return s;
}

// --chunk-mb defaults to the config's topology.chunk_mb (and the flag overrides it).
TEST(Simulate, ChunkSizeDefaultsToTheConfigs) {
  const auto step = [](const std::string& args) {
    const Exit e = run(simulate("--scheduler topology --gpus 2 --json " + args));
    EXPECT_EQ(e.code, 0) << e.output;
    return e.code == 0 ? nlohmann::json::parse(e.output)["step_s"].get<double>() : -1.0;
  };
  const double from_config = step("topology.chunk_mb=64");
  EXPECT_EQ(from_config, step("--chunk-mb 64"));
  EXPECT_NE(from_config, step(""));  // 4 MiB chunks
  EXPECT_EQ(step(""), step("topology.chunk_mb=64 --chunk-mb 4"));
}

TEST(Simulate, JsonHasTheStepAndEveryLinkAndIsDeterministic) {
  const Exit a = run(simulate("--scheduler topology --json"));
  ASSERT_EQ(a.code, 0) << a.output;
  const nlohmann::json j = nlohmann::json::parse(a.output);
  for (const char* key : {"step_s", "stall_s", "samples_per_s", "links", "ranks"})
    EXPECT_TRUE(j.contains(key)) << key;
  EXPECT_EQ(j["gpus"].get<int>(), 8);
  EXPECT_NEAR(j["samples_per_s"].get<double>(), 8 * 256 / j["step_s"].get<double>(), 1e-6);
  EXPECT_GE(j["step_s"].get<double>(), j["stall_s"].get<double>());
  ASSERT_EQ(j["links"].size(), 19u);  // 8 GPU + 4 NIC + 4 switch uplinks, 2 root complexes, QPI
  for (const auto& l : j["links"]) {
    for (const char* key : {"name", "capacity_gbps", "bytes", "utilisation"})
      EXPECT_TRUE(l.contains(key)) << key;
    EXPECT_LE(l["utilisation"].get<double>(), 1.0 + 1e-9) << l["name"];
  }
  const Exit b = run(simulate("--scheduler topology --json"));
  EXPECT_EQ(a.output, b.output);
  // A Chrome trace with a track per GPU and the links.
  const std::string trace = scratch("simulate_trace") + "/step.json";
  const Exit t = run(simulate("--gpus 2 --trace " + trace));
  ASSERT_EQ(t.code, 0) << t.output;
  std::ifstream in(trace);
  const nlohmann::json tj = nlohmann::json::parse(in);
  int processes = 0;
  for (const auto& e : tj["traceEvents"]) processes += e["name"] == "process_name";
  EXPECT_EQ(processes, 3);  // GPU0, GPU1, links
}

TEST(Simulate, ContentionAwareAutoUsesLessLinkTimeOnASharedSwitch) {
  const Exit oblivious = run(simulate("--scheduler fifo --json"));
  const Exit aware = run(simulate("--scheduler topology --json"));
  ASSERT_EQ(oblivious.code, 0) << oblivious.output;
  ASSERT_EQ(aware.code, 0) << aware.output;
  const nlohmann::json o = nlohmann::json::parse(oblivious.output);
  const nlohmann::json a = nlohmann::json::parse(aware.output);
  EXPECT_FALSE(o["ranks"][0]["contention_aware"].get<bool>());
  EXPECT_TRUE(a["ranks"][0]["contention_aware"].get<bool>());
  // Two V100s share each gen3 switch uplink: the aware plan assumes half of it.
  EXPECT_NEAR(a["ranks"][0]["assumed_link_gbps"].get<double>(),
              o["ranks"][0]["assumed_link_gbps"].get<double>() / 2, 0.5);
  EXPECT_LT(link_seconds(a), link_seconds(o));
  EXPECT_LT(a["offload_bytes"].get<double>(), o["offload_bytes"].get<double>());
  EXPECT_LT(a["step_s"].get<double>(), o["step_s"].get<double>());
}

// device.precision bf16 on the A100 profile: the precision and the tensors by dtype reported,
// half the offloaded bytes of fp32 under vdnn-all, a faster step; comm.dtype bf16 halves the
// all-reduce's bytes. The V100 profile has no bf16 rate: one line, exit 2.
TEST(Simulate, Bf16PrecisionAndCommDtype) {
  const auto sim = [](const std::string& args) {
    const Exit e = run(in_source(trainer()) + " simulate " + config("vgg16") + " --topology " +
                       topology("dgx1-like") + " --gpus 2 --json memory.policy=vdnn-all " +
                       "memory.budget=16GiB " + args);
    EXPECT_EQ(e.code, 0) << e.output;
    return e.code == 0 ? nlohmann::json::parse(e.output) : nlohmann::json();
  };
  const nlohmann::json f = sim("--hardware a100-pcie4");
  const nlohmann::json b = sim("--hardware a100-pcie4 device.precision=bf16");
  const nlohmann::json w = sim("--hardware a100-pcie4 device.precision=bf16 comm.dtype=bf16");
  ASSERT_FALSE(f.is_null() || b.is_null() || w.is_null());
  EXPECT_EQ(f["precision"], "fp32");
  EXPECT_EQ(b["precision"], "bf16");
  EXPECT_EQ(w["comm_dtype"], "bf16");
  EXPECT_EQ(f["tensor_bytes"]["bf16"].get<uint64_t>(), 0u);
  EXPECT_GT(b["tensor_bytes"]["bf16"].get<uint64_t>(), 0u);
  // Half, up to the arena's alignment of each offloaded tensor.
  EXPECT_NEAR(b["offload_bytes"].get<double>() * 2, f["offload_bytes"].get<double>(),
              1e-3 * f["offload_bytes"].get<double>());
  EXPECT_LT(b["step_s"].get<double>(), f["step_s"].get<double>());
  EXPECT_EQ(b["allreduce_bytes"].get<double>(), f["allreduce_bytes"].get<double>());
  EXPECT_NEAR(w["allreduce_bytes"].get<double>() * 2, b["allreduce_bytes"].get<double>(), 1.0);
  const Exit v100 = run(simulate("device.precision=bf16"));
  EXPECT_EQ(v100.code, 2) << v100.output;
  EXPECT_NE(v100.output.find("device.precision: bf16, but hardware profile 'v100-pcie3'"),
            std::string::npos)
      << v100.output;
}

// A bf16 simulation of a cuda job asks the CUDA kernel table, as `trainer plan` does (Note [bf16
// kernels at plan time] in trainer/plan/planning.cc): the GPT and Llama both simulate in bf16,
// the table having every kernel they launch (a lacking one is refused: CheckBf16Kernels.*).
TEST(Simulate, Bf16OnCudaSimulatesTheZoosTransformersFromTheCudaKernelTable) {
  if (!backend_built(Backend::kCuda)) GTEST_SKIP() << "this build has no CUDA backend (its table)";
  const std::string gpt = in_source(trainer()) + " simulate configs/gpt_text.yaml --topology " +
                          topology("workstation-4gpu") +
                          " --gpus 1 --hardware a100-pcie4 model.layers=1 model.width=32 "
                          "model.heads=2 model.context=16 data.batch_size=2 device.backend=cuda "
                          "device.precision=bf16 ";
  const Exit fused = run(gpt + "2>&1");
  EXPECT_EQ(fused.code, 0) << fused.output;
  const Exit llama = run(gpt + "model.name=llama model.ffn=48 2>&1");
  EXPECT_EQ(llama.code, 0) << llama.output;
}

TEST(Simulate, BadInputIsOneErrorWithExitCode2) {
  const std::string base = in_source(trainer()) + " simulate " + config("vgg16");
  Exit e = run(base + " --hardware tpu-v9");
  EXPECT_EQ(e.code, 2);
  EXPECT_NE(e.output.find("--hardware: unknown hardware profile 'tpu-v9'"), std::string::npos)
      << e.output;
  EXPECT_NE(e.output.find("h100-pcie5"), std::string::npos) << "the hint lists the profiles";
  e = run(simulate("--gpus 9"));
  EXPECT_EQ(e.code, 2);
  EXPECT_NE(e.output.find("--gpus: 9 GPUs asked, but"), std::string::npos) << e.output;
  e = run(base + " --topology /nonexistent.yaml");
  EXPECT_EQ(e.code, 2) << e.output;
  e = run(simulate("--chunk-mb 0"));
  EXPECT_EQ(e.code, 2);
  EXPECT_NE(e.output.find("--chunk-mb"), std::string::npos) << e.output;
  // Values outside the tested envelope (issue 15 item 10): absurd numbers before, now refused.
  const std::string dir = scratch("simulate_bad_input");
  std::ofstream(dir + "/slow.yaml") << "name: slow\npcie: {gbps: 1e-300}\nsockets:\n"
                                       "  - root_complexes:\n      - gpus: {count: 2}\n";
  e = run(base + " --topology " + dir + "/slow.yaml");
  EXPECT_EQ(e.code, 2) << e.output;
  EXPECT_NE(e.output.find("slow.yaml:2: 'gbps' must be in [0.01, 1024] GB/s, got 1e-300"),
            std::string::npos)
      << e.output;
  std::ofstream(dir + "/gpu.yaml") << "compute: {default_tflops: 10, memory_gbps: 900, "
                                      "step_overhead_us: -5}\n"
                                      "link: {to_host_gbps: 12, to_device_gbps: 12}\n";
  e = run(base + " --hardware " + dir + "/gpu.yaml");
  EXPECT_EQ(e.code, 2) << e.output;
  EXPECT_NE(
      e.output.find("gpu.yaml:1: compute.step_overhead_us must be in [0, 1000000] us, got -5"),
      std::string::npos)
      << e.output;
}

// A trace, or the report itself, that cannot be written is an error naming the file and the
// reason, exit 2: never exit 0 with a cut file.
TEST(Simulate, AFullDiskIsAnErrorWithExitCode2) {
  Exit e = run(simulate("--gpus 2 --trace /dev/full"));
  EXPECT_EQ(e.code, 2) << e.output;
  EXPECT_NE(e.output.find("error: cannot write /dev/full: No space left on device"),
            std::string::npos)
      << e.output;
  EXPECT_NE(e.output.find("hint: --trace: give a path"), std::string::npos) << e.output;
  EXPECT_EQ(e.output.find("trace: /dev/full"), std::string::npos) << "no success line";
  e = run(simulate("--gpus 2 --trace /nonexistent-dir/t.json"));
  EXPECT_EQ(e.code, 2) << e.output;
  EXPECT_NE(e.output.find("cannot write /nonexistent-dir/t.json: No such file or directory"),
            std::string::npos)
      << e.output;
  // The JSON report on a full standard output (stdout alone to /dev/full: run() folds the
  // subshell's stderr into its pipe).
  e = run("(" + simulate("--gpus 2 --json") + " >/dev/full)");
  EXPECT_EQ(e.code, 2) << e.output;
  EXPECT_NE(e.output.find("error: cannot write standard output: No space left on device"),
            std::string::npos)
      << e.output;
  // The other commands that print a report or JSON.
  for (const std::string command :
       {" info --model lenet5 --json", " config configs/quickstart.yaml",
        " plan configs/quickstart.yaml --json", " plan configs/quickstart.yaml"}) {
    e = run("(" + in_source(trainer()) + command + " >/dev/full)");
    EXPECT_EQ(e.code, 2) << command << "\n" << e.output;
    EXPECT_NE(e.output.find("error: cannot write standard output: No space left on device"),
              std::string::npos)
        << command << "\n"
        << e.output;
  }
}

TEST(Simulate, PlanSaysWhichLinkBandwidthItAssumed) {
  const std::string plan =
      in_source(trainer()) + " plan " + config("vgg16") + " --hardware v100-pcie3";
  Exit e = run(plan + " topology.scheduler=fifo");
  ASSERT_EQ(e.code, 0) << e.output;
  EXPECT_NE(e.output.find("link: 12.00 GB/s for rank 0 of 8 on dgx1-like: oblivious"),
            std::string::npos)
      << e.output;
  e = run(in_source(trainer()) + " plan " + config("vgg16") +
          " --hardware h100-pcie5 topology.file=");
  ASSERT_EQ(e.code, 0) << e.output;
  EXPECT_NE(e.output.find("link: 49.00 GB/s: h100-pcie5's own link"), std::string::npos)
      << e.output;
  // CPU ranks emulating the server plan against its links slowed by the scale, as they train.
  e = run(in_source(trainer()) + " plan configs/quickstart.yaml" +
          " topology.file=configs/topologies/dgx1-like.yaml topology.emulation_scale=100"
          " topology.scheduler=topology memory.policy=auto");
  ASSERT_EQ(e.code, 0) << e.output;
  EXPECT_NE(e.output.find("link: 0.07877 GB/s emulated (topology.emulation_scale 100) from 7.88 "
                          "GB/s for rank 0 of 8 on dgx1-like: contention-aware"),
            std::string::npos)
      << e.output;
}

// --nodes: the gradient all-reduce leaves each node through its NICs (Note [Rings across
// nodes]): the network links carry it, samples/s counts every node's GPUs, and a topology
// without a NIC or a profile without a network rate is one clear error.
TEST(Simulate, AcrossNodesTheNicsCarryTheAllReduce) {
  const Exit one = run(simulate("--json"));
  const Exit two = run(simulate("--json --nodes 2"));
  ASSERT_EQ(one.code, 0) << one.output;
  ASSERT_EQ(two.code, 0) << two.output;
  const nlohmann::json a = nlohmann::json::parse(one.output);
  const nlohmann::json b = nlohmann::json::parse(two.output);
  EXPECT_FALSE(a.contains("nodes"));
  EXPECT_EQ(b["nodes"].get<int>(), 2);
  const double scaling = b["samples_per_s"].get<double>() / (2 * a["samples_per_s"].get<double>());
  EXPECT_GT(scaling, 0.5);
  EXPECT_LT(scaling, 1.05);
  int networks = 0;
  for (const auto& l : b["links"]) {
    if (l["kind"] != "network") continue;
    ++networks;
    EXPECT_GT(l["bytes"].get<double>(), 0) << l["name"];
  }
  EXPECT_EQ(networks, 4) << "one per EDR adapter of the DGX-1-like node";
  Exit e = run(in_source(trainer()) + " simulate " + config("vgg16") + " --nodes 2");
  EXPECT_EQ(e.code, 2) << e.output;
  EXPECT_NE(e.output.find("network rate is not known"), std::string::npos) << e.output;
  const std::string dir = scratch("simulate_no_nic");
  std::ofstream(dir + "/no-nic.yaml")
      << "name: no-nic\npcie: {gen: 4, width: 16}\nsockets:\n  - cores: 8\n    memory: 64GiB\n"
         "    root_complexes:\n      - gpus: {count: 2}\n";
  e = run(in_source(trainer()) + " simulate " + config("vgg16") + " --topology " + dir +
          "/no-nic.yaml --hardware v100-pcie3 --nodes 2");
  EXPECT_EQ(e.code, 2) << e.output;
  EXPECT_NE(e.output.find("has no network adapter"), std::string::npos) << e.output;
  EXPECT_EQ(e.output.find("error:"), e.output.rfind("error:")) << "one error line: " << e.output;
}

// Note [Ring channels]: one node and many run the same channels, and a second node only turns
// one hop of each channel through a NIC, so more nodes never predict a shorter step for the
// same per-GPU work (issue 27 item 5: vgg16 at batch 4 on v100-pcie3 predicted 0.1307 s on one
// node, 0.1230 s on two).
TEST(Simulate, MoreNodesNeverPredictAShorterStep) {
  for (const char* model : {"vgg16 data.batch_size=4", "gpt2-medium data.batch_size=1",
                            "resnet50 data.batch_size=16"}) {
    for (const char* hardware : {"v100-pcie3", "a100-pcie4"}) {
      for (const char* scheduler : {"fifo", "topology"}) {
        const std::string m(model);
        const std::string name = m.substr(0, m.find(' '));
        double last = 0;
        for (int nodes : {1, 2, 4}) {
          SCOPED_TRACE(m + " " + hardware + " " + scheduler + " nodes " + std::to_string(nodes));
          const Exit e = run(in_source(trainer()) + " simulate " + config(name) +
                             m.substr(name.size()) + " --hardware " + hardware + " --scheduler " +
                             scheduler + " --json --nodes " + std::to_string(nodes));
          ASSERT_EQ(e.code, 0) << e.output;
          const double step = nlohmann::json::parse(e.output)["step_s"].get<double>();
          EXPECT_GE(step, last * (1 - 1e-9));
          last = step;
        }
      }
    }
  }
}

}  // namespace
}  // namespace ferry::testing
