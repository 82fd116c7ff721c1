// The simulator against the emulation it models (issue 10's must-hold): 4 CPU ranks standing in
// for GPUs of the DGX-1-like server under mpirun, fifo and topology; `trainer simulate
// --emulated` of each run predicts its measured step time within 15%. A sensitivity check shows
// the comparison can fail: the same simulation with the links twice as fast is off by more.
#include <algorithm>
#include <fstream>
#include <sstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tests/trainer/integration/run_util.h"

namespace ferry::testing {
namespace {

std::string quickstart() { return std::string(FERRY_SOURCE_DIR) + "/configs/quickstart.yaml"; }
std::string dgx1() { return std::string(FERRY_SOURCE_DIR) + "/configs/topologies/dgx1-like.yaml"; }

constexpr int kRanks = 4;
constexpr int kBatch = 32;  // quickstart's, per rank

// Median seconds per step over steps `from`..end, from metrics.jsonl (one line per step).
double measured_step_seconds(const std::string& dir, int from) {
  std::ifstream in(dir + "/metrics.jsonl");
  std::vector<double> steps;
  for (std::string line; std::getline(in, line);) {
    const nlohmann::json j = nlohmann::json::parse(line);
    if (j["step"].get<int>() >= from)
      steps.push_back(kBatch * kRanks / j["samples_per_s"].get<double>());
  }
  if (steps.empty()) return 0;
  std::sort(steps.begin(), steps.end());
  return steps[steps.size() / 2];
}

double simulated_step_seconds(const std::string& dir, const std::string& more = "") {
  const Exit e = run(trainer() + " simulate " + dir + "/config.yaml " + more + " --emulated " +
                     dir + " --json");
  EXPECT_EQ(e.code, 0) << e.output;
  if (e.code != 0) return 0;
  return nlohmann::json::parse(e.output)["step_s"].get<double>();
}

// LeNet-5 at batch 32 per rank offloading every activation (vdnn-all) through links slowed 300x
// (about 52 MB/s per GPU link, 0.25 MiB chunks): link time is most of the step (about 0.13 s,
// 0.12 s of it compute waiting for copies), so the prediction rests on the link model.
//
// Calibration: per-step compute times come from the same run's traced steps 2-3 (the run's
// own trace_rank<r>.json), and the step time is measured over the untraced steps 4-8. The 4
// ranks share 2 cores, and how fast each computes depends on how many others compute at that
// moment (a rank waiting for a copy sleeps and frees its core); timing the ops in a separate
// calibration run (alone, or 4 ranks that never wait) would measure another machine. The
// traced spans are compute only: waits for copies are their own spans, and the load step's
// span (its input upload over the emulated link) is replaced by that upload as a copy. What the
// simulator predicts is therefore the stalls: every copy, its sharing of the switch uplinks and
// root complex with the other ranks, the chunk arbitration under topology.
// The measured side is wall-clock time of 4 ranks on 2 cores: a burst of other work on the
// machine shows up as a slower measured step, never a faster one. So each scheduler gets up to
// two runs, and the closer one must be within 15% (both are printed). Under topology the
// arbiter's hand-off between chunks costs no link time in the emulation either: a copy claims
// its next chunk while the current one moves (Note [Chunk pipelining] in link_emulator.cc), as
// the simulator does; before that, a fresh minimal root measured 18-21% slower than simulated.
TEST(SimulateEmulation, PredictsTheEmulatedStepTimeWithin15Percent) {
  if (!have_mpirun()) GTEST_SKIP() << "mpirun (OpenMPI) is not installed";
  const std::string root = scratch("simulate_emulation");
  for (const std::string scheduler : {"fifo", "topology"}) {
    double best_error = 1e9, best_measured = 0, best_predicted = 0;
    std::string dir;
    for (int attempt = 1; attempt <= 2 && std::abs(best_error) > 0.15; ++attempt) {
      dir = root + "/" + scheduler + "_" + std::to_string(attempt);
      const Exit e = run("timeout 120 " + mpirun(kRanks) + trainer() + " train " + quickstart() +
                         " run.dir=" + dir +
                         " run.steps=10 run.log_every=1 checkpoint.every=0 run.trace=true"
                         " run.trace_steps=[2,3] memory.policy=vdnn-all topology.file=" +
                         dgx1() +
                         " topology.emulation_scale=300 topology.chunk_mb=0.25"
                         " topology.scheduler=" +
                         scheduler);
      ASSERT_EQ(e.code, 0) << scheduler << "\n" << e.output;
      const double measured = measured_step_seconds(dir, 4);
      const double predicted = simulated_step_seconds(dir);
      ASSERT_GT(measured, 0);
      const double error = (predicted - measured) / measured;
      std::printf("%-8s run %d: measured %.4f s/step, simulated %.4f s/step, error %+.1f%%\n",
                  scheduler.c_str(), attempt, measured, predicted, 100 * error);
      if (std::abs(error) < std::abs(best_error)) {
        best_error = error;
        best_measured = measured;
        best_predicted = predicted;
      }
    }
    EXPECT_LE(std::abs(best_error), 0.15) << scheduler << ": measured " << best_measured
                                          << " s, simulated " << best_predicted << " s";
    // The check can fail: links twice as fast (half the emulation scale) miss by far more.
    const double fast = simulated_step_seconds(dir, "topology.emulation_scale=150");
    EXPECT_GT(std::abs(fast - best_measured) / best_measured, 0.3) << scheduler << ": " << fast;
  }
}

}  // namespace
}  // namespace ferry::testing
