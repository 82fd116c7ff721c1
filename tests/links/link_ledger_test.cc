// The node-shared link ledger: copies under one switch share its uplink (each at half speed, the
// measured rate never above capacity), tokens go least slack first, a dead process's tokens are
// reclaimed, a live holder past the timeout is an error, and names are unique per job.
#include "links/link_ledger.h"

#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <future>
#include <map>
#include <set>
#include <string>
#include <thread>

#include <gtest/gtest.h>

namespace ferry {
namespace {

constexpr auto kH = TransferDirection::kToHost;
constexpr auto kD = TransferDirection::kToDevice;

// GPU links 0 and 1 under switch uplink 2; 10 MB/s each way, so 1 MB alone takes 0.1 s.
std::vector<NamedLink> switch_links(double gbps = 0.01, double duplex = 1.0) {
  return {{"gpu0", {gbps, gbps, duplex}},
          {"gpu1", {gbps, gbps, duplex}},
          {"sw0", {gbps, gbps, duplex}}};
}

class Ledger : public ::testing::Test {
 protected:
  void TearDown() override { LinkLedger::unlink(name_); }
  std::shared_ptr<LinkLedger> make(const std::vector<NamedLink>& links,
                                   const LedgerOptions& o = {}) {
    name_ = LinkLedger::unique_name();
    return LinkLedger::create(name_, links, o);
  }
  std::string name_;
};

double copy_seconds(LinkLedger& ledger, int rank, TransferDirection d, std::vector<int> path,
                    uint64_t bytes) {
  const double start = LinkLedger::now();
  ledger.wait_flow(ledger.begin_flow(rank, d, path, bytes));
  return LinkLedger::now() - start;
}

TEST_F(Ledger, TwoCopiesUnderOneSwitchEachGetHalfItsUplink) {
  auto created = make(switch_links());
  auto other = LinkLedger::open(name_);  // a second rank's attachment
  const double alone = copy_seconds(*created, 0, kH, {0, 2}, 1'000'000);
  EXPECT_NEAR(alone, 0.1, 0.03);
  auto a = std::async(std::launch::async, [&] {
    return copy_seconds(*created, 0, kH, {0, 2}, 1'000'000);
  });
  auto b = std::async(std::launch::async, [&] {
    return copy_seconds(*other, 1, kH, {1, 2}, 1'000'000);
  });
  EXPECT_NEAR(a.get(), 0.2, 0.05);
  EXPECT_NEAR(b.get(), 0.2, 0.05);
  // The opposite direction has its own capacity.
  EXPECT_NEAR(copy_seconds(*other, 1, kD, {1, 2}, 1'000'000), 0.1, 0.03);
  const auto usage = other->usage();
  ASSERT_EQ(usage.size(), 3u);
  EXPECT_NEAR(usage[2].bytes[0], 3e6, 1);
  EXPECT_NEAR(usage[2].bytes[1], 1e6, 1);
  EXPECT_NEAR(usage[0].bytes[0], 2e6, 1);
  for (const auto& u : usage) {
    for (int d = 0; d < 2; ++d) EXPECT_LE(u.peak_gbps[d], 0.01 * 1.02) << u.name;
  }
  EXPECT_GT(usage[2].peak_gbps[0], 0.01 * 0.9);  // the uplink was full while both copied
}

TEST_F(Ledger, DuplexFactorSlowsBothDirectionsWhenBothAreBusy) {
  auto ledger = make(switch_links(0.01, 0.5));
  auto a = std::async(std::launch::async, [&] {
    return copy_seconds(*ledger, 0, kH, {0, 2}, 500'000);
  });
  auto b = std::async(std::launch::async, [&] {
    return copy_seconds(*ledger, 0, kD, {0, 2}, 500'000);
  });
  EXPECT_NEAR(a.get(), 0.1, 0.03);  // 0.5 MB at half of 10 MB/s
  EXPECT_NEAR(b.get(), 0.1, 0.03);
}

TEST_F(Ledger, TokensGoToTheLeastSlackAndEveryClaimIsServed) {
  auto ledger = make(switch_links());
  const double now = LinkLedger::now();
  // A 10 s chunk holds the switch's to-host token until it is abandoned.
  const uint64_t held = ledger->acquire(0, kH, {0, 2}, {0, 2}, 100'000'000, now);
  // Grant order is flow id order (a flow gets its id when granted), not the order in which
  // the threads wake up afterwards.
  std::map<uint64_t, int> granted;
  std::mutex mu;
  auto claim = [&](int rank, double latest_start) {
    const uint64_t flow = ledger->acquire(rank, kH, {rank, 2}, {rank, 2}, 10'000, latest_start);
    {
      std::lock_guard lock(mu);
      granted[flow] = rank;
    }
    ledger->wait_flow(flow);
  };
  std::thread late([&] { claim(1, now + 10); });
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  std::thread urgent([&] { claim(0, now + 1); });
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  // The other direction is not held up by the held token; it runs at full speed.
  const double start = LinkLedger::now();
  ledger->wait_flow(ledger->acquire(1, kD, {1, 2}, {1, 2}, 100'000, now));
  EXPECT_NEAR(LinkLedger::now() - start, 0.01, 0.01);
  EXPECT_TRUE(granted.empty());
  ledger->abandon(held);
  late.join();
  urgent.join();
  std::vector<int> order;
  for (const auto& [flow, rank] : granted) order.push_back(rank);
  EXPECT_EQ(order, (std::vector<int>{0, 1}));
}

TEST_F(Ledger, AGrantedChunkMovesAtOnceAndItsTokenFreesWhenItsBytesAreThrough) {
  auto ledger = make(switch_links());
  const double start = LinkLedger::now();
  const uint64_t a = ledger->acquire(0, kH, {0, 2}, {0, 2}, 500'000, start);
  const uint64_t b = ledger->acquire(1, kH, {1, 2}, {1, 2}, 500'000, start);  // waits for a
  // b was granted the moment a's bytes were through (0.05 s), not when a's owner looked again.
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  ledger->wait_flow(a);
  ledger->wait_flow(b);
  EXPECT_NEAR(LinkLedger::now() - start, 0.1, 0.03);
  const auto usage = ledger->usage();
  EXPECT_NEAR(usage[2].bytes[0], 1e6, 1);
  EXPECT_LE(usage[2].peak_gbps[0], 0.01 * 1.02);
}

TEST_F(Ledger, AQueuedNextChunkStartsWhenTheOneBeforeEndsEvenIfItsOwnerWakesLate) {
  auto ledger = make(switch_links());
  const double start = LinkLedger::now();
  const uint64_t first = ledger->await_grant(ledger->claim(0, kH, {0, 2}, {0, 2}, 500'000, start));
  const uint64_t second = ledger->claim(0, kH, {0, 2}, {0, 2}, 500'000, start);  // queued
  // The owner oversleeps the first chunk's end (0.05 s) by 0.1 s; the link does not idle.
  std::this_thread::sleep_for(std::chrono::milliseconds(150));
  ledger->wait_flow(first);
  ledger->wait_flow(ledger->await_grant(second));
  EXPECT_NEAR(LinkLedger::now() - start, 0.15, 0.03);
  // Claimed only after the first was seen to end, the second would have started at 0.15 s.
  const uint64_t third = ledger->acquire(0, kH, {0, 2}, {0, 2}, 500'000, start);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  ledger->wait_flow(third);
  EXPECT_NEAR(ledger->usage()[2].bytes[0], 1.5e6, 1);
}

TEST_F(Ledger, AWithdrawnClaimFreesItsTokenWhetherOrNotItWasGranted) {
  auto ledger = make(switch_links());
  const double start = LinkLedger::now();
  const uint64_t granted = ledger->claim(0, kH, {0, 2}, {0, 2}, 100'000'000, start);  // 10 s
  const uint64_t waiting = ledger->claim(1, kH, {1, 2}, {1, 2}, 100'000'000, start);
  ledger->withdraw(waiting);
  ledger->withdraw(granted);
  ledger->withdraw(granted);  // a second withdraw is quiet
  ledger->wait_flow(ledger->acquire(1, kH, {1, 2}, {1, 2}, 100'000, start));
  EXPECT_NEAR(LinkLedger::now() - start, 0.01, 0.02);
  EXPECT_THROW(ledger->await_grant(waiting), LinkArbiterError);
}

// What each copy carries reaches the snapshot (`trainer jobs`): a granted chunk's flow and a
// waiting claim take their kind, a plain copy its own; the direction tells offload from prefetch
// and the optimizer's d2h from its h2d.
TEST_F(Ledger, TheSnapshotLabelsEachCopyAndClaimByWhatItCarries) {
  EXPECT_STREQ(copy_label(CopyKind::kActivation, 0), "offload");
  EXPECT_STREQ(copy_label(CopyKind::kActivation, 1), "prefetch");
  EXPECT_STREQ(copy_label(CopyKind::kOptimizer, 0), "optimizer d2h");
  EXPECT_STREQ(copy_label(CopyKind::kOptimizer, 1), "optimizer h2d");
  EXPECT_STREQ(copy_label(CopyKind::kOther, 1), "copy");
  auto ledger = make(switch_links());
  const double start = LinkLedger::now();
  // 10 s each at 10 MB/s: all still in flight when the snapshot is taken.
  const uint64_t chunk =
      ledger->claim(0, kH, {0, 2}, {0, 2}, 100'000'000, start, false, CopyKind::kOptimizer);
  const uint64_t waiting =
      ledger->claim(1, kH, {1, 2}, {1, 2}, 100'000'000, start, false, CopyKind::kActivation);
  const uint64_t up = ledger->begin_flow(0, kD, {0, 2}, 100'000'000, CopyKind::kActivation);
  const uint64_t weights = ledger->begin_flow(1, kD, {1, 2}, 100'000'000, CopyKind::kOptimizer);
  const uint64_t input = ledger->begin_flow(1, kD, {1}, 100'000'000);
  const LedgerSnapshot snap = ledger->snapshot();
  std::multiset<std::string> uplink, gpu1;
  for (const LinkUserEntry& e : snap.links[2].users)
    uplink.insert(e.kind + " " + e.label + (e.token ? " token" : ""));
  for (const LinkUserEntry& e : snap.links[1].users) gpu1.insert(e.kind + " " + e.label);
  EXPECT_EQ(uplink, (std::multiset<std::string>{"flow optimizer d2h token", "claim offload",
                                                "flow prefetch", "flow optimizer h2d"}));
  EXPECT_EQ(gpu1, (std::multiset<std::string>{"claim offload", "flow optimizer h2d", "flow copy"}));
  ledger->withdraw(waiting);
  ledger->withdraw(chunk);
  for (uint64_t f : {up, weights, input}) ledger->abandon(f);
  EXPECT_TRUE(ledger->snapshot().links[2].users.empty());
}

TEST_F(Ledger, ADeadProcessesTokensAreReclaimed) {
  auto ledger = make(switch_links());
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ledger->acquire(1, kH, {1, 2}, {1, 2}, 100'000'000, 0);  // a 10 s chunk, and dies holding it
    _exit(0);
  }
  int status = 0;
  waitpid(child, &status, 0);
  ASSERT_TRUE(WIFEXITED(status));
  const double start = LinkLedger::now();
  ledger->wait_flow(ledger->acquire(0, kH, {0, 2}, {0, 2}, 1000, start));
  EXPECT_LT(LinkLedger::now() - start, 1.0);
}

TEST_F(Ledger, AHolderWhoseChunkCarriesNothingPastTheTimeoutIsAnError) {
  LedgerOptions o;
  o.token_timeout_s = 0.2;
  auto links = switch_links();
  links[1].capacity = {0, 0, 1};  // GPU1's link carries nothing: its chunk holds sw0 forever
  auto ledger = make(links, o);
  const uint64_t held = ledger->acquire(1, kH, {1, 2}, {1, 2}, 1000, 0);
  const double start = LinkLedger::now();
  try {
    ledger->acquire(0, kH, {0, 2}, {0, 2}, 1000, 0);
    FAIL() << "expected LinkArbiterError";
  } catch (const LinkArbiterError& e) {
    EXPECT_NE(std::string(e.what()).find("rank 1 has held the to host token of sw0"),
              std::string::npos)
        << e.what();
  }
  EXPECT_LT(LinkLedger::now() - start, 2.0);
  ledger->abandon(held);
  // The failed claim left nothing behind.
  ledger->wait_flow(ledger->acquire(0, kH, {0, 2}, {0, 2}, 1000, 0));
}

TEST_F(Ledger, AHungRankDoesNotHoldALink) {
  auto ledger = make(switch_links());
  // Rank 1's chunk is granted and its owner never looks at it again (a hung copy thread).
  ledger->acquire(1, kH, {1, 2}, {1, 2}, 500'000, 0);
  const double start = LinkLedger::now();
  ledger->wait_flow(ledger->acquire(0, kH, {0, 2}, {0, 2}, 500'000, 0));
  EXPECT_NEAR(LinkLedger::now() - start, 0.1, 0.03);  // after rank 1's 0.05 s, then its own
}

TEST_F(Ledger, NamesAreUniquePerJobAndRemovedNamesCannotBeOpened) {
  auto ledger = make(switch_links());
  EXPECT_NE(LinkLedger::unique_name(), LinkLedger::unique_name());
  EXPECT_THROW(LinkLedger::create(name_, switch_links()), LibraryError);  // never reused
  LinkLedger::unlink(name_);
  EXPECT_THROW(LinkLedger::open(name_), LibraryError);
  // The attached block outlives its name.
  EXPECT_NEAR(copy_seconds(*ledger, 0, kH, {0}, 100'000), 0.01, 0.01);
}

TEST_F(Ledger, ZeroByteCopiesAndEmptyPathsFinishAtOnce) {
  auto ledger = make(switch_links());
  EXPECT_LT(copy_seconds(*ledger, 0, kH, {0, 2}, 0), 0.01);
  EXPECT_LT(copy_seconds(*ledger, 0, kH, {}, 1'000'000), 0.01);
}

}  // namespace
}  // namespace ferry
