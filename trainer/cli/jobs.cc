// `trainer jobs`: the node's job ledger (GPUs ferry jobs share, the jobs on each) and link ledgers
// (each link's users), as a table or JSON (Note [What trainer jobs shows]). Invariant: it reads
// the ledgers and never creates one.
#include <cstdio>
#include <string>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "common/bytes.h"
#include "common/file_write.h"
#include "jobs/job_ledger.h"
#include "links/link_ledger.h"
#include "trainer/cli/commands.h"

// Note [What trainer jobs shows]
// The job ledger is jobs/job_ledger.h's, the link ledgers links/link_ledger.h's. A link's users:
// which job, pid and rank has copies or claims on it, what each carries (its label: an
// activation's offload or prefetch, the host optimizer's d2h or h2d, another copy), and the bytes
// in flight.

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
      for (const SharePoint& p : j.curve.ladder)
        ladder.push_back({{"budget", p.budget}, {"step_s", p.step_s}});
      jobs.push_back({{"id", j.id},
                      {"pid", j.pid},
                      {"rank", j.rank},
                      {"config", j.config},
                      {"run_dir", j.run_dir},
                      {"lower", j.curve.lower},
                      {"peak", j.curve.peak},
                      {"share", j.share},
                      {"granted", j.granted},
                      {"held", j.held},
                      {"predicted_step_s", j.predicted_step_s},
                      {"measured_step_s", j.measured_step_s},
                      {"state", state(j)},
                      {"reason", j.reason},
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
                  format_bytes(j.curve.lower).c_str(), format_bytes(j.share).c_str(),
                  format_bytes(j.granted).c_str(), format_bytes(j.held).c_str(),
                  seconds(j.predicted_step_s).c_str(), seconds(j.measured_step_s).c_str(),
                  state(j).c_str(), j.config.c_str(), j.run_dir.c_str());
    }
  }
}

struct NamedSnapshot {
  std::string name;
  LedgerSnapshot snapshot;
};

// The node's link ledgers that have a live user (the dead reaped on the way).
std::vector<NamedSnapshot> link_ledgers() {
  std::vector<NamedSnapshot> out;
  for (const std::string& name : LinkLedger::node_ledgers()) {
    try {
      const std::shared_ptr<LinkLedger> ledger = LinkLedger::open_existing(name);
      if (!ledger) continue;
      LedgerSnapshot snap = ledger->snapshot();
      if (!snap.users.empty()) out.push_back({name, std::move(snap)});
    } catch (const Error&) {
      // Another build's block, or one that vanished: not ours to show.
    }
  }
  return out;
}

const char* dir_name(int d) { return d == 1 ? "to device" : "to host"; }

nlohmann::json links_json(const std::vector<NamedSnapshot>& ledgers) {
  nlohmann::json out = nlohmann::json::array();
  for (const NamedSnapshot& l : ledgers) {
    nlohmann::json users = nlohmann::json::array();
    for (const LedgerSnapshot::User& u : l.snapshot.users)
      users.push_back({{"pid", u.pid}, {"rank", u.rank}, {"job", u.job}, {"run_dir", u.run_dir}});
    nlohmann::json links = nlohmann::json::array();
    for (const LedgerLink& k : l.snapshot.links) {
      nlohmann::json on = nlohmann::json::array();
      for (const LinkUserEntry& e : k.users) {
        on.push_back({{"pid", e.pid},
                      {"rank", e.rank},
                      {"job", e.job},
                      {"run_dir", e.run_dir},
                      {"kind", e.kind},
                      {"label", e.label},
                      {"direction", dir_name(e.dir)},
                      {"token", e.token},
                      {"bytes", e.bytes}});
      }
      const LinkUsage& u = k.usage;
      links.push_back({{"name", u.name},
                       {"capacity_gbps", {u.capacity.to_host_gbps, u.capacity.to_device_gbps}},
                       {"bytes", {u.bytes[0], u.bytes[1]}},
                       {"peak_gbps", {u.peak_gbps[0], u.peak_gbps[1]}},
                       {"users", on}});
    }
    out.push_back({{"ledger", l.name},
                   {"key", fmt::format("{:016x}", l.snapshot.key)},
                   {"users", users},
                   {"links", links}});
  }
  return out;
}

void print_links(const std::vector<NamedSnapshot>& ledgers) {
  for (const NamedSnapshot& l : ledgers) {
    std::printf("links of %s: %zu process%s attached\n", l.name.c_str(), l.snapshot.users.size(),
                l.snapshot.users.size() == 1 ? "" : "es");
    std::printf("  %8s %4s  %-32s %s\n", "pid", "rank", "job", "run dir");
    for (const LedgerSnapshot::User& u : l.snapshot.users)
      std::printf("  %8d %4d  %-32s %s\n", u.pid, u.rank, u.job.c_str(), u.run_dir.c_str());
    for (const LedgerLink& k : l.snapshot.links) {
      const LinkUsage& u = k.usage;
      if (k.users.empty() && u.bytes[0] + u.bytes[1] <= 0) continue;
      std::printf("  %s: %.3g/%.3g GB/s, carried %s/%s, peak %.3g/%.3g GB/s (to host/to device)\n",
                  u.name.c_str(), u.capacity.to_host_gbps, u.capacity.to_device_gbps,
                  format_bytes(static_cast<uint64_t>(u.bytes[0])).c_str(),
                  format_bytes(static_cast<uint64_t>(u.bytes[1])).c_str(), u.peak_gbps[0],
                  u.peak_gbps[1]);
      for (const LinkUserEntry& e : k.users) {
        std::printf("    %-5s %-13s %-9s %10s %s pid %d rank %d job %s\n", e.kind.c_str(),
                    e.label.c_str(), dir_name(e.dir),
                    format_bytes(static_cast<uint64_t>(e.bytes)).c_str(),
                    e.token ? "token" : "     ", e.pid, e.rank, e.job.c_str());
      }
    }
  }
}

}  // namespace

int run_jobs(const JobsArgs& args) {
  const std::string name = JobLedger::default_name();
  const std::shared_ptr<JobLedger> ledger = JobLedger::open_existing(name);
  const std::vector<LedgerGpu> gpus = ledger ? ledger->snapshot() : std::vector<LedgerGpu>{};
  const std::vector<NamedSnapshot> links = link_ledgers();
  if (args.json) {
    nlohmann::json out = to_json(name, gpus);
    out["link_ledgers"] = links_json(links);
    std::printf("%s\n", out.dump(2).c_str());
  } else {
    if (gpus.empty()) {
      std::printf("no ferry job shares a GPU on this node (ledger %s)\n", name.c_str());
    } else {
      print_table(gpus);
    }
    print_links(links);
  }
  check_stdout();
  return 0;
}

}  // namespace ferry
