// Checkpoints: 10 steps straight equal 5 steps, stop, resume, 5 steps (bitwise on one rank,
// within 1e-6 on two); a checkpoint interrupted mid-write (the writer killed) leaves the
// previous one loadable and resumable.
#include <csignal>
#include <thread>

#include <gtest/gtest.h>

#include "tests/trainer/integration/run_util.h"

namespace ferry::testing {
namespace {

std::string args(const std::string& dir, int steps, const std::string& resume) {
  return " train " + std::string(FERRY_SOURCE_DIR) + "/configs/quickstart.yaml run.dir=" + dir +
         " run.steps=" + std::to_string(steps) +
         " data.samples=160 data.batch_size=16 checkpoint.every=5 checkpoint.keep=0 "
         "checkpoint.dir=" +
         dir + "/ckpt" + (resume.empty() ? "" : " checkpoint.resume=" + resume);
}

TEST(Resume, FivePlusFiveStepsEqualTenStepsBitwise) {
  const std::string straight = scratch("resume_straight");
  Exit e = run(trainer() + args(straight, 10, ""));
  ASSERT_EQ(e.code, 0) << e.output;
  const std::string split = scratch("resume_split");
  e = run(trainer() + args(split, 5, ""));
  ASSERT_EQ(e.code, 0) << e.output;
  e = run(trainer() + args(split, 10, "latest"));
  ASSERT_EQ(e.code, 0) << e.output;
  EXPECT_NE(e.output.find("resumed"), std::string::npos) << e.output;
  // 160 samples at 16 a batch: step 10 crosses into the second epoch, so the resumed run must
  // also continue the data order exactly.
  expect_same_parameters(split + "/ckpt/step_10.safetensors",
                         straight + "/ckpt/step_10.safetensors", 0.0);
}

TEST(Resume, TwoRanksResumeWithin1e6) {
  if (!have_mpirun()) GTEST_SKIP() << "mpirun (OpenMPI) is not installed";
  const std::string straight = scratch("resume2_straight");
  Exit e = run(mpirun(2) + trainer() + args(straight, 10, "") + " data.batch_size=8");
  ASSERT_EQ(e.code, 0) << e.output;
  const std::string split = scratch("resume2_split");
  e = run(mpirun(2) + trainer() + args(split, 5, "") + " data.batch_size=8");
  ASSERT_EQ(e.code, 0) << e.output;
  e = run(mpirun(2) + trainer() + args(split, 10, "latest") + " data.batch_size=8");
  ASSERT_EQ(e.code, 0) << e.output;
  expect_same_parameters(split + "/ckpt/step_10.safetensors",
                         straight + "/ckpt/step_10.safetensors", 1e-6);
}

TEST(Resume, AKilledWriterLeavesThePreviousCheckpointLoadable) {
  const std::string dir = scratch("resume_killed");
  // Checkpoint every step; kill the trainer at staggered moments, many of them mid-write.
  for (int attempt = 0; attempt < 4; ++attempt) {
    const std::string command = trainer() + " train " + std::string(FERRY_SOURCE_DIR) +
                                "/configs/quickstart.yaml run.dir=" + dir +
                                " run.steps=100000 data.batch_size=4 checkpoint.every=1 "
                                "memory.measure=false "  // checkpoints from the first second
                                "checkpoint.keep=2 checkpoint.resume=latest checkpoint.dir=" +
                                dir + "/ckpt > /dev/null 2>&1 & echo $!";
    const Exit started = run(command);
    const int pid = std::stoi(started.output);
    std::this_thread::sleep_for(std::chrono::milliseconds(700 + 137 * attempt));
    ::kill(pid, SIGKILL);
    run("while kill -0 " + std::to_string(pid) + " 2>/dev/null; do sleep 0.05; done");
  }
  // Every complete-named checkpoint loads; half-written files only ever have temp names.
  int complete = 0;
  int64_t newest = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir + "/ckpt")) {
    const std::string name = entry.path().filename().string();
    if (name.find(".tmp.") != std::string::npos) continue;
    EXPECT_NO_THROW(parameters(entry.path().string())) << name;
    newest = std::max<int64_t>(newest, std::stoll(name.substr(5)));
    ++complete;
  }
  ASSERT_GT(complete, 0);
  // And training resumes from the newest, for one more step.
  const Exit e =
      run(trainer() + " train " + std::string(FERRY_SOURCE_DIR) +
          "/configs/quickstart.yaml run.dir=" + dir + " run.steps=" + std::to_string(newest + 1) +
          " data.batch_size=4 checkpoint.resume=latest checkpoint.dir=" + dir + "/ckpt");
  EXPECT_EQ(e.code, 0) << e.output;
  EXPECT_NE(e.output.find("resumed"), std::string::npos);
}

}  // namespace
}  // namespace ferry::testing
