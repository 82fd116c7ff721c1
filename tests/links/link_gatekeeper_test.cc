// The GPU link gatekeeper against stand-in copy streams (threads that run the ops the CUDA device
// enqueues per chunk: mark arrival, wait for the gate, copy, mark done): chunks are opened in
// order and all finished, data lands bitwise, two ranks on one link never move chunks at once,
// closing opens every gate, and a device failure frees the token and ends the gating.
#include "links/link_gatekeeper.h"

#include <atomic>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <future>
#include <mutex>
#include <numeric>
#include <string>
#include <thread>

#include <gtest/gtest.h>

#include "common/error.h"

namespace ferry {
namespace {

using namespace std::chrono_literals;

// A stream stand-in: runs its ops in order on its own thread.
class FakeStream {
 public:
  FakeStream() : worker_([this] { run(); }) {}
  ~FakeStream() {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    worker_.join();
  }
  void enqueue(std::function<void()> op) {
    std::lock_guard lock(mu_);
    ops_.push_back(std::move(op));
    ++enqueued_;
    cv_.notify_all();
  }
  // Blocks until every op enqueued so far has run.
  void synchronize() {
    std::unique_lock lock(mu_);
    cv_.wait(lock, [&] { return ran_ == enqueued_; });
  }
  bool idle() {
    std::lock_guard lock(mu_);
    return ran_ == enqueued_;
  }

 private:
  void run() {
    for (;;) {
      std::function<void()> op;
      {
        std::unique_lock lock(mu_);
        cv_.wait(lock, [&] { return stop_ || !ops_.empty(); });
        if (ops_.empty()) return;
        op = std::move(ops_.front());
        ops_.pop_front();
      }
      op();
      std::lock_guard lock(mu_);
      ++ran_;
      cv_.notify_all();
    }
  }
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> ops_;
  uint64_t enqueued_ = 0;
  uint64_t ran_ = 0;
  bool stop_ = false;
  std::thread worker_;
};

// Records every gate opening, and throws from check_device once told to (a device failure).
class RecordingSignals : public MappedGateSignals {
 public:
  explicit RecordingSignals(GateFlags* flags) : MappedGateSignals(flags) {}
  void open(int dir, uint32_t seq) override {
    {
      std::lock_guard lock(mu);
      opened[dir].push_back(seq);
    }
    MappedGateSignals::open(dir, seq);
  }
  void check_device(int) override {
    if (fail_device) throw LibraryError("fake", "stream", "device failed", __FILE__, __LINE__);
  }
  std::mutex mu;
  std::vector<uint32_t> opened[2];
  std::atomic<bool> fail_device{false};
};

uint32_t load(uint32_t& word) {
  return std::atomic_ref<uint32_t>(word).load(std::memory_order_acquire);
}
void store(uint32_t& word, uint32_t v) {
  std::atomic_ref<uint32_t>(word).store(v, std::memory_order_release);
}

// One rank's device stand-in: a copy stream per direction, the flags, and copy_async as the
// CUDA device does it. `on_chunk` runs around each gated chunk's copy (to watch the link).
class FakeDevice {
 public:
  explicit FakeDevice(std::shared_ptr<LinkGatekeeper> gate) : gate_(std::move(gate)) {
    signals_ = std::make_shared<RecordingSignals>(&flags_);
    gate_->bind(signals_);
  }
  ~FakeDevice() {
    synchronize();
    gate_->close();
  }
  void copy_async(void* dst, const void* src, uint64_t bytes, bool to_device,
                  const CopyDeadline& deadline = {}) {
    const int d = to_device ? 1 : 0;
    FakeStream& s = streams_[d];
    const GateTicket t = gate_->enqueue(to_device, bytes, deadline);
    if (t.chunks == 0) {
      s.enqueue([=] { std::memcpy(dst, src, bytes); });
      return;
    }
    GateWords& w = flags_.dir[d];
    for (uint32_t i = 0; i < t.chunks; ++i) {
      const uint32_t seq = t.first_seq + i;
      const uint64_t offset = i * t.chunk_bytes;
      const uint64_t length = std::min(t.chunk_bytes, bytes - offset);
      s.enqueue([&w, seq] { store(w.arrived, seq); });
      s.enqueue([&w, seq] {
        while (!seq_reached(load(w.gate), seq)) std::this_thread::yield();
      });
      s.enqueue([=, this] {
        if (on_chunk) on_chunk(d, true);
        std::memcpy(static_cast<char*>(dst) + offset, static_cast<const char*>(src) + offset,
                    length);
        if (on_chunk) on_chunk(d, false);
      });
      s.enqueue([&w, seq] { store(w.done, seq); });
    }
  }
  FakeStream& stream(bool to_device) { return streams_[to_device ? 1 : 0]; }
  void synchronize() {
    for (auto& s : streams_) s.synchronize();
  }
  RecordingSignals& signals() { return *signals_; }

  std::function<void(int dir, bool start)> on_chunk;

 private:
  GateFlags flags_;
  std::shared_ptr<LinkGatekeeper> gate_;
  std::shared_ptr<RecordingSignals> signals_;
  FakeStream streams_[2];
};

class Gatekeeper : public ::testing::Test {
 protected:
  void SetUp() override {
    name_ = LinkLedger::unique_name();
    // Links 0 and 1: two GPUs' own links; 2: the switch uplink they share. Fast links, so the
    // fluid model is through with a chunk long before the stand-in stream is (Note [Held chunks]).
    ledger_ = LinkLedger::create(
        name_, {{"gpu0", {1000, 1000, 1}}, {"gpu1", {1000, 1000, 1}}, {"sw0", {1000, 1000, 1}}});
  }
  void TearDown() override { LinkLedger::unlink(name_); }

  std::shared_ptr<LinkGatekeeper> make(int rank, uint64_t chunk_bytes) {
    LinkGateOptions o;
    o.rank = rank;
    o.path = {rank, 2};
    o.link_gbps = 1000;
    o.chunk_bytes = chunk_bytes;
    auto g = std::make_shared<LinkGatekeeper>(o);
    g->attach(ledger_);
    return g;
  }

  // Whether the uplink's to-host token can be taken within `timeout` by an outsider.
  bool uplink_free(TransferDirection d, double timeout = 2.0) {
    LedgerOptions o;
    o.token_timeout_s = timeout;
    auto other = LinkLedger::open(name_, o);
    try {
      const uint64_t flow = other->acquire(99, d, {2}, {2}, 1, LinkLedger::now(), true);
      other->finish(flow);
      return true;
    } catch (const LinkArbiterError&) {
      return false;
    }
  }

  std::string name_;
  std::shared_ptr<LinkLedger> ledger_;
};

// The stream's done word comes before the gatekeeper reads it: wait for it to catch up.
uint64_t finished_after_catch_up(const LinkGatekeeper& g, uint64_t want) {
  for (int i = 0; i < 2000 && g.chunks_finished() < want; ++i) std::this_thread::sleep_for(1ms);
  return g.chunks_finished();
}

// The deadline the topology scheduler gives an offload or prefetch.
CopyDeadline scheduled(double deadline_s = 0.01) { return CopyDeadline{true, deadline_s}; }

std::vector<char> pattern(size_t n, int seed) {
  std::vector<char> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<char>((i * 131 + seed * 7) & 0xff);
  return v;
}

// What link 2 (the uplink) holds now, for a failure message: each copy or claim's rank, kind,
// direction, token and bytes.
std::string uplink_now(LinkLedger& ledger) {
  std::string out;
  const LedgerSnapshot snap = ledger.snapshot();
  for (const LinkUserEntry& u : snap.links[2].users) {
    out += "rank " + std::to_string(u.rank) + " " + u.kind + " dir " + std::to_string(u.dir) +
           (u.token ? " token " : " ") + std::to_string(u.bytes) + " bytes; ";
  }
  return out.empty() ? "nothing on the uplink" : out;
}

// Whether the uplink's `d` token is free now, asked without waiting on any clock: a claim whose
// link-directions are free is granted the moment it is made (LinkLedger::claim), after the model
// has been advanced to that moment, so a one-byte probe claim is granted at once exactly when the
// token is free. The probe is withdrawn either way (a granted one frees the token again).
bool uplink_free_now(LinkLedger& ledger, TransferDirection d) {
  const uint64_t probe = ledger.claim(99, d, {2}, {2}, 1, LinkLedger::now(), /*held=*/true);
  bool waiting = false;
  const LedgerSnapshot snap = ledger.snapshot();
  for (const LinkUserEntry& u : snap.links[2].users) waiting |= u.kind == "claim" && u.rank == 99;
  ledger.withdraw(probe);
  return !waiting;
}

// The ledger side (Note [Held chunks]): a held chunk keeps its tokens past its modelled time,
// until finish(); an ordinary chunk's tokens free when the model has carried it.
// Note [No clock window in the held-chunk test]: the test once asked "is the token free?" by
// taking it from a second mapping of the block with a 0.05 s token timeout (a wall-clock window,
// and a second checked open of the block). It failed once in 0.01 s in a loaded suite run, too
// fast for that window to have closed, and was never reproduced (tens of thousands of runs at
// load 10-16). It now asks the one ledger without waiting: a probe claim, granted at once or not.
// Its only clock assumption is a lower bound (the sleeps let the model carry 1000 bytes, which
// take 1 ns at 1000 GB/s); a late wake-up only makes that truer. That a held token counts as
// stalled for the token timeout is NodeLedger.AnotherJobsStuckHeldChunkLosesItsTokenInstead...'s.
TEST_F(Gatekeeper, AHeldChunkKeepsItsTokensUntilFinished) {
  const auto kH = TransferDirection::kToHost;
  const uint64_t held = ledger_->acquire(0, kH, {0, 2}, {0, 2}, 1000, 0, /*held=*/true);
  std::this_thread::sleep_for(1ms);
  // Through in the model (no bytes left) and still holding its token.
  const std::vector<LinkUserEntry> on = ledger_->snapshot().links[2].users;
  ASSERT_EQ(on.size(), 1u) << uplink_now(*ledger_);
  EXPECT_EQ(on[0].kind, "flow");
  EXPECT_EQ(on[0].bytes, 0.0) << "the model has carried the held chunk's bytes";
  EXPECT_TRUE(on[0].token) << uplink_now(*ledger_);
  EXPECT_FALSE(uplink_free_now(*ledger_, kH))
      << "the held chunk's token was freed by the model: " << uplink_now(*ledger_);
  ledger_->finish(held);
  EXPECT_TRUE(uplink_free_now(*ledger_, kH)) << uplink_now(*ledger_);
  const uint64_t plain = ledger_->acquire(0, kH, {0, 2}, {0, 2}, 1000, 0);
  std::this_thread::sleep_for(1ms);
  EXPECT_TRUE(uplink_free_now(*ledger_, kH))
      << "an ordinary chunk kept its token past its bytes: " << uplink_now(*ledger_);
  ledger_->wait_flow(plain);
}

TEST_F(Gatekeeper, OpensEveryChunkInOrderAndTheDataLands) {
  auto gate = make(0, 1000);
  FakeDevice dev(gate);
  const std::vector<uint64_t> sizes = {3500, 1000, 1, 2999};
  std::vector<std::vector<char>> src, host(sizes.size()), back(sizes.size());
  uint32_t chunks = 0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    src.push_back(pattern(sizes[i], static_cast<int>(i)));
    host[i].assign(sizes[i], 0);
    back[i].assign(sizes[i], 0);
    chunks += static_cast<uint32_t>((sizes[i] + 999) / 1000);
  }
  for (size_t i = 0; i < sizes.size(); ++i)
    dev.copy_async(host[i].data(), src[i].data(), sizes[i], false, scheduled());
  dev.synchronize();
  for (size_t i = 0; i < sizes.size(); ++i)
    dev.copy_async(back[i].data(), host[i].data(), sizes[i], true, scheduled());
  // An unscheduled copy (an input) is not gated.
  std::vector<char> input = pattern(5000, 9), input_dst(5000, 0);
  dev.copy_async(input_dst.data(), input.data(), input.size(), true);
  dev.synchronize();
  for (size_t i = 0; i < sizes.size(); ++i) EXPECT_EQ(back[i], src[i]) << "copy " << i;
  EXPECT_EQ(input_dst, input);
  EXPECT_EQ(finished_after_catch_up(*gate, 2u * chunks), 2u * chunks);
  for (int d = 0; d < 2; ++d) {
    std::vector<uint32_t> want(chunks);
    std::iota(want.begin(), want.end(), 1u);
    std::lock_guard lock(dev.signals().mu);
    EXPECT_EQ(dev.signals().opened[d], want) << "direction " << d;
  }
  EXPECT_TRUE(uplink_free(TransferDirection::kToHost));
  EXPECT_TRUE(uplink_free(TransferDirection::kToDevice));
}

TEST_F(Gatekeeper, TwoRanksOnOneUplinkNeverMoveChunksAtOnce) {
  std::atomic<int> moving[2] = {0, 0};
  std::atomic<int> most[2] = {0, 0};
  auto watch = [&](int d, bool start) {
    if (!start) {
      --moving[d];
      return;
    }
    const int now = ++moving[d];
    int m = most[d];
    while (now > m && !most[d].compare_exchange_weak(m, now)) {
    }
    std::this_thread::sleep_for(300us);  // the chunk takes a while on the "hardware"
  };
  auto g0 = make(0, 4096);
  auto g1 = make(1, 4096);
  {
    FakeDevice d0(g0), d1(g1);
    d0.on_chunk = watch;
    d1.on_chunk = watch;
    const uint64_t n = 40000;  // 10 chunks each
    std::vector<char> a = pattern(n, 1), b = pattern(n, 2), ha(n), hb(n), da(n), db(n);
    for (auto [g, dev, src, host, dst] :
         {std::tuple{g0, &d0, &a, &ha, &da}, std::tuple{g1, &d1, &b, &hb, &db}}) {
      dev->copy_async(host->data(), src->data(), n, false, scheduled());
      dev->copy_async(dst->data(), src->data(), n, true, scheduled());
    }
    d0.synchronize();
    d1.synchronize();
    EXPECT_EQ(ha, a);
    EXPECT_EQ(hb, b);
    EXPECT_EQ(da, a);
    EXPECT_EQ(db, b);
    EXPECT_EQ(finished_after_catch_up(*g0, 20), 20u);
    EXPECT_EQ(finished_after_catch_up(*g1, 20), 20u);
  }
  EXPECT_EQ(most[0].load(), 1) << "two chunks on the uplink to host at once";
  EXPECT_EQ(most[1].load(), 1) << "two chunks on the uplink to device at once";
}

TEST_F(Gatekeeper, ClosingOpensEveryGateSoTheStreamDrains) {
  auto gate = make(0, 1000);
  FakeDevice dev(gate);
  std::atomic<bool> hold{true};
  dev.stream(false).enqueue([&] {
    while (hold) std::this_thread::sleep_for(100us);
  });
  const uint64_t n = 5000;
  std::vector<char> src = pattern(n, 3), dst(n, 0);
  dev.copy_async(dst.data(), src.data(), n, false, scheduled());
  std::this_thread::sleep_for(5ms);
  gate->close();  // the gatekeeper stops while no chunk has arrived
  hold = false;
  dev.stream(false).synchronize();  // would hang on a closed gate
  EXPECT_EQ(dst, src);
  EXPECT_EQ(gate->chunks_finished(), 0u);
  // Closed: later copies are not gated, and no token was left behind.
  std::vector<char> dst2(n, 0);
  dev.copy_async(dst2.data(), src.data(), n, false, scheduled());
  dev.synchronize();
  EXPECT_EQ(dst2, src);
  EXPECT_TRUE(uplink_free(TransferDirection::kToHost));
}

TEST_F(Gatekeeper, ADeviceFailureFreesTheTokenOpensTheGatesAndEndsTheJob) {
  auto gate = make(0, 1000);
  LinkGateOptions o = gate->options();
  FakeDevice dev(gate);
  std::atomic<bool> stall{true};
  std::atomic<bool> in_chunk{false};
  dev.on_chunk = [&](int, bool start) {
    if (!start) return;
    in_chunk = true;
    while (stall) std::this_thread::sleep_for(100us);  // the chunk never completes (yet)
  };
  const uint64_t n = 3000;
  std::vector<char> src = pattern(n, 4), dst(n, 0);
  dev.copy_async(dst.data(), src.data(), n, false, scheduled());
  while (!in_chunk) std::this_thread::sleep_for(100us);
  // The first chunk is granted and moving: its token is held.
  EXPECT_FALSE(uplink_free(TransferDirection::kToHost, 0.05));
  dev.signals().fail_device = true;
  // The gatekeeper notices within a few check periods, frees the token and records the failure.
  EXPECT_TRUE(uplink_free(TransferDirection::kToHost));
  for (int i = 0; i < 1000; ++i) {
    try {
      gate->check();
    } catch (const LibraryError&) {
      break;
    }
    std::this_thread::sleep_for(1ms);
  }
  EXPECT_THROW(gate->check(), LibraryError);
  EXPECT_THROW(gate->enqueue(false, n, CopyDeadline{}), LibraryError);
  EXPECT_THROW(gate->enqueue(false, n, scheduled()), LibraryError);
  stall = false;
  dev.synchronize();  // the remaining chunks' gates are open
  EXPECT_EQ(dst, src);
  EXPECT_EQ(gate->chunks_finished(), 0u);
}

}  // namespace
}  // namespace ferry
