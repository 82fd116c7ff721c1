// Gated copies on a real GPU: a gate holds the copy stream at each chunk until it is opened (a
// copy does not complete before its gates do, chunk by chunk), and copies gated by the link
// gatekeeper through a node ledger land bitwise in both directions. Each test skips with
// "no CUDA device present" when there is no GPU.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "device/cuda/cuda_device.h"
#include "device/device.h"
#include "links/link_gatekeeper.h"

namespace ferry {
namespace {

using namespace std::chrono_literals;
constexpr uint64_t kMiB = 1ull << 20;

// Gates every copy on the copy streams in chunks of `chunk` bytes, scheduled or not; the test
// opens the gates.
class ManualGate : public CopyArbiter, public CopyGate {
 public:
  explicit ManualGate(uint64_t chunk) : chunk_(chunk) {}
  CopyGate* gate() override { return this; }
  void bind(std::shared_ptr<GateSignals> signals) override { signals_ = std::move(signals); }
  GateTicket enqueue(bool to_device, uint64_t bytes, const CopyDeadline&) override {
    if (!signals_) return {};  // closed: not gated
    const int d = to_device ? 1 : 0;
    GateTicket t{next_[d], static_cast<uint32_t>((bytes + chunk_ - 1) / chunk_), chunk_};
    next_[d] += t.chunks;
    return t;
  }
  void close() override {
    if (!signals_) return;
    for (int d = 0; d < 2; ++d) signals_->open(d, next_[d] + (1u << 30));
    signals_.reset();
  }
  GateSignals& signals() { return *signals_; }

 private:
  uint64_t chunk_;
  uint32_t next_[2] = {1, 1};
  std::shared_ptr<GateSignals> signals_;
};

bool wait_until(const std::function<bool()>& ready, std::chrono::milliseconds limit = 5000ms) {
  const auto end = std::chrono::steady_clock::now() + limit;
  while (!ready()) {
    if (std::chrono::steady_clock::now() > end) return false;
    std::this_thread::sleep_for(50us);
  }
  return true;
}

DeviceOptions gated_options(std::shared_ptr<CopyArbiter> arbiter) {
  DeviceOptions options;
  options.backend = Backend::kCuda;
  options.memory = 256 * kMiB;
  options.arbiter = std::move(arbiter);
  return options;
}

// Pinned host bytes from the device's allocator with a pattern, freed at scope end.
class PinnedBytes {
 public:
  PinnedBytes(Device& device, uint64_t n, int seed)
      : device_(device), n_(n), data_(static_cast<unsigned char*>(device.pinned().allocate(n))) {
    for (uint64_t i = 0; i < n; ++i) data_[i] = static_cast<unsigned char>((i * 131 + seed) & 255);
  }
  ~PinnedBytes() { device_.pinned().deallocate(data_, n_); }
  PinnedBytes(const PinnedBytes&) = delete;
  PinnedBytes& operator=(const PinnedBytes&) = delete;
  unsigned char* data() const { return data_; }

 private:
  Device& device_;
  uint64_t n_;
  unsigned char* data_;
};

TEST(CudaGatedCopy, AGateHoldsTheStreamUntilItOpensChunkByChunk) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device present";
  auto gate = std::make_shared<ManualGate>(1 * kMiB);
  std::unique_ptr<Device> device = create_device(gated_options(gate));
  // Whatever fails below, every gate opens before the device drains its streams.
  struct OpenAtExit {
    ManualGate& gate;
    ~OpenAtExit() { gate.close(); }
  } open_at_exit{*gate};
  const uint64_t n = 4 * kMiB;
  {
    PinnedBytes src(*device, n, 1), back(*device, n, 2);
    void* on_device = device->memory().allocate(n, "gated");
    Stream& h2d = device->stream(StreamKind::kHostToDevice);
    Stream& d2h = device->stream(StreamKind::kDeviceToHost);
    GateSignals& s = gate->signals();

    device->copy_async(on_device, src.data(), n, h2d);
    auto uploaded = device->create_event();
    h2d.record(*uploaded);
    ASSERT_TRUE(wait_until([&] { return s.arrived(1) == 1; }))
        << "the stream never reached chunk 1";
    std::this_thread::sleep_for(20ms);
    EXPECT_FALSE(uploaded->ready()) << "a closed gate did not hold the copy";
    EXPECT_EQ(s.done(1), 0u);
    EXPECT_EQ(s.arrived(1), 1u);

    s.open(1, 2);  // two chunks of four
    ASSERT_TRUE(wait_until([&] { return s.done(1) == 2; }));
    ASSERT_TRUE(wait_until([&] { return s.arrived(1) == 3; }));
    std::this_thread::sleep_for(20ms);
    EXPECT_EQ(s.done(1), 2u) << "chunk 3 moved through a closed gate";
    EXPECT_FALSE(uploaded->ready());

    s.open(1, 4);
    uploaded->synchronize();
    EXPECT_EQ(s.done(1), 4u);

    device->copy_async(back.data(), on_device, n, d2h);
    auto downloaded = device->create_event();
    d2h.record(*downloaded);
    ASSERT_TRUE(wait_until([&] { return s.arrived(0) == 1; }));
    EXPECT_FALSE(downloaded->ready());
    s.open(0, 4);
    downloaded->synchronize();
    EXPECT_EQ(std::memcmp(back.data(), src.data(), n), 0) << "gated copies changed the bytes";
    device->memory().release(on_device);
  }
}

TEST(CudaGatedCopy, GatekeeperCopiesLandBitwiseAndEveryChunkIsFinished) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device present";
  const std::string name = LinkLedger::unique_name();
  auto ledger = LinkLedger::create(name, {{"gpu0", {25, 25, 1}}, {"sw0", {25, 25, 1}}});
  LinkLedger::unlink(name);
  LinkGateOptions g;
  g.path = {0, 1};
  g.link_gbps = 25;
  g.chunk_bytes = 4 * kMiB;
  auto gatekeeper = std::make_shared<LinkGatekeeper>(g);
  gatekeeper->attach(ledger);
  std::unique_ptr<Device> device = create_device(gated_options(gatekeeper));
  const uint64_t n = 64 * kMiB + 12345;  // 17 chunks, the last one short
  {
    PinnedBytes src(*device, n, 3), offloaded(*device, n, 4), back(*device, n, 5);
    void* a = device->memory().allocate(n, "a");
    void* b = device->memory().allocate(n, "b");
    Stream& h2d = device->stream(StreamKind::kHostToDevice);
    Stream& d2h = device->stream(StreamKind::kDeviceToHost);
    auto step = [&](Stream& from, Stream& to) {
      auto e = device->create_event();
      from.record(*e);
      to.wait(*e);
    };
    device->copy_async(a, src.data(), n, h2d);  // an input: not scheduled, not gated
    step(h2d, d2h);
    const CopyDeadline scheduled{true, 0.01};
    device->copy_async(offloaded.data(), a, n, d2h, scheduled);  // an offload: gated
    step(d2h, h2d);
    device->copy_async(b, offloaded.data(), n, h2d, scheduled);  // a prefetch: gated
    step(h2d, d2h);
    device->copy_async(back.data(), b, n, d2h);  // not scheduled
    device->synchronize();
    EXPECT_EQ(std::memcmp(offloaded.data(), src.data(), n), 0);
    EXPECT_EQ(std::memcmp(back.data(), src.data(), n), 0);
    ASSERT_TRUE(wait_until([&] { return gatekeeper->chunks_finished() == 34; }))
        << gatekeeper->chunks_finished() << " of 34 chunks finished";
    device->memory().release(b);
    device->memory().release(a);
  }
  EXPECT_NO_THROW(gatekeeper->check());
}

}  // namespace
}  // namespace ferry
