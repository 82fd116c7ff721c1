// Two jobs of 2 CPU ranks each, run at the same time on the DGX-1-like server, share the node's
// link ledger (Note [One link ledger per node] in links/link_ledger.h): each rank's GPU sits
// under the same switch as a rank of the other job, the ledger's own record shows no emulated
// link above its capacity by more than 2%, and while they run the ledger shows both jobs' copies
// and claims on that switch's uplink, and `trainer jobs` prints them.
#include <chrono>
#include <fstream>
#include <future>
#include <map>
#include <set>
#include <thread>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "common/shm_names.h"
#include "links/link_ledger.h"
#include "tests/trainer/integration/run_util.h"

namespace ferry::testing {
namespace {

std::string quickstart() { return std::string(FERRY_SOURCE_DIR) + "/configs/quickstart.yaml"; }
std::string dgx1() { return std::string(FERRY_SOURCE_DIR) + "/configs/topologies/dgx1-like.yaml"; }

// A private ledger base (kept apart from other tests' jobs), its blocks removed however the test
// ends.
struct PrivateLinks {
  std::string base = "/ferrytest-links-" + shm_names::job_token();
  ~PrivateLinks() {
    setenv("FERRY_LINK_LEDGER", base.c_str(), 1);
    for (const std::string& n : LinkLedger::node_ledgers()) LinkLedger::unlink(n);
    unsetenv("FERRY_LINK_LEDGER");
  }
};

// A 2-rank job of the quickstart offloading everything under the topology scheduler; local
// ranks 0 and 1 stand in for GPUs 0 and 1, both under the first switch. No kernel timing before
// the first step (the FLOP model) and 12 steps, so the two jobs' copies overlap even when one
// starts seconds after the other (a cold machine).
std::string job(const std::string& base, const std::string& dir) {
  return "timeout 180 " + mpirun(2) + "-x FERRY_LINK_LEDGER=" + base + " " + trainer() + " train " +
         quickstart() + " run.dir=" + dir +
         " run.steps=12 run.log_every=1 checkpoint.every=0 memory.measure=false topology.file=" +
         dgx1() +
         " topology.emulation_scale=300 topology.chunk_mb=0.25 memory.policy=vdnn-all"
         " topology.scheduler=topology";
}

TEST(SharedLinks, TwoJobsArbitrateOneSwitchUplinkWithinCapacity) {
  if (!have_mpirun()) GTEST_SKIP() << "mpirun (OpenMPI) is not installed";
  const PrivateLinks links;
  const std::string root = scratch("shared_links");
  std::future<Exit> a =
      std::async(std::launch::async, [&] { return run(job(links.base, root + "/a")); });
  std::future<Exit> b =
      std::async(std::launch::async, [&] { return run(job(links.base, root + "/b")); });

  // Watch the ledger while they run: which jobs have copies or claims on the uplink at once.
  setenv("FERRY_LINK_LEDGER", links.base.c_str(), 1);
  std::set<std::string> jobs_seen, users_seen;
  std::set<std::string> uplink_jobs_at_once;  // jobs on the uplink at the busiest instant
  std::string ledger_name;
  bool printed = false;
  Exit table;
  const auto done = [](std::future<Exit>& f) {
    return f.wait_for(std::chrono::milliseconds(0)) == std::future_status::ready;
  };
  while (!done(a) || !done(b)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(3));
    const std::vector<std::string> names = LinkLedger::node_ledgers();
    if (names.empty()) continue;
    ASSERT_EQ(names.size(), 1u) << "both jobs name one topology: one ledger";
    ledger_name = names[0];
    const std::shared_ptr<LinkLedger> ledger = LinkLedger::open_existing(ledger_name);
    if (!ledger) continue;
    const LedgerSnapshot snap = ledger->snapshot();
    for (const LedgerSnapshot::User& u : snap.users) {
      jobs_seen.insert(u.job);
      users_seen.insert(u.job + "/" + std::to_string(u.rank));
    }
    for (const LedgerLink& l : snap.links) {
      if (l.usage.name.rfind("switch-uplink", 0) != 0) continue;
      std::set<std::string> now;
      for (const LinkUserEntry& e : l.users) now.insert(e.job);
      if (now.size() > uplink_jobs_at_once.size()) uplink_jobs_at_once = now;
      // Once both jobs are on it, `trainer jobs` shows them (its own snapshot, a moment later).
      if (now.size() == 2 && !printed) {
        table = run(trainer() + " jobs");
        printed = true;
      }
    }
  }
  unsetenv("FERRY_LINK_LEDGER");
  const Exit ea = a.get(), eb = b.get();
  ASSERT_EQ(ea.code, 0) << ea.output;
  ASSERT_EQ(eb.code, 0) << eb.output;

  EXPECT_EQ(jobs_seen.size(), 2u) << "two jobs attached the one ledger";
  EXPECT_EQ(users_seen.size(), 4u) << "2 ranks of each";
  EXPECT_EQ(uplink_jobs_at_once.size(), 2u) << "both jobs' copies or claims on one uplink at once";
  ASSERT_TRUE(printed);
  EXPECT_EQ(table.code, 0) << table.output;
  EXPECT_NE(table.output.find("links of " + ledger_name), std::string::npos) << table.output;
  EXPECT_NE(table.output.find("switch-uplink"), std::string::npos) << table.output;
  for (const std::string& j : jobs_seen)
    EXPECT_NE(table.output.find("job " + j), std::string::npos) << j << "\n" << table.output;

  // The ledger's own record of both jobs' bytes: no link above its capacity by more than 2%, and
  // the shared uplink carried the traffic of both.
  setenv("FERRY_LINK_LEDGER", links.base.c_str(), 1);
  const std::shared_ptr<LinkLedger> ledger = LinkLedger::open_existing(ledger_name);
  unsetenv("FERRY_LINK_LEDGER");
  ASSERT_TRUE(ledger);
  double uplink_bytes = 0;
  for (const LinkUsage& u : ledger->usage()) {
    const double cap[2] = {u.capacity.to_host_gbps, u.capacity.to_device_gbps};
    for (int d = 0; d < 2; ++d) EXPECT_LE(u.peak_gbps[d], 1.02 * cap[d]) << u.name << " " << d;
    if (u.name.rfind("switch-uplink", 0) == 0) uplink_bytes += u.bytes[0] + u.bytes[1];
  }
  EXPECT_GT(uplink_bytes, 2e6);
  // Each job's links.json is the same shared record, read at its end.
  for (const std::string& dir : {root + "/a", root + "/b"}) {
    std::ifstream in(dir + "/links.json");
    ASSERT_TRUE(in) << dir;
    const nlohmann::json j = nlohmann::json::parse(in);
    for (const auto& link : j["links"])
      for (int d = 0; d < 2; ++d)
        EXPECT_LE(link["peak_gbps"][d].get<double>(),
                  1.02 * link["capacity_gbps"][d].get<double>());
  }
}

}  // namespace
}  // namespace ferry::testing
