// The CPU link emulator in one process, without mpirun: several ranks' emulators on one ledger.
// Every byte of a copy goes through move() exactly once and in order (whole, or in chunks when
// it carries a scheduled deadline from the topology scheduler); the ledger accounts each copy on
// exactly the links of its rank's path and direction; a copy never beats its link's rate; the
// copy with less slack takes a shared link first; a move that throws gives back its tokens and
// queued claims. Times are only checked from below (a copy cannot be faster than its rate),
// never from above.
#include "links/link_emulator.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <functional>
#include <future>
#include <mutex>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

namespace ferry {
namespace {

constexpr auto kH = TransferDirection::kToHost;
constexpr auto kD = TransferDirection::kToDevice;

using Pieces = std::vector<std::pair<uint64_t, uint64_t>>;  // (offset, length) per move()

// [0, bytes) cut into `chunk`-byte pieces, the last one shorter.
Pieces chunks(uint64_t bytes, uint64_t chunk) {
  Pieces out;
  for (uint64_t at = 0; at < bytes; at += chunk) out.emplace_back(at, std::min(chunk, bytes - at));
  return out;
}

// Rank `rank`'s emulator: its GPU link `rank` under the switch uplink 2.
LinkEmulationOptions rank_options(int rank, bool arbitrate, uint64_t chunk_bytes = 4ull << 20) {
  LinkEmulationOptions o;
  o.rank = rank;
  o.path = {rank, 2};
  o.chunk_bytes = chunk_bytes;
  o.arbitrate = arbitrate;
  return o;
}

// A copy without a schedule (an input, a parameter): the pieces move() was given.
Pieces carry(LinkEmulator& e, TransferDirection d, uint64_t bytes,
             const std::function<void(uint64_t, uint64_t)>& also = nullptr) {
  Pieces pieces;
  const uint64_t ticket = e.enqueue(d == kD, bytes, CopyDeadline{});
  e.carry(ticket, [&](uint64_t offset, uint64_t length) {
    pieces.emplace_back(offset, length);
    if (also) also(offset, length);
  });
  return pieces;
}

// The one place that says how a copy the topology scheduler planned reaches the emulator with
// its deadline (seconds from the copy's start): the deadline travels with the enqueue.
uint64_t enqueue_scheduled(LinkEmulator& e, TransferDirection d, uint64_t bytes,
                           double deadline_s) {
  return e.enqueue(d == kD, bytes, CopyDeadline{true, deadline_s});
}

Pieces carry_scheduled(LinkEmulator& e, TransferDirection d, uint64_t bytes, double deadline_s,
                       const std::function<void(uint64_t, uint64_t)>& also = nullptr) {
  Pieces pieces;
  const uint64_t ticket = enqueue_scheduled(e, d, bytes, deadline_s);
  e.carry(ticket, [&](uint64_t offset, uint64_t length) {
    pieces.emplace_back(offset, length);
    if (also) also(offset, length);
  });
  return pieces;
}

class LinkEmulatorTest : public ::testing::Test {
 protected:
  void TearDown() override {
    if (!name_.empty()) LinkLedger::unlink(name_);
  }
  // GPU links 0 and 1 under switch uplink 2, each `gbps` per direction.
  std::shared_ptr<LinkLedger> make(double gbps, const LedgerOptions& o = {}) {
    name_ = LinkLedger::unique_name();
    return LinkLedger::create(
        name_,
        {{"gpu0", {gbps, gbps, 1.0}}, {"gpu1", {gbps, gbps, 1.0}}, {"sw0", {gbps, gbps, 1.0}}}, o);
  }
  // Bytes the ledger has seen on `link` in direction `d`.
  static double bytes_on(const LinkLedger& ledger, int link, TransferDirection d) {
    return ledger.usage()[static_cast<size_t>(link)].bytes[d == kD ? 1 : 0];
  }
  std::string name_;
};

TEST_F(LinkEmulatorTest, WithoutALedgerACopyMovesWholeAtTheSoloRate) {
  LinkEmulationOptions o = rank_options(0, /*arbitrate=*/true, 100'000);
  o.link_gbps = 0.1;  // 2 MB in 20 ms
  LinkEmulator e(o);
  EXPECT_EQ(e.ledger(), nullptr);
  const auto start = std::chrono::steady_clock::now();
  // Scheduled or not, a copy before the ledger is attached is one piece.
  EXPECT_EQ(carry_scheduled(e, kH, 2'000'000, 1.0), (Pieces{{0, 2'000'000}}));
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_GE(seconds, 0.02);
  // A ticket never issued (or carried already) moves nothing.
  bool moved = false;
  e.carry(12345, [&](uint64_t, uint64_t) { moved = true; });
  EXPECT_FALSE(moved);
}

TEST_F(LinkEmulatorTest, ACopyIsAccountedOnItsPathAndDirectionAndNeverBeatsTheLinkRate) {
  auto ledger = make(0.1);  // 100 MB/s: 2 MB alone takes 20 ms
  LinkEmulator e(rank_options(0, /*arbitrate=*/false));
  e.attach(ledger);
  EXPECT_EQ(e.ledger(), ledger);
  const double start = LinkLedger::now();
  EXPECT_EQ(carry(e, kH, 2'000'000), (Pieces{{0, 2'000'000}}));
  EXPECT_GE(LinkLedger::now() - start, 0.02 * (1 - 1e-6));
  EXPECT_EQ(carry(e, kD, 500'000), (Pieces{{0, 500'000}}));
  EXPECT_NEAR(bytes_on(*ledger, 0, kH), 2e6, 1);  // its GPU link
  EXPECT_NEAR(bytes_on(*ledger, 2, kH), 2e6, 1);  // the switch uplink
  EXPECT_NEAR(bytes_on(*ledger, 0, kD), 5e5, 1);
  EXPECT_NEAR(bytes_on(*ledger, 2, kD), 5e5, 1);
  EXPECT_EQ(bytes_on(*ledger, 1, kH), 0);  // the other GPU's link
  EXPECT_EQ(bytes_on(*ledger, 1, kD), 0);
}

// What a copy carries (its CopyDeadline's kind) labels its flow, and its chunks' claims and
// flows, in the ledger while it moves (`trainer jobs` shows the labels).
TEST_F(LinkEmulatorTest, ACopysKindLabelsItsFlowsAndClaimsInTheLedger) {
  // 2 MB/s: each 1 MB piece is in flight for 0.5 s, far longer than a loaded machine's wake-up.
  auto ledger = make(0.002);
  std::multiset<std::string> seen;
  const auto look = [&](uint64_t, uint64_t) {
    const LedgerSnapshot snap = ledger->snapshot();
    for (const LinkUserEntry& u : snap.links[0].users)
      seen.insert(u.kind + " " + u.label + (u.token ? " token" : ""));
  };
  LinkEmulator fifo(rank_options(0, /*arbitrate=*/false));
  fifo.attach(ledger);
  fifo.carry(fifo.enqueue(true, 1'000'000, CopyDeadline{false, 0, CopyKind::kOptimizer}), look);
  EXPECT_EQ(seen, (std::multiset<std::string>{"flow optimizer h2d"}));
  seen.clear();
  LinkEmulator chunked(rank_options(0, /*arbitrate=*/true, 1'000'000));
  chunked.attach(ledger);
  chunked.carry(chunked.enqueue(false, 2'000'000, CopyDeadline{true, 1.0, CopyKind::kActivation}),
                look);
  // Each chunk moves holding the token; the first sees the second waiting in its claim.
  EXPECT_EQ(seen, (std::multiset<std::string>{"flow offload token", "claim offload",
                                              "flow offload token"}));
}

TEST_F(LinkEmulatorTest, AScheduledCopyMovesInChunksAndOnlyThatCopy) {
  auto ledger = make(1.0);  // 1 GB/s: these copies take a millisecond or two
  LinkEmulator e(rank_options(0, /*arbitrate=*/true, 300'000));
  e.attach(ledger);
  EXPECT_EQ(carry_scheduled(e, kH, 1'000'000, 1.0), chunks(1'000'000, 300'000));
  EXPECT_NEAR(bytes_on(*ledger, 0, kH), 1e6, 1);
  EXPECT_NEAR(bytes_on(*ledger, 2, kH), 1e6, 1);
  // Not scheduled: whole.
  EXPECT_EQ(carry(e, kH, 1'000'000), (Pieces{{0, 1'000'000}}));
  // The copies enqueued after a scheduled one, of its size, in either direction, do not take its
  // deadline: it stays with the copy it came with, however late that copy is carried.
  const uint64_t first = enqueue_scheduled(e, kH, 1'000'000, 1.0);
  EXPECT_EQ(carry(e, kH, 1'000'000), (Pieces{{0, 1'000'000}}));
  EXPECT_EQ(carry(e, kD, 1'000'000), (Pieces{{0, 1'000'000}}));
  const uint64_t second = e.enqueue(false, 1'000'000, CopyDeadline{});
  Pieces a, b;
  e.carry(first, [&](uint64_t o, uint64_t n) { a.emplace_back(o, n); });
  e.carry(second, [&](uint64_t o, uint64_t n) { b.emplace_back(o, n); });
  EXPECT_EQ(a, chunks(1'000'000, 300'000));
  EXPECT_EQ(b, (Pieces{{0, 1'000'000}}));
  // A deadline that is not scheduled (a planned time the fifo scheduler ignores): whole.
  const uint64_t unscheduled = e.enqueue(false, 1'000'000, CopyDeadline{false, 1.0});
  Pieces c;
  e.carry(unscheduled, [&](uint64_t o, uint64_t n) { c.emplace_back(o, n); });
  EXPECT_EQ(c, (Pieces{{0, 1'000'000}}));
  // Without arbitration (the fifo scheduler) a scheduled copy is whole too.
  LinkEmulator fifo(rank_options(1, /*arbitrate=*/false, 300'000));
  fifo.attach(ledger);
  EXPECT_EQ(carry_scheduled(fifo, kD, 1'000'000, 1.0), (Pieces{{0, 1'000'000}}));
  // Every byte above crossed the uplink once.
  EXPECT_NEAR(bytes_on(*ledger, 2, kH), 6e6, 1);
  EXPECT_NEAR(bytes_on(*ledger, 2, kD), 2e6, 1);
  EXPECT_NEAR(bytes_on(*ledger, 1, kD), 1e6, 1);
}

TEST_F(LinkEmulatorTest, TwoRanksUnderOneSwitchShareItsUplink) {
  auto created = make(0.1);                 // 100 MB/s per link and direction
  auto attached = LinkLedger::open(name_);  // the second rank's own attachment
  LinkEmulator rank0(rank_options(0, /*arbitrate=*/false));
  LinkEmulator rank1(rank_options(1, /*arbitrate=*/false));
  rank0.attach(created);
  rank1.attach(attached);
  const double start = LinkLedger::now();
  auto a = std::async(std::launch::async, [&] { return carry(rank0, kH, 1'000'000); });
  auto b = std::async(std::launch::async, [&] { return carry(rank1, kH, 1'000'000); });
  EXPECT_EQ(a.get(), (Pieces{{0, 1'000'000}}));
  EXPECT_EQ(b.get(), (Pieces{{0, 1'000'000}}));
  // 2 MB through one 100 MB/s uplink: 20 ms at least, however the two overlapped.
  EXPECT_GE(LinkLedger::now() - start, 0.02 * (1 - 1e-6));
  EXPECT_NEAR(bytes_on(*attached, 2, kH), 2e6, 1);
  EXPECT_NEAR(bytes_on(*attached, 0, kH), 1e6, 1);
  EXPECT_NEAR(bytes_on(*attached, 1, kH), 1e6, 1);
  for (const LinkUsage& u : created->usage()) {
    EXPECT_LE(u.peak_gbps[0], 0.1 * 1.02) << u.name;
    EXPECT_EQ(u.bytes[1], 0) << u.name;
  }
}

TEST_F(LinkEmulatorTest, TheCopyWithLessSlackTakesTheSharedLinkFirst) {
  auto ledger = make(0.1);  // a 300 kB chunk takes 3 ms
  LinkEmulator lax(rank_options(0, /*arbitrate=*/true, 300'000));
  LinkEmulator urgent(rank_options(1, /*arbitrate=*/true, 300'000));
  lax.attach(ledger);
  urgent.attach(ledger);
  // The uplink's to-host token is held (a chunk kept until finish()), so both copies queue.
  const uint64_t held = ledger->acquire(9, kH, {2}, {2}, 1, LinkLedger::now(), /*held=*/true);
  std::atomic<int> started{0};
  double urgent_bytes_at_lax_start = -1;
  std::once_flag first_lax_move;
  auto lax_copy = std::async(std::launch::async, [&] {
    ++started;
    return carry_scheduled(lax, kH, 600'000, /*deadline_s=*/100, [&](uint64_t, uint64_t) {
      std::call_once(first_lax_move, [&] { urgent_bytes_at_lax_start = bytes_on(*ledger, 1, kH); });
    });
  });
  while (started.load() == 0) std::this_thread::yield();
  auto urgent_copy = std::async(std::launch::async, [&] {
    ++started;
    return carry_scheduled(urgent, kH, 600'000, /*deadline_s=*/0.001);
  });
  while (started.load() < 2) std::this_thread::yield();
  // Time for both threads to queue their claims (microseconds of work each), with a wide margin
  // for a loaded machine; the lax copy claimed first.
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  ledger->finish(held);
  EXPECT_EQ(urgent_copy.get(), chunks(600'000, 300'000));
  EXPECT_EQ(lax_copy.get(), chunks(600'000, 300'000));
  // The lax copy's first chunk was granted only once every byte of the urgent copy was through
  // (whenever its thread got to run afterwards).
  EXPECT_NEAR(urgent_bytes_at_lax_start, 6e5, 1);
  EXPECT_NEAR(bytes_on(*ledger, 2, kH), 1.2e6 + 1, 1);  // the held 1-byte chunk too
}

TEST_F(LinkEmulatorTest, AMoveThatThrowsGivesBackItsTokensAndItsQueuedClaims) {
  LedgerOptions o;
  o.token_timeout_s = 10;  // a token never given back ends the test with an error, not a hang
  // 1 MB/s: a 100 kB chunk takes 100 ms, so the moment between the failed chunk's end and the
  // withdrawal of the claims behind it (in which the ledger may grant the next one) would have
  // to last 100 ms for a second queued chunk to cross.
  auto ledger = make(0.001, o);
  LinkEmulator failing(rank_options(0, /*arbitrate=*/true, 100'000));
  LinkEmulator next(rank_options(1, /*arbitrate=*/true, 100'000));
  failing.attach(ledger);
  next.attach(ledger);
  // Ten urgent chunks; moving the second one fails while the following ones are claimed ahead.
  const uint64_t ticket = enqueue_scheduled(failing, kH, 1'000'000, 0.001);
  Pieces moved;
  EXPECT_THROW(failing.carry(ticket,
                             [&](uint64_t offset, uint64_t length) {
                               moved.emplace_back(offset, length);
                               if (offset > 0) throw std::runtime_error("device copy failed");
                             }),
               std::runtime_error);
  EXPECT_EQ(moved, (Pieces{{0, 100'000}, {100'000, 100'000}}));
  // Another rank's lax copy over the same uplink gets every token it needs. Had the failed copy
  // left its six queued claims behind, their urgent chunks would all have crossed rank 0's link
  // first (600 kB more).
  EXPECT_EQ(carry_scheduled(next, kH, 200'000, 100), chunks(200'000, 100'000));
  EXPECT_NEAR(bytes_on(*ledger, 1, kH), 2e5, 1);
  EXPECT_GE(bytes_on(*ledger, 0, kH), 1e5 - 1);  // the first chunk, the failed one's start and
  EXPECT_LE(bytes_on(*ledger, 0, kH), 3e5 + 1);  // at most one granted before the withdrawal
}

}  // namespace
}  // namespace ferry
