// `trainer jobs`: the node's job ledger (links/job_ledger.h), the GPUs that ferry jobs share and
// the jobs on each, as a table or JSON. Reads the ledger and never creates it.
#include <cstdio>
#include <string>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "common/bytes.h"
#include "common/file_write.h"
#include "links/job_ledger.h"
#include "trainer/cli/commands.h"

namespace ferry {
namespace {

std::string seconds(double s) { return s > 0 ? fmt::format("{:.3f} s", s) : "-"; }

std::string state(const LedgerJob& j) {
  if (j.waiting) return "waiting";
  if (j.granted > j.share) return "shrinking";
  if (j.granted < j.share) return "growing";
  return "running";
}

nlohmann::json to_json(const std::string& name, const std::vector<LedgerGpu>& gpus) {
  nlohmann::json out = {{"ledger", name}, {"gpus", nlohmann::json::array()}};
  for (const LedgerGpu& g : gpus) {
    nlohmann::json jobs = nlohmann::json::array();
    uint64_t held = 0;
    for (const LedgerJob& j : g.jobs) {
      held += j.held;
      nlohmann::json ladder = nlohmann::json::array();
      for (const SharePoint& p : j.ladder)
        ladder.push_back({{"budget", p.budget}, {"step_s", p.step_s}});
      jobs.push_back({{"id", j.id},
                      {"pid", j.pid},
                      {"rank", j.rank},
                      {"config", j.config},
                      {"run_dir", j.run_dir},
                      {"lower", j.lower},
                      {"peak", j.peak},
                      {"share", j.share},
                      {"granted", j.granted},
                      {"held", j.held},
                      {"predicted_step_s", j.predicted_step_s},
                      {"measured_step_s", j.measured_step_s},
                      {"state", state(j)},
                      {"generation", j.generation},
                      {"age_s", j.age_s},
                      {"ladder", ladder}});
    }
    out["gpus"].push_back({{"device", g.device},
                           {"capacity", g.capacity},
                           {"objective", share_objective_name(g.objective)},
                           {"generation", g.generation},
                           {"held", held},
                           {"peak_held", g.peak_held},
                           {"jobs", jobs}});
  }
  return out;
}

void print_table(const std::vector<LedgerGpu>& gpus) {
  for (const LedgerGpu& g : gpus) {
    uint64_t held = 0;
    for (const LedgerJob& j : g.jobs) held += j.held;
    std::printf("%s: capacity %s, objective %s, %zu job%s, holding %s (at most %s so far)\n",
                g.device.c_str(), format_bytes(g.capacity).c_str(),
                share_objective_name(g.objective), g.jobs.size(), g.jobs.size() == 1 ? "" : "s",
                format_bytes(held).c_str(), format_bytes(g.peak_held).c_str());
    std::printf("  %4s %8s %4s %11s %11s %11s %11s %10s %10s %-9s %s\n", "job", "pid", "rank",
                "lower", "share", "granted", "held", "predicted", "measured", "state",
                "config -> run dir");
    for (const LedgerJob& j : g.jobs) {
      std::printf("  %4llu %8d %4d %11s %11s %11s %11s %10s %10s %-9s %s -> %s\n",
                  static_cast<unsigned long long>(j.id), j.pid, j.rank,
                  format_bytes(j.lower).c_str(), format_bytes(j.share).c_str(),
                  format_bytes(j.granted).c_str(), format_bytes(j.held).c_str(),
                  seconds(j.predicted_step_s).c_str(), seconds(j.measured_step_s).c_str(),
                  state(j).c_str(), j.config.c_str(), j.run_dir.c_str());
    }
  }
}

}  // namespace

int run_jobs(const JobsArgs& args) {
  const std::string name = JobLedger::default_name();
  const std::shared_ptr<JobLedger> ledger = JobLedger::open_existing(name);
  const std::vector<LedgerGpu> gpus = ledger ? ledger->snapshot() : std::vector<LedgerGpu>{};
  if (args.json) {
    std::printf("%s\n", to_json(name, gpus).dump(2).c_str());
  } else if (gpus.empty()) {
    std::printf("no ferry job shares a GPU on this node (ledger %s)\n", name.c_str());
  } else {
    print_table(gpus);
  }
  check_stdout();
  return 0;
}

}  // namespace ferry
