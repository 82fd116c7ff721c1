// `trainer jobs`: prints the node's job ledger (a private one, FERRY_JOB_LEDGER) as a table and
// as JSON, with the jobs this test registers; an absent ledger is not an error.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <thread>

#include <nlohmann/json.hpp>

#include "jobs/job_ledger.h"
#include "tests/trainer/integration/ledger_util.h"
#include "tests/trainer/integration/run_util.h"

namespace ferry {
namespace {

using testing::await_ledger;
using testing::run;
using testing::spawn;
using testing::trainer;

struct PrivateLedger : testing::PrivateLedger {
  PrivateLedger() : testing::PrivateLedger("clitest") {}
};

TEST(JobsCli, PrintsEveryGpuAndJobOfTheLedger) {
  const PrivateLedger ledger_name;
  const std::string& name = ledger_name.name;
  const std::string env = "FERRY_JOB_LEDGER=" + name + " ";
  testing::Exit none = run(env + trainer() + " jobs");
  EXPECT_EQ(none.code, 0) << none.output;
  EXPECT_NE(none.output.find("no ferry job shares a GPU"), std::string::npos) << none.output;

  auto ledger = JobLedger::attach(name);
  JobRequest a;
  a.device = "cpu:0";
  a.capacity = 3 << 20;
  a.config = "configs/quickstart.yaml";
  a.run_dir = "runs/quickstart";
  a.curve.lower = 1 << 20;
  a.curve.peak = 2 << 20;
  a.curve.ladder = {{a.curve.lower, 0.5}, {a.curve.peak, 0.25}};
  const JobGrant ga = ledger->join(a);
  ledger->report(ga.id, 1 << 20, 0.3);
  JobRequest b = a;
  b.config = "configs/other.yaml";
  b.run_dir = "runs/other";
  const JobGrant gb = ledger->join(b);

  const testing::Exit table = run(env + trainer() + " jobs");
  EXPECT_EQ(table.code, 0) << table.output;
  EXPECT_NE(table.output.find("cpu:0: capacity 3.00 MiB, objective throughput, 2 jobs"),
            std::string::npos)
      << table.output;
  EXPECT_NE(table.output.find("configs/quickstart.yaml -> runs/quickstart"), std::string::npos);
  EXPECT_NE(table.output.find("configs/other.yaml -> runs/other"), std::string::npos);
  EXPECT_NE(table.output.find("0.300 s"), std::string::npos) << table.output;  // measured

  const testing::Exit json = run(env + trainer() + " jobs --json");
  ASSERT_EQ(json.code, 0) << json.output;
  const nlohmann::json j = nlohmann::json::parse(json.output);
  EXPECT_EQ(j["ledger"], name);
  ASSERT_EQ(j["gpus"].size(), 1u);
  const auto& gpu = j["gpus"][0];
  EXPECT_EQ(gpu["capacity"], 3u << 20);
  ASSERT_EQ(gpu["jobs"].size(), 2u);
  EXPECT_EQ(gpu["jobs"][0]["pid"], getpid());
  EXPECT_EQ(gpu["jobs"][0]["held"], 1u << 20);
  EXPECT_EQ(gpu["jobs"][0]["share"], ledger->poll(ga.id).share);
  EXPECT_EQ(gpu["jobs"][1]["run_dir"], "runs/other");
  EXPECT_EQ(gpu["jobs"][1]["lower"], 1u << 20);
  EXPECT_EQ(gpu["jobs"][1]["share"], ledger->poll(gb.id).share);
  EXPECT_DOUBLE_EQ(gpu["jobs"][0]["measured_step_s"].get<double>(), 0.3);
  EXPECT_EQ(gpu["jobs"][0]["ladder"].size(), 2u);
  EXPECT_EQ(gpu["jobs"][1]["reason"],
            "job " + std::to_string(gb.id) + " (pid " + std::to_string(getpid()) + ") arrived");
}

size_t count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

TEST(JobsCli, ATrainingJobWaitsForItsShareThenGivesUpWithExitCode2OrTrains) {
  const PrivateLedger ledger_name;
  const std::string& name = ledger_name.name;
  const std::string env = "FERRY_JOB_LEDGER=" + name + " ";
  const std::string dir = testing::scratch("jobs_cli_share");
  const std::string train = env + trainer() + " train " + FERRY_SOURCE_DIR +
                            "/configs/quickstart.yaml run.dir=" + dir +
                            " run.steps=3 memory.share=true memory.measure=false";
  // This test holds the whole of cpu:0 (the quickstart's device.memory, 512 MiB).
  auto ledger = JobLedger::attach(name);
  JobRequest all;
  all.device = "cpu:0";
  all.capacity = 512u << 20;
  all.config = "holder.yaml";
  all.curve.lower = all.curve.peak = 512u << 20;
  all.curve.ladder = {{all.curve.lower, 1.0}};
  const JobGrant held = ledger->join(all);
  ledger->report(held.id, 512u << 20);
  const testing::Exit waited = run(train + " memory.share_wait=0.3");
  EXPECT_EQ(waited.code, 2) << waited.output;
  EXPECT_EQ(count(waited.output, "memory.share: waiting until cpu:0 (capacity 512.00 MiB)"), 1u)
      << waited.output;
  EXPECT_NE(waited.output.find("held by job 1 (pid " + std::to_string(getpid()) +
                               ", holder.yaml): share 512.00 MiB"),
            std::string::npos)
      << waited.output;
  EXPECT_EQ(count(waited.output, "error: memory.share_wait: waited 0.3 s"), 1u) << waited.output;
  EXPECT_EQ(ledger->snapshot().at(0).jobs.size(), 1u);
  ledger->leave(held.id);
  const testing::Exit trained = run(train);
  EXPECT_EQ(trained.code, 0) << trained.output;
  EXPECT_NE(trained.output.find("memory.share: budget"), std::string::npos) << trained.output;
  EXPECT_TRUE(ledger->snapshot().empty());  // it left when it ended
}

TEST(JobsCli, AJobKilledWithSigkillGivesItsShareToAWaitingJobWithinSeconds) {
  const PrivateLedger ledger_name;
  const std::string& name = ledger_name.name;
  const std::string env = "env FERRY_JOB_LEDGER=" + name + " ";
  const std::string dir = testing::scratch("jobs_cli_kill");
  // The quickstart needs 5.22 MiB: two do not fit in 8 MiB.
  const std::string train = env + trainer() + " train " + FERRY_SOURCE_DIR +
                            "/configs/quickstart.yaml device.memory=8MiB memory.share=true "
                            "memory.measure=false checkpoint.every=0 ";
  auto ledger = JobLedger::attach(name);
  const pid_t first = spawn(train + "run.steps=100000 run.dir=" + dir + "/a", dir + "/a.log");
  ASSERT_GT(first, 0);
  struct Reaper {  // a failed assertion leaves no trainer running
    pid_t pid;
    ~Reaper() {
      if (kill(pid, SIGKILL) == 0) waitpid(pid, nullptr, 0);
    }
  } reaper{first};
  const auto running = [](const std::vector<LedgerGpu>& gpus) {
    return gpus.size() == 1 && gpus[0].jobs.size() == 1 && !gpus[0].jobs[0].waiting;
  };
  ASSERT_TRUE(await_ledger(*ledger, 60, running)) << "the first job never started";
  testing::Exit second;
  std::thread waits(
      [&] { second = run(train + "run.steps=3 memory.share_wait=60 run.dir=" + dir + "/b"); });
  const bool queued = await_ledger(*ledger, 60, [](const std::vector<LedgerGpu>& gpus) {
    return gpus.size() == 1 && gpus[0].jobs.size() == 2 && gpus[0].jobs[1].waiting;
  });
  EXPECT_TRUE(queued) << "the second job never queued";
  ASSERT_EQ(kill(first, SIGKILL), 0);
  const auto killed = std::chrono::steady_clock::now();
  EXPECT_TRUE(await_ledger(*ledger, 5, [&](const std::vector<LedgerGpu>& gpus) {
    return gpus.size() == 1 && gpus[0].jobs.size() == 1 && gpus[0].jobs[0].pid != first &&
           !gpus[0].jobs[0].waiting;
  })) << "the second job was not admitted within 5 s of the kill";
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - killed).count(), 5);
  waits.join();
  int status = 0;
  EXPECT_EQ(waitpid(first, &status, 0), first);
  EXPECT_TRUE(WIFSIGNALED(status));
  EXPECT_EQ(second.code, 0) << second.output;
  EXPECT_EQ(count(second.output, "memory.share: waiting until cpu:0"), 1u) << second.output;
  for (const LedgerGpu& g : ledger->snapshot()) EXPECT_LE(g.peak_held, g.capacity);
}

}  // namespace
}  // namespace ferry
