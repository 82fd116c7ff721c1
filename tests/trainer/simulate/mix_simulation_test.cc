// `trainer simulate --mix` (Note [Simulating jobs that share a GPU] in
// trainer/simulate/mix_simulation.h): a lone job in a mix is `trainer simulate` of that job, in
// every arm; under sharing every phase's budgets are the controller's division of the jobs
// present; the static split gives each job the GPU's memory / n and names a job whose lower bound
// does not fit it (and then shares over the jobs it can run); one after another queues; k
// co-running jobs without copies each take k times their step; bad mix input is one error line
// with exit code 2.
#include <algorithm>
#include <cmath>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "jobs/share_controller.h"
#include "tests/support/temp_dir.h"
#include "tests/trainer/integration/run_util.h"

namespace ferry::testing {
namespace {

using nlohmann::json;

// Commands run from the source tree: the configs name their topology relative to it.
std::string in_source(const std::string& args) {
  return "cd " + std::string(FERRY_SOURCE_DIR) + " && " + trainer() + " simulate " + args;
}

json simulate_json(const std::string& args) {
  const Exit e = run(in_source(args + " --json"));
  EXPECT_EQ(e.code, 0) << e.output;
  return e.code == 0 ? json::parse(e.output) : json::object();
}

const json& arm(const json& report, const std::string& name) {
  for (const json& a : report["arms"])
    if (a["arm"] == name) return a;
  ADD_FAILURE() << "no arm " << name << " in " << report.dump(2);
  static const json none = json::object();
  return none;
}

bool close(double a, double b) { return std::abs(a - b) <= 1e-9 * std::max(std::abs(b), 1.0); }

// One job alone: every arm runs it at its peak, as `trainer simulate` of its config; with a
// memory.budget below its peak (20 GiB at batch 1536), at that budget.
TEST(SimulateMix, ALoneJobIsTrainerSimulateOfThatJob) {
  TempDir dir;
  for (const std::string budget : {"", "20GiB"}) {
    const std::string set =
        budget.empty() ? "[data.batch_size=512]" : "[data.batch_size=1536, memory.budget=20GiB]";
    const std::string mix = dir.write("alone.yaml",
                                      "jobs:\n"
                                      "  - config: configs/simulate/mix/resnet18.yaml\n"
                                      "    set: " +
                                          set +
                                          "\n"
                                          "    arrive_s: 5\n"
                                          "    steps: 100\n");
    const json m = simulate_json("--mix " + mix + " --hardware h100-pcie5");
    const json one =
        simulate_json("configs/simulate/mix/resnet18.yaml --hardware h100-pcie5 --gpus 1 " +
                      std::string(budget.empty() ? "data.batch_size=512"
                                                 : "data.batch_size=1536 memory.budget=20GiB"));
    ASSERT_EQ(m["jobs"].size(), 1u) << m.dump(2);
    const json& job = m["jobs"][0];
    const double step = one["step_s"].get<double>();
    EXPECT_EQ(job["alone_step_s"].get<double>(), step) << budget;
    EXPECT_EQ(m["memory_bytes"].get<uint64_t>(), uint64_t{80} << 30) << "the job's device.memory";
    if (budget.empty()) {
      EXPECT_EQ(job["peak_bytes"], one["peak_bytes"]);
    } else {
      EXPECT_EQ(job["peak_bytes"].get<uint64_t>(), uint64_t{20} << 30) << "capped by its budget";
      EXPECT_GT(one["recompute_flops"].get<double>() + one["offload_bytes"].get<double>(), 0);
    }
    ASSERT_EQ(m["arms"].size(), 3u) << "share, static, sequential: " << m.dump(2);
    for (const json& a : m["arms"]) {
      const json& o = a["jobs"][0];
      ASSERT_TRUE(o["ran"].get<bool>()) << a.dump(2);
      EXPECT_EQ(o["start_s"].get<double>(), 5.0) << a["arm"];
      EXPECT_TRUE(close(o["completion_s"].get<double>(), 100 * step)) << a["arm"];
      EXPECT_TRUE(close(a["samples_per_s"].get<double>(), job["batch"].get<double>() / step))
          << a["arm"];
      ASSERT_EQ(a["phases"].size(), 1u) << a.dump(2);
      EXPECT_EQ(a["phases"][0]["running"][0]["step_s"].get<double>(), step) << a["arm"];
      EXPECT_EQ(a["phases"][0]["running"][0]["budget_bytes"], job["peak_bytes"]) << a["arm"];
    }
  }
}

ShareJob share_job(const json& job, uint64_t order) {
  ShareJob s;
  s.curve.lower = job["lower_bytes"].get<uint64_t>();
  s.curve.peak = job["peak_bytes"].get<uint64_t>();
  for (const json& p : job["ladder"])
    s.curve.ladder.push_back({p["budget_bytes"].get<uint64_t>(), p["step_s"].get<double>()});
  s.order = order;
  return s;
}

// The shipped mix: four jobs arriving two minutes apart on one H100.
TEST(SimulateMix, EachArmFollowsItsRuleAndSharingTheControllersDivision) {
  const json m = simulate_json("--mix configs/simulate/mix-h100.yaml --hardware h100-pcie5");
  const json& jobs = m["jobs"];
  ASSERT_EQ(jobs.size(), 4u) << m.dump(2);
  const uint64_t memory = m["memory_bytes"].get<uint64_t>();
  ASSERT_EQ(memory, uint64_t{80} << 30);
  uint64_t peaks = 0;
  for (const json& j : jobs) peaks += j["peak_bytes"].get<uint64_t>();
  ASSERT_GT(peaks, memory) << "the mix must not fit unconstrained";
  const auto arrive = [&](size_t j) { return jobs[j]["arrive_s"].get<double>(); };

  // Sharing: each phase's budgets are divide_memory's shares of the jobs present.
  const json& share = arm(m, "share");
  size_t changes = 0;
  std::vector<uint64_t> last(jobs.size(), 0);
  for (const json& phase : share["phases"]) {
    std::vector<size_t> present;
    for (const json& r : phase["running"]) present.push_back(r["job"].get<size_t>());
    for (const json& w : phase["waiting"]) present.push_back(w.get<size_t>());
    std::stable_sort(present.begin(), present.end(),
                     [&](size_t a, size_t b) { return arrive(a) < arrive(b); });
    std::vector<ShareJob> share_jobs;
    for (size_t p = 0; p < present.size(); ++p)
      share_jobs.push_back(share_job(jobs[present[p]], p));
    const ShareDivision d = divide_memory(memory, share_jobs, ShareObjective::kThroughput);
    uint64_t used = 0;
    for (const json& r : phase["running"]) {
      const size_t j = r["job"].get<size_t>();
      const size_t p = std::find(present.begin(), present.end(), j) - present.begin();
      EXPECT_FALSE(d.jobs[p].waiting);
      EXPECT_EQ(r["budget_bytes"].get<uint64_t>(), d.jobs[p].share) << phase.dump();
      used += r["budget_bytes"].get<uint64_t>();
      if (last[j] != 0 && last[j] != r["budget_bytes"].get<uint64_t>()) ++changes;
      last[j] = r["budget_bytes"].get<uint64_t>();
    }
    EXPECT_LE(used, memory);
  }
  EXPECT_GT(changes, 0u) << "no job's share changed as others came and went";

  // Static: the GPU's memory / 4 (or the job's peak) throughout.
  const json& fixed = arm(m, "static");
  for (const json& phase : fixed["phases"])
    for (const json& r : phase["running"]) {
      const json& job = jobs[r["job"].get<size_t>()];
      EXPECT_EQ(r["budget_bytes"].get<uint64_t>(),
                std::min(memory / 4, job["peak_bytes"].get<uint64_t>()));
    }
  // Co-running: a job at its peak moves nothing, so with k jobs running its step is k times
  // its step alone.
  size_t checked = 0;
  for (const json& a : {share, fixed})
    for (const json& phase : a["phases"])
      for (const json& r : phase["running"]) {
        const json& job = jobs[r["job"].get<size_t>()];
        if (r["budget_bytes"] != job["peak_bytes"]) continue;
        const double k = static_cast<double>(phase["running"].size());
        EXPECT_TRUE(close(r["step_s"].get<double>(), k * job["alone_step_s"].get<double>()))
            << phase.dump();
        checked += phase["running"].size() > 1;
      }
  EXPECT_GT(checked, 0u);

  // One after another: in arrival order, each alone at its peak, starting when the one before
  // ends.
  const json& seq = arm(m, "sequential");
  double free_at = 0;
  for (size_t j = 0; j < jobs.size(); ++j) {
    const json& o = seq["jobs"][j];
    EXPECT_TRUE(close(o["start_s"].get<double>(), std::max(arrive(j), free_at))) << j;
    EXPECT_TRUE(close(o["finish_s"].get<double>() - o["start_s"].get<double>(),
                      jobs[j]["steps"].get<double>() * jobs[j]["alone_step_s"].get<double>()))
        << j;
    free_at = o["finish_s"].get<double>();
  }
  for (const json& phase : seq["phases"]) EXPECT_EQ(phase["running"].size(), 1u);
  // Every arm trains every step of every job: the same samples, over its own makespan.
  for (const json& a : m["arms"]) {
    double samples = 0;
    for (const json& j : jobs) samples += j["batch"].get<double>() * j["steps"].get<double>();
    EXPECT_TRUE(close(a["samples_per_s"].get<double>() * a["makespan_s"].get<double>(), samples))
        << a["arm"];
  }
}

// 26 GiB: the equal share (13 GiB) is below ResNet-18's lower bound at batch 1536.
TEST(SimulateMix, AJobTheStaticSplitCannotRunIsNamedAndSharingIsComparedWithoutIt) {
  TempDir dir;
  const std::string mix = dir.write("tight.yaml",
                                    "memory: 26GiB\n"
                                    "jobs:\n"
                                    "  - config: configs/simulate/mix/resnet18.yaml\n"
                                    "    steps: 200\n"
                                    "  - config: configs/simulate/mix/alexnet.yaml\n"
                                    "    set: [data.batch_size=512]\n"
                                    "    arrive_s: 10\n"
                                    "    steps: 400\n");
  const json m = simulate_json("--mix " + mix + " --hardware h100-pcie5");
  ASSERT_GT(m["jobs"][0]["lower_bytes"].get<uint64_t>(), uint64_t{13} << 30);
  const json& fixed = arm(m, "static");
  EXPECT_FALSE(fixed["jobs"][0]["ran"].get<bool>());
  EXPECT_NE(fixed["jobs"][0]["why"].get<std::string>().find("exceeds its equal share 13.00 GiB"),
            std::string::npos)
      << fixed.dump(2);
  EXPECT_TRUE(fixed["jobs"][1]["ran"].get<bool>());
  const json& both = arm(m, "share-static-jobs");
  EXPECT_FALSE(both["jobs"][0]["ran"].get<bool>());
  EXPECT_TRUE(both["jobs"][1]["ran"].get<bool>());
  EXPECT_EQ(both["phases"].size(), 1u) << "alexnet alone";
  EXPECT_TRUE(arm(m, "share")["jobs"][0]["ran"].get<bool>()) << "sharing runs it";
  const Exit text = run(in_source("--mix " + mix + " --hardware h100-pcie5"));
  ASSERT_EQ(text.code, 0) << text.output;
  EXPECT_NE(text.output.find("resnet18         cannot run: its lower bound"), std::string::npos)
      << text.output;
  EXPECT_NE(text.output.find("share / static: throughput "), std::string::npos) << text.output;
  EXPECT_NE(text.output.find("(not over the same jobs: share ran 2, static ran 1)"),
            std::string::npos)
      << text.output;
  EXPECT_NE(text.output.find("share-static-jobs / static: throughput "), std::string::npos)
      << text.output;
}

// Issue 27 item 13: with jobs the static split can run none of (20 jobs, or here two whose lower
// bounds each exceed half the GPU), the ratio line's completion time was empty.
TEST(SimulateMix, ARatioOverNoCommonJobSaysSo) {
  TempDir dir;
  const std::string mix = dir.write("none_static.yaml",
                                    "memory: 26GiB\n"
                                    "jobs:\n"
                                    "  - config: configs/simulate/mix/resnet18.yaml\n"
                                    "    steps: 20\n"
                                    "  - config: configs/simulate/mix/resnet18.yaml\n"
                                    "    name: second\n"
                                    "    arrive_s: 1\n"
                                    "    steps: 20\n");
  const Exit text = run(in_source("--mix " + mix + " --hardware h100-pcie5"));
  ASSERT_EQ(text.code, 0) << text.output;
  EXPECT_NE(text.output.find("(not over the same jobs: share ran 2, static ran 0); completion "
                             "time not compared (no job ran in both)\n"),
            std::string::npos)
      << text.output;
  EXPECT_EQ(text.output.find("completion time \n"), std::string::npos) << text.output;
}

TEST(SimulateMix, BadMixInputExits2) {
  TempDir dir;
  const std::string job = "  - config: configs/simulate/mix/alexnet.yaml\n";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"jobz: []\n", "mix: unknown key 'jobz'"},
      {"memory: 80GiB\n", "jobs: required"},
      {"jobs: []\n", "jobs: required"},
      {"jobs:\n  - arrive_s: 1\n", "jobs[0].config: required"},
      {"jobs:\n" + job + "    arrive_s: -1\n", "jobs[0].arrive_s must be in [0, "},
      {"jobs:\n" + job + "    steps: 0\n", "jobs[0].steps 0 is out of range"},
      {"jobs:\n" + job + "    stepz: 3\n", "jobs[0]: unknown key 'stepz'"},
      {"jobs:\n" + job + "    set: [data.batch_sise=4]\n", "jobs[0] (alexnet): unknown key"},
      {"jobs:\n" + job + "    name: a\n" + job + "    name: a\n", "'a' names an earlier job"},
      {"memory: lots\njobs:\n" + job, "memory must be a size"},
      {"objective: fastest\njobs:\n" + job, "objective must be throughput or fair"},
      {"memory: 1GiB\njobs:\n" + job, "(alexnet): needs at least"},
      {"jobs:\n  - config: no/such.yaml\n", "cannot read config file 'no/such.yaml'"},
  };
  for (const auto& [text, what] : cases) {
    const Exit e = run(in_source("--mix " + dir.write("bad.yaml", text)));
    EXPECT_EQ(e.code, 2) << text << e.output;
    EXPECT_NE(e.output.find("error: "), std::string::npos) << e.output;
    EXPECT_NE(e.output.find(what), std::string::npos) << text << "\n" << e.output;
    EXPECT_NE(e.output.find("hint: "), std::string::npos) << e.output;
  }
  const std::string good = dir.write("good.yaml", "jobs:\n" + job);
  const std::vector<std::pair<std::string, std::string>> commands = {
      {"--mix no/such/mix.yaml", "--mix: cannot read mix file 'no/such/mix.yaml'"},
      {"configs/simulate/mix/alexnet.yaml --mix " + good, "give a CONFIG or --mix FILE, not both"},
      {"--mix " + good + " --gpus 2", "--gpus: not with --mix"},
      {"--mix " + good + " --shapes 160", "--shapes: not with --mix"},
      {"--mix " + good + " --scheduler fast", "--scheduler: unknown scheduler 'fast'"},
      {"--json", "simulate: give a CONFIG or --mix FILE"},
  };
  for (const auto& [args, what] : commands) {
    const Exit e = run(in_source(args));
    EXPECT_EQ(e.code, 2) << args << e.output;
    EXPECT_NE(e.output.find(what), std::string::npos) << args << "\n" << e.output;
    EXPECT_NE(e.output.find("hint: "), std::string::npos) << e.output;
  }
}

}  // namespace
}  // namespace ferry::testing
