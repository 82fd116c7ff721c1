// `trainer simulate --mix FILE` (trainer/simulate/mix_simulation.h): the jobs of a mix sharing one
// simulated GPU; per arm (memory.share, a static equal split, one after another) each job's
// completion time, the mix's throughput, the phases with each job's budget and step; --json.
#include <algorithm>
#include <cstdio>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "common/bytes.h"
#include "common/error.h"
#include "common/file_write.h"
#include "trainer/cli/commands.h"
#include "trainer/cli/simulate_options.h"
#include "trainer/simulate/mix_simulation.h"

namespace ferry {

namespace {

nlohmann::json to_json(const MixReport& rep) {
  nlohmann::json jobs = nlohmann::json::array();
  for (const MixJob& j : rep.jobs) {
    nlohmann::json ladder = nlohmann::json::array();
    for (const SharePoint& p : j.curve.ladder)
      ladder.push_back({{"budget_bytes", p.budget}, {"step_s", p.step_s}});
    jobs.push_back({{"name", j.name},
                    {"config", j.config},
                    {"model", j.model},
                    {"batch", j.batch},
                    {"arrive_s", j.arrive_s},
                    {"steps", j.steps},
                    {"lower_bytes", j.curve.lower},
                    {"peak_bytes", j.curve.peak},
                    {"ladder", ladder},
                    {"alone_budget_bytes", j.alone_budget},
                    {"alone_step_s", j.alone_step_s}});
  }
  nlohmann::json arms = nlohmann::json::array();
  for (const MixArm& a : rep.arms) {
    nlohmann::json outcomes = nlohmann::json::array();
    for (size_t j = 0; j < a.jobs.size(); ++j) {
      const MixOutcome& o = a.jobs[j];
      nlohmann::json x = {{"job", j}, {"name", rep.jobs[j].name}, {"ran", o.ran}};
      if (o.ran) {
        x["start_s"] = o.start_s;
        x["finish_s"] = o.finish_s;
        x["completion_s"] = o.completion_s;
      } else if (!o.why.empty()) {
        x["why"] = o.why;
      }
      outcomes.push_back(std::move(x));
    }
    nlohmann::json phases = nlohmann::json::array();
    for (const MixPhase& p : a.phases) {
      nlohmann::json running = nlohmann::json::array();
      for (const MixRun& r : p.running)
        running.push_back({{"job", r.job}, {"budget_bytes", r.budget}, {"step_s", r.step_s}});
      phases.push_back({{"begin_s", p.begin_s},
                        {"end_s", p.end_s},
                        {"running", running},
                        {"waiting", p.waiting}});
    }
    arms.push_back({{"arm", a.name},
                    {"rule", a.rule},
                    {"makespan_s", a.makespan_s},
                    {"samples_per_s", a.samples_per_s},
                    {"jobs", outcomes},
                    {"phases", phases}});
  }
  return {{"mix", rep.file},
          {"topology", rep.topology},
          {"hardware", rep.hardware},
          {"scheduler", rep.scheduler},
          {"memory_bytes", rep.memory},
          {"objective", share_objective_name(rep.objective)},
          {"jobs", jobs},
          {"arms", arms}};
}

void print_arm(const MixReport& rep, const MixArm& a) {
  std::printf("\n%s: %s\n", a.name.c_str(), a.rule.c_str());
  std::printf("  %-16s %10s %10s %13s  %s\n", "job", "start s", "finish s", "completion s",
              "budgets (first to last)");
  for (size_t j = 0; j < a.jobs.size(); ++j) {
    const MixOutcome& o = a.jobs[j];
    if (!o.ran) {
      if (!o.why.empty())
        std::printf("  %-16s cannot run: %s\n", rep.jobs[j].name.c_str(), o.why.c_str());
      continue;
    }
    std::string budgets;
    uint64_t last = 0;
    for (const MixPhase& p : a.phases)
      for (const MixRun& r : p.running)
        if (r.job == j && r.budget != last) {
          budgets += (budgets.empty() ? "" : ", ") + format_bytes(r.budget);
          last = r.budget;
        }
    std::printf("  %-16s %10.1f %10.1f %13.1f  %s\n", rep.jobs[j].name.c_str(), o.start_s,
                o.finish_s, o.completion_s, budgets.c_str());
  }
  std::printf("  makespan %.1f s, %.1f samples/s\n", a.makespan_s, a.samples_per_s);
  for (const MixPhase& p : a.phases) {
    std::string text;
    for (const MixRun& r : p.running)
      text += fmt::format("{}{} {} ({:.4f} s/step)", text.empty() ? "" : ", ", rep.jobs[r.job].name,
                          format_bytes(r.budget), r.step_s);
    if (!p.waiting.empty()) {
      text += "; waiting:";
      for (size_t w : p.waiting) text += " " + rep.jobs[w].name;
    }
    std::printf("    %9.1f-%9.1f s: %s\n", p.begin_s, p.end_s, text.c_str());
  }
}

// `a` against `b` over the jobs both ran: throughput and each job's completion time.
void print_ratio(const MixReport& rep, const MixArm& a, const MixArm& b) {
  std::string per_job;
  for (size_t j = 0; j < a.jobs.size(); ++j) {
    if (!a.jobs[j].ran || !b.jobs[j].ran) continue;
    per_job += fmt::format("{}{} {:.2f}x", per_job.empty() ? "" : ", ", rep.jobs[j].name,
                           a.jobs[j].completion_s / b.jobs[j].completion_s);
  }
  const auto ran = [](const MixArm& arm) {
    return std::count_if(arm.jobs.begin(), arm.jobs.end(),
                         [](const MixOutcome& o) { return o.ran; });
  };
  const std::string over = ran(a) == ran(b)
                               ? ""
                               : fmt::format(" (not over the same jobs: {} ran {}, {} ran {})",
                                             a.name, ran(a), b.name, ran(b));
  // No job ran under both: there is no completion time to compare (a static split of many jobs
  // can run none of them).
  if (per_job.empty()) per_job = "not compared (no job ran in both)";
  std::printf("%s / %s: throughput %.3fx%s; completion time %s\n", a.name.c_str(), b.name.c_str(),
              b.samples_per_s > 0 ? a.samples_per_s / b.samples_per_s : 0.0, over.c_str(),
              per_job.c_str());
}

}  // namespace

int run_simulate_mix(const SimulateArgs& args) {
  MixOptions o;
  static_cast<ServerOptions&>(o) = parse_simulate_options(args);
  const MixReport rep = simulate_mix(load_mix(args.mix), o);
  if (args.json) {
    std::printf("%s\n", to_json(rep).dump(2).c_str());
    check_stdout();
    return 0;
  }
  std::printf(
      "simulate --mix %s: %zu jobs on one GPU of %s, hardware %s, %s shared, scheduler "
      "%s, objective %s\n\n",
      rep.file.c_str(), rep.jobs.size(), rep.topology.c_str(), rep.hardware.c_str(),
      format_bytes(rep.memory).c_str(), rep.scheduler.c_str(), share_objective_name(rep.objective));
  std::printf("%-16s %-16s %6s %9s %9s %12s %12s %12s\n", "job", "model", "batch", "arrive s",
              "steps", "lower", "peak", "alone s/step");
  for (const MixJob& j : rep.jobs) {
    std::printf("%-16s %-16s %6lld %9.1f %9lld %12s %12s %12.4f\n", j.name.c_str(), j.model.c_str(),
                static_cast<long long>(j.batch), j.arrive_s, static_cast<long long>(j.steps),
                format_bytes(j.curve.lower).c_str(), format_bytes(j.curve.peak).c_str(),
                j.alone_step_s);
  }
  for (const MixArm& a : rep.arms) print_arm(rep, a);
  std::printf("\n");
  const MixArm& share = rep.arms.at(0);
  for (size_t k = 1; k < rep.arms.size(); ++k) {
    if (rep.arms[k].name == "share-static-jobs")
      print_ratio(rep, rep.arms[k], rep.arms.at(1));
    else
      print_ratio(rep, share, rep.arms[k]);
  }
  check_stdout();
  return 0;
}

}  // namespace ferry
