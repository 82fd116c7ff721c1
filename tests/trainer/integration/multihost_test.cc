// One job over two hosts made of Linux namespaces (scripts/multihost.sh): 4 ranks, 2 per host,
// train as 4 ranks on one host do (within the data-parallel tolerance: TCP between hosts
// reduces in another order than shared memory), each host keeps its own /dev/shm, and nothing
// is left behind. A failure on the other host ends the whole job within the bound one node has
// (30 s, comm.timeout_s 10 for a stopped rank), naming the rank or the host: a rank that fails, a
// rank that stops, a host whose processes all die, a host cut off the network. Skips where
// namespaces cannot be made (not root, or no unshare).
#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tests/trainer/integration/run_util.h"

namespace ferry::testing {
namespace {

std::string source(const std::string& path) { return std::string(FERRY_SOURCE_DIR) + "/" + path; }

std::string train_args(const std::string& dir) {
  return " train " + source("configs/quickstart.yaml") + " run.dir=" + dir +
         " run.steps=10 data.batch_size=8 data.samples=512 checkpoint.every=10 "
         "memory.measure=false topology.bind=false";
}

// Namespaces of multihost.sh runs whose script is gone ("ferry<pid>-h<k>", "ferry<pid>-br"): what
// a run left behind. A run still going elsewhere keeps its own, and the script sweeps those of
// runs killed outright before it starts, so this names only a leak.
std::string leaked_namespaces() {
  return run("for ns in $(ip netns list | awk '{print $1}' | grep -E '^ferry[0-9]+-'); do "
             "p=${ns#ferry}; kill -0 ${p%%-*} 2>/dev/null || echo $ns; done")
      .output;
}

bool namespaces_available(std::string* why) {
  if (::geteuid() != 0) {
    *why = "not root: network, UTS, IPC and mount namespaces need it";
    return false;
  }
  const Exit e = run("unshare --uts --ipc --mount --net true");
  if (e.code != 0) {
    *why = "unshare refused here: " + e.output;
    return false;
  }
  const std::string probe = "ferry-probe-" + std::to_string(::getpid());
  const Exit ns = run("ip netns add " + probe + " && ip netns del " + probe);
  if (ns.code != 0) {
    *why = "ip netns refused here: " + ns.output;
    return false;
  }
  return true;
}

// Each test skips without mpirun or where namespaces cannot be made.
class MultiHost : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    if (!have_mpirun()) GTEST_SKIP() << "mpirun (OpenMPI) is not installed";
    if (!namespaces_available(&why)) GTEST_SKIP() << why;
  }
};

TEST_F(MultiHost, TwoHostsOfTwoRanksTrainAsFourRanksOnOneHost) {
  const std::string one = scratch("multihost_one");
  Exit e = run(mpirun(4) + trainer() + train_args(one));
  ASSERT_EQ(e.code, 0) << e.output;
  const std::string two = scratch("multihost_two");
  e = run(source("scripts/multihost.sh") + " --hosts 2 --ranks-per-host 2 --" + train_args(two));
  ASSERT_EQ(e.code, 0) << e.output;
  EXPECT_NE(e.output.find("ranks    4 (2 on this machine)"), std::string::npos) << e.output;
  // Each node's own bindings, in rank order.
  const size_t node0 = e.output.find("node ferry-host0 (first rank 0)\nrank  gpu");
  const size_t node1 = e.output.find("node ferry-host1 (first rank 2)\nrank  gpu");
  EXPECT_NE(node0, std::string::npos) << e.output;
  EXPECT_NE(node1, std::string::npos) << e.output;
  EXPECT_LT(node0, node1);
  expect_same_parameters(two + "/checkpoints/step_10.safetensors",
                         one + "/checkpoints/step_10.safetensors", 1e-5);
  // Emulating the DGX-1-like server's links: each host's ranks share a ledger of their own (in
  // that host's /dev/shm), which measures that host's copies only.
  const std::string links = scratch("multihost_links");
  e = run(source("scripts/multihost.sh") + " --hosts 2 --ranks-per-host 2 --" + train_args(links) +
          " run.steps=3 memory.policy=vdnn-all topology.scheduler=topology topology.file=" +
          source("configs/topologies/dgx1-like.yaml") +
          " topology.emulation_scale=300 topology.chunk_mb=0.25");
  ASSERT_EQ(e.code, 0) << e.output;
  for (const char* host : {"ferry-host0", "ferry-host1"}) {
    std::ifstream in(links + "/links." + host + ".json");
    ASSERT_TRUE(in) << "no ledger report of " << host;
    const nlohmann::json j = nlohmann::json::parse(in);
    double carried = 0;
    for (const auto& link : j["links"]) carried += link["bytes"][0].get<double>();
    EXPECT_GT(carried, 0.0) << host << "'s ledger saw no copy";
  }
  // The hosts, their namespaces and their shared memory are gone.
  EXPECT_EQ(leaked_namespaces(), "");
}

// The other host's rank 3 fails, then stops (SIGSTOP): the job ends within the bound one node
// has (data_parallel_test), with rank 3's own message, then with rank 0's watchdog naming it.
// Across hosts joined by TCP alone MPI makes no one-sided window: rank 3 is named because it
// does not answer (Note [Arrivals without a window] in comm/mpi_arrivals.h).
TEST_F(MultiHost, ARankOfTheOtherHostThatFailsOrStopsEndsTheJobNamingIt) {
  const std::string launch =
      "timeout 120 " + source("scripts/multihost.sh") + " --hosts 2 --ranks-per-host 2 --";
  Exit e = run(launch + train_args(scratch("multihost_fail")) +
               " run.steps=50 debug.fail_at_step=3 debug.fail_rank=3");
  expect_ended_within(e, 30.0);
  EXPECT_NE(e.output.find("rank 3 of 4: error: debug.fail_at_step: injected failure at step 3"),
            std::string::npos)
      << e.output;
  e = run(launch + train_args(scratch("multihost_stall")) +
          " run.steps=50 debug.stall_at_step=3 debug.fail_rank=3 comm.timeout_s=10");
  expect_ended_within(e, 30.0);
  EXPECT_NE(e.output.find("rank 3 of 4: debug.stall_at_step: stopping this rank (SIGSTOP)"),
            std::string::npos)
      << e.output;
  EXPECT_NE(e.output.find("error: comm.timeout_s: all-reduce #"), std::string::npos) << e.output;
  EXPECT_NE(e.output.find("rank 3 did not answer (stopped or hung)"), std::string::npos)
      << e.output;
  EXPECT_NE(e.output.find("hint: check what rank 3 is doing"), std::string::npos) << e.output;
  EXPECT_EQ(leaked_namespaces(), "");
}

// Host 1 of a job under scripts/multihost.sh; `action` is a shell command that takes `$ns`, each
// of its namespaces. Starts the job (in the background), waits for its first checkpoint, acts,
// and returns the job's exit, the seconds from the action to the end, and whether it had saved.
struct HostLoss {
  Exit ended;
  double seconds = 0;
  bool saved = false;
};
HostLoss lose_host_one(const std::string& job, const std::string& dir, const std::string& action) {
  HostLoss out;
  std::thread runner([&] { out.ended = run(job); });
  const std::string first = dir + "/checkpoints/step_20.safetensors";
  for (int i = 0; i < 600 && !std::filesystem::exists(first); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  out.saved = std::filesystem::exists(first);
  const auto at = std::chrono::steady_clock::now();
  run("for ns in $(ip netns list | awk '/^ferry[0-9]+-h1/ {print $1}'); do " + action + "; done");
  runner.join();
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - at).count();
  return out;
}

// A whole host vanishing (every process in its namespaces killed) ends the job within seconds,
// naming the host; the job resumes from its last checkpoint.
TEST_F(MultiHost, AVanishedHostEndsTheJobAndItResumesFromItsLastCheckpoint) {
  const std::string dir = scratch("multihost_vanish");
  const std::string launch = source("scripts/multihost.sh") + " --hosts 2 --ranks-per-host 2 --";
  const std::string job = "timeout 120 " + launch + train_args(dir) +
                          " run.steps=100000 run.log_every=100 checkpoint.every=20";
  // Host 1 of this job vanishes: every process in its network namespace.
  const HostLoss lost = lose_host_one(job, dir, "kill -9 $(ip netns pids $ns)");
  ASSERT_TRUE(lost.saved) << lost.ended.output;
  EXPECT_NE(lost.ended.code, 0) << lost.ended.output;
  EXPECT_NE(lost.ended.code, 124) << "the job hung until the timeout";
  EXPECT_LT(lost.seconds, 30.0) << "the job must end soon after a host vanishes";
  // OpenMPI names the host whose daemon it lost (or whose peer hung up).
  EXPECT_NE(lost.ended.output.find("ferry-host1"), std::string::npos) << lost.ended.output;
  // Resume: continues from the newest checkpoint to 20 steps past it.
  int64_t newest = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir + "/checkpoints")) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("step_", 0) == 0 && name.find(".tmp.") == std::string::npos) {
      newest = std::max<int64_t>(newest, std::stoll(name.substr(5)));
    }
  }
  const int64_t target = newest + 20;
  const Exit resumed =
      run(launch + train_args(dir) + " checkpoint.every=20 checkpoint.resume=latest" +
          " run.steps=" + std::to_string(target));
  ASSERT_EQ(resumed.code, 0) << resumed.output;
  EXPECT_NE(resumed.output.find("at step " + std::to_string(newest)), std::string::npos)
      << resumed.output;
  EXPECT_TRUE(std::filesystem::exists(dir + "/checkpoints/step_" + std::to_string(target) +
                                      ".safetensors"));
}

// Host 1 drops off the network (its interface goes down; its processes run on): nothing closes,
// so rank 0's watchdog names host 1's ranks after comm.timeout_s, and mpirun ends the job once
// TCP gives up resending to host 1's daemon, soon with the hosts' tcp_retries2 at 5 (Note [A
// host lost from the network] in scripts/multihost.sh).
TEST_F(MultiHost, AHostCutOffTheNetworkEndsTheJobNamingItsRanks) {
  const std::string dir = scratch("multihost_cut");
  const std::string job = "timeout 120 " + source("scripts/multihost.sh") +
                          " --hosts 2 --ranks-per-host 2 --tcp-retries2 5 --" + train_args(dir) +
                          " run.steps=100000 run.log_every=100 checkpoint.every=20 "
                          "comm.timeout_s=10";
  const HostLoss lost = lose_host_one(job, dir, "ip -n $ns link set eth0 down");
  ASSERT_TRUE(lost.saved) << lost.ended.output;
  EXPECT_NE(lost.ended.code, 0) << lost.ended.output;
  EXPECT_NE(lost.ended.code, 124) << "the job hung until the timeout";
  // comm.timeout_s, then about 13 s of TCP retries.
  EXPECT_LT(lost.seconds, 45.0) << lost.ended.output;
  EXPECT_NE(lost.ended.output.find("rank 0 of 4: error: comm.timeout_s: all-reduce #"),
            std::string::npos)
      << lost.ended.output;
  EXPECT_NE(lost.ended.output.find("ranks 2, 3 did not answer (stopped or hung)"),
            std::string::npos)
      << lost.ended.output;
  EXPECT_EQ(leaked_namespaces(), "");
}

// A checkpoint folder only host 0 can read: resuming "latest" would make host 1's ranks start
// fresh beside host 0's resumed ones. The job ends before any step, naming a rank of host 1.
TEST_F(MultiHost, AResumeThatAHostCannotSeeIsRefusedNamingItsRanks) {
  const std::string dir = scratch("multihost_unshared");
  const std::string ckpt = dir + "/local_ckpt";
  const std::string launch = source("scripts/multihost.sh") +
                             " --hosts 2 --ranks-per-host 2 --local-to-host0 " + ckpt + " --";
  Exit e = run(launch + train_args(dir) + " checkpoint.dir=" + ckpt);
  ASSERT_EQ(e.code, 0) << e.output;
  ASSERT_TRUE(std::filesystem::exists(ckpt + "/step_10.safetensors"));
  e = run(launch + train_args(dir) + " checkpoint.dir=" + ckpt +
          " checkpoint.resume=latest run.steps=20");
  EXPECT_NE(e.code, 0) << e.output;
  EXPECT_NE(e.output.find("cannot read it"), std::string::npos) << e.output;
  EXPECT_NE(e.output.find("(host ferry-host1)"), std::string::npos) << e.output;
  EXPECT_NE(e.output.find("hint: put checkpoint.dir on a filesystem every host"), std::string::npos)
      << e.output;
  EXPECT_EQ(e.output.find("\nstep "), std::string::npos) << "no step may run";
}

}  // namespace
}  // namespace ferry::testing
