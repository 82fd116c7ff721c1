// The node's link ledger shared by several jobs (Note [One link ledger per node] in
// links/link_ledger.h): its name is keyed by the topology, two jobs' copies share one uplink and
// show in its snapshot, a job of another topology is refused, a job killed at any moment loses
// its copies, tokens and entry, a job alone on the node starts it afresh, and a block of the
// previous layout is never read as this one's.
#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <cstdlib>
#include <future>
#include <set>
#include <thread>

#include <gtest/gtest.h>

#include "common/shm_names.h"
#include "links/link_ledger.h"
#include "links/link_ledger_impl.h"

namespace ferry {
namespace {

constexpr auto kH = TransferDirection::kToHost;

// GPU links 0 and 1 under switch uplink 2; 10 MB/s each way, so 1 MB alone takes 0.1 s.
std::vector<NamedLink> switch_links(double gbps = 0.01) {
  return {{"gpu0", {gbps, gbps, 1}}, {"gpu1", {gbps, gbps, 1}}, {"sw0", {gbps, gbps, 1}}};
}

LedgerUser user(const std::string& job, int rank) { return LedgerUser{job, rank, "runs/" + job}; }

class NodeLedger : public ::testing::Test {
 protected:
  void TearDown() override { LinkLedger::unlink(name_); }
  std::string name_ = "/ferrytest-nodelinks-" + shm_names::job_token();
};

double copy_seconds(LinkLedger& ledger, int rank, std::vector<int> path, uint64_t bytes) {
  const double start = LinkLedger::now();
  ledger.wait_flow(ledger.begin_flow(rank, kH, path, bytes));
  return LinkLedger::now() - start;
}

TEST(NodeLedgerName, IsPerUserAndKeyedByTheTopology) {
  unsetenv("FERRY_LINK_LEDGER");
  const std::string base = "/ferry-links-v6-u" + std::to_string(getuid());
  EXPECT_EQ(LinkLedger::node_base(), base);
  const std::string name = LinkLedger::node_name(switch_links());
  EXPECT_EQ(name.rfind(base + "-", 0), 0u) << name;
  EXPECT_EQ(name.size(), base.size() + 17);
  EXPECT_EQ(LinkLedger::node_name(switch_links()), name);      // the same topology: the same ledger
  EXPECT_NE(LinkLedger::node_name(switch_links(0.02)), name);  // another emulation scale
  auto renamed = switch_links();
  renamed[2].name = "sw1";
  EXPECT_NE(LinkLedger::node_name(renamed), name);
  auto reordered = switch_links();
  std::swap(reordered[0], reordered[2]);
  EXPECT_NE(LinkLedger::node_name(reordered), name);
  setenv("FERRY_LINK_LEDGER", "/mine", 1);
  EXPECT_EQ(LinkLedger::node_name(switch_links()).rfind("/mine-", 0), 0u);
  setenv("FERRY_LINK_LEDGER", "not/a/name", 1);
  EXPECT_EQ(LinkLedger::node_base(), base);
  unsetenv("FERRY_LINK_LEDGER");
}

TEST_F(NodeLedger, TwoJobsShareOneUplinkAndTheSnapshotShowsBoth) {
  auto a = LinkLedger::attach(name_, switch_links(), user("job-a", 0));
  int ready[2];
  ASSERT_EQ(pipe(ready), 0);
  const pid_t child = fork();  // rank 0 of another job
  ASSERT_GE(child, 0);
  if (child == 0) {
    auto b = LinkLedger::attach(name_, switch_links(), user("job-b", 0));
    const uint64_t fb = b->begin_flow(0, kH, {1, 2}, 1'000'000);
    const char c = 1;
    if (write(ready[1], &c, 1) != 1) _exit(2);
    b->wait_flow(fb);
    _exit(0);
  }
  char c = 0;
  ASSERT_EQ(read(ready[0], &c, 1), 1);
  const double start = LinkLedger::now();
  const uint64_t fa = a->begin_flow(0, kH, {0, 2}, 1'000'000);
  const LedgerSnapshot snap = a->snapshot();
  EXPECT_EQ(snap.key, LinkLedger::topology_key(switch_links()));
  ASSERT_EQ(snap.users.size(), 2u);
  ASSERT_EQ(snap.links.size(), 3u);
  std::set<std::string> on_uplink;
  for (const LinkUserEntry& e : snap.links[2].users) {
    EXPECT_EQ(e.kind, "flow");
    EXPECT_EQ(e.pid, e.job == "job-a" ? getpid() : child);
    EXPECT_GT(e.bytes, 0);
    on_uplink.insert(e.job + " " + e.run_dir);
  }
  EXPECT_EQ(on_uplink, (std::set<std::string>{"job-a runs/job-a", "job-b runs/job-b"}));
  ASSERT_EQ(snap.links[0].users.size(), 1u);
  EXPECT_EQ(snap.links[0].users[0].job, "job-a");
  ASSERT_EQ(snap.links[1].users.size(), 1u);
  EXPECT_EQ(snap.links[1].users[0].job, "job-b");
  a->wait_flow(fa);
  EXPECT_NEAR(LinkLedger::now() - start, 0.2, 0.05);  // each at half the uplink
  int status = 0;
  waitpid(child, &status, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  close(ready[0]);
  close(ready[1]);
  const std::vector<LinkUsage> usage = a->usage();
  EXPECT_NEAR(usage[2].bytes[0], 2e6, 1);
  EXPECT_LE(usage[2].peak_gbps[0], 0.01 * 1.02);
  EXPECT_EQ(a->snapshot().users.size(), 1u);  // job-b left
}

TEST_F(NodeLedger, AJobOfAnotherTopologyIsRefusedWithTheDifference) {
  auto a = LinkLedger::attach(name_, switch_links(), user("job-a", 0));
  auto other = switch_links();
  other[2].capacity = {0.02, 0.02, 1};
  try {
    LinkLedger::attach(name_, other, user("job-b", 0));
    FAIL() << "expected ConfigError";
  } catch (const ConfigError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("describes another server"), std::string::npos) << what;
    EXPECT_NE(what.find(name_), std::string::npos) << what;
  }
  EXPECT_EQ(a->snapshot().users.size(), 1u);  // the refused job left nothing
}

TEST_F(NodeLedger, AJobKilledHoldingATokenLosesItAndItsEntry) {
  auto mine = LinkLedger::attach(name_, switch_links(), user("job-a", 0));
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    auto other = LinkLedger::attach(name_, switch_links(), user("job-b", 0));
    other->acquire(0, kH, {1, 2}, {1, 2}, 100'000'000, 0);  // a 10 s chunk on the uplink
    other->claim(0, kH, {1, 2}, {1, 2}, 1000, 0);           // and a claim behind it
    kill(getpid(), SIGKILL);
  }
  int status = 0;
  waitpid(child, &status, 0);
  ASSERT_TRUE(WIFSIGNALED(status));
  const double start = LinkLedger::now();
  mine->wait_flow(mine->acquire(0, kH, {0, 2}, {0, 2}, 1000, start));
  EXPECT_LT(LinkLedger::now() - start, 1.0);
  const LedgerSnapshot snap = mine->snapshot();
  ASSERT_EQ(snap.users.size(), 1u);
  EXPECT_EQ(snap.users[0].job, "job-a");
  for (const LedgerLink& l : snap.links) EXPECT_TRUE(l.users.empty()) << l.usage.name;
}

TEST_F(NodeLedger, AKilledJobsCopyStopsTakingItsShareWithinTheReapInterval) {
  auto mine = LinkLedger::attach(name_, switch_links(), user("job-a", 0));
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    auto other = LinkLedger::attach(name_, switch_links(), user("job-b", 0));
    other->begin_flow(0, kH, {1, 2}, 100'000'000);  // a 10 s copy, never waited for
    kill(getpid(), SIGKILL);
  }
  int status = 0;
  waitpid(child, &status, 0);
  // 5 MB: 1 s at half the uplink if the dead copy kept its share; ~0.6 s once reaped (0.25 s).
  EXPECT_LT(copy_seconds(*mine, 0, {0, 2}, 5'000'000), 0.8);
}

TEST_F(NodeLedger, AJobAloneStartsItAfreshAndAJobBesideOthersKeepsTheRecord) {
  {
    auto first = LinkLedger::attach(name_, switch_links(), user("job-a", 0));
    copy_seconds(*first, 0, {0, 2}, 100'000);
    EXPECT_NEAR(first->usage()[2].bytes[0], 1e5, 1);
  }
  auto second = LinkLedger::attach(name_, switch_links(), user("job-b", 0));
  EXPECT_EQ(second->usage()[2].bytes[0], 0);  // nobody was attached: a new ledger
  copy_seconds(*second, 0, {1, 2}, 100'000);
  auto third = LinkLedger::attach(name_, switch_links(), user("job-c", 0));
  EXPECT_NEAR(third->usage()[2].bytes[0], 1e5, 1);  // job-b still runs: its record stays
  EXPECT_EQ(third->snapshot().users.size(), 2u);
}

// Jobs killed in the middle of waiting or waking (kill -9 at any moment) leave nothing that
// blocks the next one (Note [Waiting without a shared condition variable] in link_ledger.cc).
TEST_F(NodeLedger, JobsKilledWhileCopyingLeaveTheLedgerWorking) {
  auto mine = LinkLedger::attach(name_, switch_links(1), user("job-a", 0));  // 1 GB/s
  for (int round = 0; round < 20; ++round) {
    const pid_t child = fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      auto other = LinkLedger::attach(name_, switch_links(1), user("job-b", round));
      for (;;) {
        other->wait_flow(other->begin_flow(0, kH, {1, 2}, 10'000));
        other->wait_flow(other->acquire(0, kH, {1, 2}, {1, 2}, 10'000, 0));
      }
    }
    std::this_thread::sleep_for(std::chrono::microseconds(3000 + 1700 * round));
    kill(child, SIGKILL);
    int status = 0;
    waitpid(child, &status, 0);
  }
  const double start = LinkLedger::now();
  mine->wait_flow(mine->acquire(0, kH, {0, 2}, {0, 2}, 1'000'000, start));
  EXPECT_LT(LinkLedger::now() - start, 0.5);
  EXPECT_EQ(mine->snapshot().users.size(), 1u);
}

TEST_F(NodeLedger, AnotherJobsStuckHeldChunkLosesItsTokenInsteadOfEndingThisJob) {
  LedgerOptions o;
  o.token_timeout_s = 0.2;
  auto mine = LinkLedger::attach(name_, switch_links(), user("job-a", 0), o);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    auto other = LinkLedger::attach(name_, switch_links(), user("job-b", 0), o);
    other->acquire(0, kH, {1, 2}, {1, 2}, 1000, 0, /*held=*/true);  // a GPU chunk, never finished
    raise(SIGSTOP);                                                 // alive, stuck
    _exit(0);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, WUNTRACED), child);
  ASSERT_TRUE(WIFSTOPPED(status));
  const double start = LinkLedger::now();
  EXPECT_NO_THROW(mine->wait_flow(mine->acquire(0, kH, {0, 2}, {0, 2}, 1000, start)));
  EXPECT_LT(LinkLedger::now() - start, 2.0);
  kill(child, SIGKILL);
  waitpid(child, &status, 0);
}

// Note [One link ledger per node]: the well-known name carries the layout version, so a job of
// an older build (layout 5, before claims had kinds) keeps its own ledger and `trainer jobs`
// lists only this layout's. A block of the old layout at this build's name (FERRY_LINK_LEDGER
// names no version) is replaced once nobody maps it, and refused in one line while an old job
// still does.
TEST_F(NodeLedger, ABlockOfTheOldLayoutIsReplacedWhenUnusedAndRefusedInOneLineWhileUsed) {
  ASSERT_EQ(link_ledger_impl::kVersion, 6u);
  unsetenv("FERRY_LINK_LEDGER");
  const std::string old_node = "/ferry-links-v5-u" + std::to_string(getuid()) + "-0123456789abcdef";
  const int old_fd = shm_open(old_node.c_str(), O_CREAT | O_RDWR, 0600);
  ASSERT_GE(old_fd, 0);
  close(old_fd);
  const std::vector<std::string> listed = LinkLedger::node_ledgers();
  EXPECT_EQ(std::find(listed.begin(), listed.end(), old_node), listed.end());
  LinkLedger::unlink(old_node);

  // This layout's block with the old version stamped on it, as an old job's would read.
  LinkLedger::attach(name_, switch_links(), user("job-a", 0));
  const auto stamp_old = [&] {
    const int fd = shm_open(name_.c_str(), O_RDWR, 0600);
    ASSERT_GE(fd, 0);
    const uint32_t old_version = 5;
    ASSERT_EQ(pwrite(fd, &old_version, sizeof(old_version), offsetof(LinkLedger::Shared, version)),
              static_cast<ssize_t>(sizeof(old_version)));
    close(fd);
  };
  stamp_old();
  const int user_fd = shm_open(name_.c_str(), O_RDWR, 0600);  // an old job maps it
  ASSERT_GE(user_fd, 0);
  ASSERT_EQ(flock(user_fd, LOCK_SH), 0);
  try {
    LinkLedger::attach(name_, switch_links(), user("job-b", 0));
    ADD_FAILURE() << "an old layout's block in use was attached";
  } catch (const DataError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("/dev/shm" + name_), std::string::npos) << what;
    EXPECT_NE(what.find("its layout version is 5, not 6"), std::string::npos) << what;
    EXPECT_EQ(what.find('\n'), std::string::npos) << what;
    EXPECT_EQ(exit_code_for(e), 2);
  }
  close(user_fd);  // the old job ended: the next job replaces the block
  auto fresh = LinkLedger::attach(name_, switch_links(), user("job-b", 0));
  EXPECT_EQ(fresh->snapshot().users.size(), 1u);
  EXPECT_NE(LinkLedger::open_existing(name_), nullptr);
}

}  // namespace
}  // namespace ferry
