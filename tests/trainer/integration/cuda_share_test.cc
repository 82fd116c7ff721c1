// Two CUDA jobs sharing one GPU (memory.share; Note [Device memory of a shared GPU] in
// device/cuda/cuda_device.h): (1) each with a device.memory of 60% of the GPU's free memory,
// which one cudaMalloc each could not give both, they run side by side, each holding whole
// 2 MiB granules within its grant; (2) on a capacity that cannot hold both at their peaks, the
// first shrinks when the second arrives and grows back when it leaves, the ledger's record of
// held memory never above the capacity. Skips without a GPU; runs from the GPU bundle
// (RELOCATABLE: the trainer is found beside the test binary).
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "jobs/job_ledger.h"
#include "tests/support/gpu_test.h"
#include "tests/support/source_root.h"
#include "tests/trainer/integration/ledger_util.h"
#include "trainer/config/config.h"
#include "trainer/share/lease.h"

namespace ferry {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using testing::await;
using testing::await_steps;
using testing::complete_lines;
using testing::joined;
using testing::PrivateLedger;
using testing::read_text;
using testing::RecordReader;
using testing::spawn;
using testing::Spawned;
using testing::tail_of;

constexpr uint64_t kMiB = uint64_t{1} << 20;

// A small model whose auto plans offload more as the budget falls; cuDNN's heuristics (nothing
// timed, no search scratch); a metrics line per step.
const std::vector<std::string> kJob = {
    "model.name=alexnet_cifar", "data.batch_size=16",  "run.log_every=1",
    "memory.measure=false",     "memory.policy=auto",  "memory.link_gbps=0.2",
    "checkpoint.every=0",       "device.backend=cuda", "device.algorithms=heuristic",
    "memory.share=true",        "memory.share_wait=60"};

// The trainer beside this binary's folder (build/tests/NAME -> build/trainer).
std::string trainer() {
  return (fs::read_symlink("/proc/self/exe").parent_path().parent_path() / "trainer").string();
}

std::string quickstart() { return test::source_file(fs::path("configs") / "quickstart.yaml"); }

// A fresh folder for this run's jobs, kept afterwards to read a failure.
std::string fresh_dir(const std::string& name) {
  const fs::path dir =
      fs::temp_directory_path() / ("ferry_cuda_share_" + std::to_string(getpid())) / name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir.string();
}

// The GPU's free bytes now, as the driver reports them (this process's context included).
uint64_t gpu_free() {
  size_t free_bytes = 0, total = 0;
  EXPECT_EQ(cudaSetDevice(0), cudaSuccess);
  EXPECT_EQ(cudaMemGetInfo(&free_bytes, &total), cudaSuccess);
  return free_bytes;
}

void expect_records_within(const std::vector<HeldRecord>& records, uint64_t capacity) {
  ASSERT_FALSE(records.empty());
  int most = 0;
  for (const HeldRecord& r : records) {
    EXPECT_EQ(r.capacity, capacity);
    EXPECT_LE(r.held, capacity) << "record " << r.seq;
    most = std::max(most, r.jobs);
  }
  EXPECT_EQ(most, 2) << "the jobs never ran together";
}

// Every logged step: whole granules held, within the grant, the peak within the budget run.
void expect_steps_within(const std::string& dir) {
  const std::vector<std::string> lines = complete_lines(dir + "/metrics.jsonl");
  EXPECT_FALSE(lines.empty()) << dir;
  for (const std::string& line : lines) {
    const json m = json::parse(line);
    const uint64_t held = m["held"], granted = m["granted"], budget = m["budget"];
    EXPECT_EQ(held % kSharedGranule, 0u) << dir << " step " << m["step"];
    EXPECT_LE(held, granted) << dir << " step " << m["step"];
    EXPECT_LT(held, budget + kSharedGranule) << dir << " step " << m["step"];
    EXPECT_LE(m["budget_peak_bytes"].get<uint64_t>(), budget) << dir << " step " << m["step"];
  }
  EXPECT_NE(read_text(dir + ".log").find("mapped on use in 2.00 MiB granules"), std::string::npos)
      << tail_of(dir + ".log");
}

// Two jobs sharing the GPU through a private ledger, each with device.memory `memory`, in dir/a
// and dir/b (their logs beside): a (seed 0) trains until killed; b (seed 1) starts once a has
// logged 3 steps. The ledger's held record is read throughout, with the GPU's least free bytes.
struct TwoJobs {
  TwoJobs(const std::string& ledger_name, const std::string& dir_name, uint64_t memory)
      : ledger(ledger_name), dir(fresh_dir(dir_name)), memory(memory) {}

  // Starts a and, once it has logged 3 steps, b for `b_steps` steps beside it; waits for b's end.
  void run_b_beside_a(int b_steps) {
    a.pid = spawn(command(0, 1000000, dir + "/a"), dir + "/a.log");
    ASSERT_TRUE(await_steps(dir + "/a", 3, 120)) << tail_of(dir + "/a.log");
    b.pid = spawn(command(1, b_steps, dir + "/b"), dir + "/b.log");
    EXPECT_EQ(b.wait(), 0) << tail_of(dir + "/b.log");
  }

  // Kills a; then the ledger's record and both jobs' steps are within `memory`.
  void kill_a_and_check() {
    ASSERT_EQ(kill(a.pid, SIGKILL), 0);
    EXPECT_EQ(a.wait(), 128 + SIGKILL);
    expect_records_within(reader.stop(), memory);
    expect_steps_within(dir + "/a");
    expect_steps_within(dir + "/b");
  }

  std::string command(int seed, int steps, const std::string& run_dir) const {
    return testing::shared_job(ledger, trainer() + " train " + quickstart() + joined(kJob), memory,
                               seed, steps, run_dir);
  }

  const PrivateLedger ledger;
  const std::string dir;
  const uint64_t memory;
  uint64_t least_free = UINT64_MAX;  // written by the reader's thread until it stops
  RecordReader reader{ledger.name, [this] { least_free = std::min(least_free, gpu_free()); }};
  Spawned a, b;
};

class CudaShare : public testing::GpuTest {};

TEST_F(CudaShare, TwoJobsEachWithMoreThanHalfTheGpuRunSideBySide) {
  const uint64_t before = gpu_free();
  const uint64_t memory = before / 10 * 6 / kMiB * kMiB;  // two of them exceed the GPU
  TwoJobs jobs("cudashare", "side_by_side", memory);
  ASSERT_NO_FATAL_FAILURE(jobs.run_b_beside_a(30));
  ASSERT_EQ(waitpid(jobs.a.pid, nullptr, WNOHANG), 0)
      << "the first job ended early: " << tail_of(jobs.dir + "/a.log");
  ASSERT_NO_FATAL_FAILURE(jobs.kill_a_and_check());
  // What the GPU lost while they ran: their heaps' mapped granules (the ledger's record) plus
  // per process the context, library handles and the kernel scratch, which no ledger counts.
  std::printf(
      "cuda-share: device.memory %.0f MiB each of %.0f MiB free; ledger held at most "
      "%.1f MiB, the GPU lost at most %.1f MiB\n",
      double(memory) / kMiB, double(before) / kMiB, double(jobs.reader.most_held()) / kMiB,
      double(before - std::min(before, jobs.least_free)) / kMiB);
  EXPECT_LT(before - std::min(before, jobs.least_free), memory)
      << "the jobs held more of the GPU than one device.memory";
}

TEST_F(CudaShare, TheFirstJobShrinksWhenTheSecondArrivesAndGrowsWhenItLeaves) {
  const testing::ShareBounds bounds = testing::share_bounds(load_config(quickstart(), kJob));
  ASSERT_GT(bounds.alone, bounds.lower) << "the curve has no room to shrink";
  // Both lower bounds fit, not the first at its budget alone beside the second's lower bound.
  const uint64_t capacity = 2 * bounds.lower + (bounds.alone - bounds.lower) / 2;
  TwoJobs jobs("cudasharereplan", "replan", capacity);
  ASSERT_NO_FATAL_FAILURE(jobs.run_b_beside_a(40));
  // The first job's log: a smaller budget for the arrival, a larger one once it left.
  const std::string log = jobs.dir + "/a.log";
  const auto said = [&](const std::string& what) {
    return read_text(log).find(what) != std::string::npos;
  };
  EXPECT_TRUE(await(30, [&] { return said(" left; share "); })) << tail_of(log);
  EXPECT_TRUE(said(" arrived; share ")) << tail_of(log);
  ASSERT_NO_FATAL_FAILURE(jobs.kill_a_and_check());
}

}  // namespace
}  // namespace ferry
