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
#include <atomic>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "device/backend_traits.h"
#include "device/device.h"
#include "links/job_ledger.h"
#include "links/memory_shares.h"
#include "tests/common/source_root.h"
#include "tests/trainer/integration/ledger_util.h"
#include "trainer/config/config.h"
#include "trainer/session/memory_share.h"

namespace ferry {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using testing::await;
using testing::complete_lines;
using testing::spawn;
using testing::Spawned;

constexpr uint64_t kMiB = uint64_t{1} << 20;

// A small model whose auto plans offload more as the budget falls; cuDNN's heuristics (nothing
// timed, no search scratch); a metrics line per step.
const std::vector<std::string> kJob = {
    "model.name=alexnet_cifar", "data.batch_size=16",  "run.log_every=1",
    "memory.measure=false",     "memory.policy=auto",  "memory.link_gbps=0.2",
    "checkpoint.every=0",       "device.backend=cuda", "device.algorithms=heuristic",
    "memory.share=true",        "memory.share_wait=60"};

std::string gpu_skip_reason() {
  if (!backend_built(Backend::kCuda)) return "this build has no CUDA backend";
  if (cuda_device_count() == 0) return "no CUDA device present";
  return "";
}

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

std::string shared_job(const std::string& env, uint64_t memory, int seed, int steps,
                       const std::string& dir) {
  std::string command = env + trainer() + " train " + quickstart();
  for (const std::string& a : kJob) command += " " + a;
  return command + " device.memory=" + std::to_string(memory) +
         " run.seed=" + std::to_string(seed) + " run.steps=" + std::to_string(steps) +
         " run.dir=" + dir;
}

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

std::string tail_of(const std::string& path) {
  const std::string text = read_text(path);
  return text.substr(text.size() - std::min<size_t>(text.size(), 3000));
}

bool await_steps(const std::string& dir, size_t steps, double timeout_s) {
  return await(timeout_s, [&] { return complete_lines(dir + "/metrics.jsonl").size() >= steps; });
}

// The GPU's free bytes now, as the driver reports them (this process's context included).
uint64_t gpu_free() {
  size_t free_bytes = 0, total = 0;
  EXPECT_EQ(cudaSetDevice(0), cudaSuccess);
  EXPECT_EQ(cudaMemGetInfo(&free_bytes, &total), cudaSuccess);
  return free_bytes;
}

// Reads the ledger's held record on a thread until stopped, with the GPU's free bytes beside it.
class Watch {
 public:
  explicit Watch(const std::string& name) : ledger_(JobLedger::attach(name)) {
    thread_ = std::thread([this] {
      while (!stop_) {
        read();
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
      read();
    });
  }
  ~Watch() { stop(); }
  const std::vector<HeldRecord>& stop() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
    return records_;
  }
  uint64_t least_free() const { return least_free_; }
  uint64_t most_held() const { return most_held_; }

 private:
  void read() {
    for (HeldRecord& r : ledger_->history(last_)) {
      last_ = r.seq;
      most_held_ = std::max(most_held_, r.held);
      records_.push_back(std::move(r));
    }
    least_free_ = std::min(least_free_, gpu_free());
  }
  std::shared_ptr<JobLedger> ledger_;
  std::thread thread_;
  std::atomic<bool> stop_{false};
  uint64_t last_ = 0;
  uint64_t least_free_ = UINT64_MAX;
  uint64_t most_held_ = 0;
  std::vector<HeldRecord> records_;
};

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

class CudaShare : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string reason = gpu_skip_reason();
    if (!reason.empty()) GTEST_SKIP() << reason;
  }
};

TEST_F(CudaShare, TwoJobsEachWithMoreThanHalfTheGpuRunSideBySide) {
  const testing::PrivateLedger ledger("cudashare");
  const std::string env = "env FERRY_JOB_LEDGER=" + ledger.name + " ";
  const std::string dir = fresh_dir("side_by_side");
  const uint64_t before = gpu_free();
  const uint64_t memory = before / 10 * 6 / kMiB * kMiB;  // two of them exceed the GPU
  Watch watch(ledger.name);
  Spawned a, b;
  a.pid = spawn(shared_job(env, memory, 0, 1000000, dir + "/a"), dir + "/a.log");
  ASSERT_TRUE(await_steps(dir + "/a", 3, 120)) << tail_of(dir + "/a.log");
  b.pid = spawn(shared_job(env, memory, 1, 30, dir + "/b"), dir + "/b.log");
  EXPECT_EQ(b.wait(), 0) << tail_of(dir + "/b.log");
  ASSERT_EQ(waitpid(a.pid, nullptr, WNOHANG), 0)
      << "the first job ended early: " << tail_of(dir + "/a.log");
  ASSERT_EQ(kill(a.pid, SIGKILL), 0);
  EXPECT_EQ(a.wait(), 128 + SIGKILL);
  expect_records_within(watch.stop(), memory);
  expect_steps_within(dir + "/a");
  expect_steps_within(dir + "/b");
  // What the GPU lost while they ran: their heaps' mapped granules (the ledger's record) plus
  // per process the context, library handles and the kernel scratch, which no ledger counts.
  std::printf(
      "cuda-share: device.memory %.0f MiB each of %.0f MiB free; ledger held at most "
      "%.1f MiB, the GPU lost at most %.1f MiB\n",
      double(memory) / kMiB, double(before) / kMiB, double(watch.most_held()) / kMiB,
      double(before - std::min(before, watch.least_free())) / kMiB);
  EXPECT_LT(before - std::min(before, watch.least_free()), memory)
      << "the jobs held more of the GPU than one device.memory";
}

TEST_F(CudaShare, TheFirstJobShrinksWhenTheSecondArrivesAndGrowsWhenItLeaves) {
  std::vector<std::string> overrides = kJob;
  const Config config = load_config(quickstart(), overrides);
  const ShareCurve curve = held_curve(share_curve(config), share_reserve(config));
  ShareJob job;
  job.lower = curve.lower;
  job.peak = curve.peak;
  job.ladder = curve.ladder;
  const uint64_t alone =
      divide_memory(uint64_t{1} << 40, {job}, ShareObjective::kThroughput).jobs[0].share;
  ASSERT_GT(alone, curve.lower) << "the curve has no room to shrink";
  // Both lower bounds fit, not the first at its budget alone beside the second's lower bound.
  const uint64_t capacity = 2 * curve.lower + (alone - curve.lower) / 2;
  const testing::PrivateLedger ledger("cudasharereplan");
  const std::string env = "env FERRY_JOB_LEDGER=" + ledger.name + " ";
  const std::string dir = fresh_dir("replan");
  Watch watch(ledger.name);
  Spawned a, b;
  a.pid = spawn(shared_job(env, capacity, 0, 1000000, dir + "/a"), dir + "/a.log");
  ASSERT_TRUE(await_steps(dir + "/a", 3, 120)) << tail_of(dir + "/a.log");
  b.pid = spawn(shared_job(env, capacity, 1, 40, dir + "/b"), dir + "/b.log");
  EXPECT_EQ(b.wait(), 0) << tail_of(dir + "/b.log");
  // The first job's log: a smaller budget for the arrival, a larger one once it left.
  const auto said = [&](const std::string& what) {
    return read_text(dir + "/a.log").find(what) != std::string::npos;
  };
  EXPECT_TRUE(await(30, [&] { return said(" left; share "); })) << tail_of(dir + "/a.log");
  EXPECT_TRUE(said(" arrived; share ")) << tail_of(dir + "/a.log");
  ASSERT_EQ(kill(a.pid, SIGKILL), 0);
  EXPECT_EQ(a.wait(), 128 + SIGKILL);
  expect_records_within(watch.stop(), capacity);
  expect_steps_within(dir + "/a");
  expect_steps_within(dir + "/b");
}

}  // namespace
}  // namespace ferry
