// The transfer engine: copies go through the link scheduler's hooks in request order, totals
// are kept, traced copies carry start and end events that bracket the copy, and each copy hands
// the scheduler's deadline to the device's copy arbiter with the copy itself; the host
// optimizer's copies (TransferEngine::copy) take the same hooks, deadline and trace, counted apart.
#include "prefetch/transfer_engine.h"

#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace ferry {
namespace {

class RecordingScheduler : public LinkScheduler {
 public:
  explicit RecordingScheduler(std::vector<std::string>* log) : log_(log) {}
  std::string_view name() const override { return "recording"; }
  void before_copy(const TransferRequest& r, Stream&) override {
    log_->push_back("before " + r.tensor +
                    (r.direction == TransferDirection::kToHost ? " d2h" : " h2d"));
  }
  void after_copy(const TransferRequest& r, Stream&) override {
    log_->push_back("after " + r.tensor);
  }

 private:
  std::vector<std::string>* log_;
};

TEST(TransferEngine, CopiesGoThroughTheSchedulerAndAreCountedAndTraced) {
  DeviceOptions o;
  o.memory = 16 << 20;
  o.cpu.link_gbps = 0.01;  // 128 KiB: about 13 ms
  auto device = create_device(o);
  constexpr uint64_t kBytes = 128 << 10;
  void* a = device->memory().allocate(kBytes, "a");
  void* b = device->memory().allocate(kBytes, "b");
  std::memset(a, 0x5a, kBytes);
  void* host = device->pinned().allocate(kBytes);
  std::vector<std::string> log;
  TransferEngine engine(*device, std::make_unique<RecordingScheduler>(&log));
  engine.set_tracing(true);
  auto ready = device->create_event();
  device->stream(StreamKind::kCompute).record(*ready);
  ResidentTensor t(*device, "act", kBytes);
  engine.offload(t, a, host, *ready, 5);
  engine.prefetch(t, b, *ready, 9);
  t.synchronize();
  EXPECT_EQ(log, (std::vector<std::string>{"before act d2h", "after act", "before act h2d",
                                           "after act"}));
  EXPECT_EQ(engine.stats().to_host_bytes, kBytes);
  EXPECT_EQ(engine.stats().to_device_bytes, kBytes);
  EXPECT_EQ(engine.stats().transfers, 2u);
  EXPECT_EQ(std::memcmp(a, b, kBytes), 0);
  device->synchronize();
  auto traced = engine.take_traced();
  ASSERT_EQ(traced.size(), 2u);
  EXPECT_EQ(traced[0].request.deadline_step, 5);
  EXPECT_EQ(traced[1].request.direction, TransferDirection::kToDevice);
  for (auto& tr : traced) {
    const double ms = device->elapsed_ms(*tr.start, *tr.end);
    EXPECT_GE(ms, 10.0) << "the emulated link takes ~13 ms for 128 KiB";
    EXPECT_LT(ms, 2000.0);
  }
  // The prefetch started after the offload had finished (it read the host copy); the end mark
  // is recorded just after the copy's own event, so allow it a millisecond of lag.
  EXPECT_GE(device->elapsed_ms(*traced[0].end, *traced[1].start), -1.0);
  EXPECT_TRUE(engine.take_traced().empty());
  device->pinned().deallocate(host, kBytes);
}

TEST(TransferEngine, FifoIsTheDefaultObliviousScheduler) {
  FifoLinkScheduler fifo;
  EXPECT_EQ(fifo.name(), "fifo");
  EXPECT_FALSE(
      fifo.deadline(TransferRequest{TransferDirection::kToHost, "t", 1, 2, 0.5}).scheduled);
}

// A scheduler that schedules every copy at three times its planned seconds (to tell them apart).
class StretchingScheduler : public FifoLinkScheduler {
 public:
  CopyDeadline deadline(const TransferRequest& r) const override {
    return CopyDeadline{true, 3 * r.deadline_s};
  }
};

// A pacing arbiter that records the deadline each copy arrives with.
class DeadlineRecorder : public CopyArbiter, public CopyPacer {
 public:
  CopyPacer* pacer() override { return this; }
  uint64_t enqueue(bool to_device, uint64_t bytes, const CopyDeadline& deadline) override {
    std::lock_guard lock(mu_);
    seen_.push_back({to_device, bytes, deadline.scheduled, deadline.deadline_s, deadline.kind});
    return 1;
  }
  void carry(uint64_t, const std::function<void(uint64_t, uint64_t)>&) override {}
  struct Seen {
    bool to_device;
    uint64_t bytes;
    bool scheduled;
    double deadline_s;
    CopyKind kind;
  };
  std::vector<Seen> seen() {
    std::lock_guard lock(mu_);
    return seen_;
  }

 private:
  std::mutex mu_;
  std::vector<Seen> seen_;
};

TEST(TransferEngine, EachCopyCarriesItsSchedulersDeadlineToTheArbiter) {
  auto recorder = std::make_shared<DeadlineRecorder>();
  DeviceOptions o;
  o.memory = 1 << 20;
  o.arbiter = recorder;
  auto device = create_device(o);
  constexpr uint64_t kBytes = 4096;
  void* a = device->memory().allocate(kBytes, "a");
  void* host = device->pinned().allocate(kBytes);
  TransferEngine engine(*device, std::make_unique<StretchingScheduler>());
  auto ready = device->create_event();
  device->stream(StreamKind::kCompute).record(*ready);
  ResidentTensor t(*device, "act", kBytes);
  device->copy_async(a, host, 16, device->stream(StreamKind::kHostToDevice));  // an input
  engine.offload(t, a, host, *ready, 5, 0.25);
  engine.prefetch(t, a, *ready, 9, 0.5);
  device->synchronize();
  const auto seen = recorder->seen();
  ASSERT_EQ(seen.size(), 3u);
  EXPECT_TRUE(seen[0].to_device);
  EXPECT_FALSE(seen[0].scheduled) << "a copy outside the engine has no deadline";
  EXPECT_EQ(seen[0].kind, CopyKind::kOther);
  EXPECT_EQ(seen[1].kind, CopyKind::kActivation) << "the engine labels what its copies carry";
  EXPECT_EQ(seen[2].kind, CopyKind::kActivation);
  EXPECT_FALSE(seen[1].to_device);
  EXPECT_EQ(seen[1].bytes, kBytes);
  EXPECT_TRUE(seen[1].scheduled);
  EXPECT_DOUBLE_EQ(seen[1].deadline_s, 0.75);
  EXPECT_TRUE(seen[2].to_device);
  EXPECT_TRUE(seen[2].scheduled);
  EXPECT_DOUBLE_EQ(seen[2].deadline_s, 1.5);
  device->pinned().deallocate(host, kBytes);
}

// Note [Host copies on the links]: a model-state copy waits for its ready event, goes through the
// scheduler's hooks with its deadline to the arbiter, is counted apart from the activations, is
// traced with its purpose, and records its done event after the bytes have moved.
TEST(TransferEngine, OptimizerCopiesTakeTheSameHooksDeadlineAndTrace) {
  auto recorder = std::make_shared<DeadlineRecorder>();
  DeviceOptions o;
  o.memory = 1 << 20;
  auto device = create_device(o);
  constexpr uint64_t kBytes = 8192;
  auto* grads = static_cast<float*>(device->memory().allocate(kBytes, "gradients"));
  auto* weights = static_cast<float*>(device->memory().allocate(kBytes, "weights"));
  for (uint64_t i = 0; i < kBytes / 4; ++i) grads[i] = static_cast<float>(i);
  auto* host = static_cast<float*>(device->pinned().allocate(kBytes));
  std::vector<std::string> log;
  TransferEngine engine(*device, std::make_unique<RecordingScheduler>(&log));
  engine.set_tracing(true);
  auto ready = device->create_event();
  auto down = device->create_event();
  auto up = device->create_event();
  Stream& compute = device->stream(StreamKind::kCompute);
  compute.record(*ready);
  const TransferRequest d2h{TransferDirection::kToHost, "gradients w", kBytes, -1, 0.5,
                            TransferPurpose::kOptimizer};
  engine.copy(d2h, host, grads, *ready, *down);
  down->synchronize();
  for (uint64_t i = 0; i < kBytes / 4; ++i) ASSERT_EQ(host[i], static_cast<float>(i));
  host[3] = -1.0f;
  const TransferRequest h2d{TransferDirection::kToDevice, "weights w", kBytes, -1, 0.25,
                            TransferPurpose::kOptimizer};
  engine.copy(h2d, weights, host, *down, *up);
  compute.wait(*up);
  compute.synchronize();
  EXPECT_EQ(weights[3], -1.0f);
  EXPECT_EQ(weights[4], 4.0f);
  EXPECT_EQ(log, (std::vector<std::string>{"before gradients w d2h", "after gradients w",
                                           "before weights w h2d", "after weights w"}));
  EXPECT_EQ(engine.stats().optimizer_to_host_bytes, kBytes);
  EXPECT_EQ(engine.stats().optimizer_to_device_bytes, kBytes);
  EXPECT_EQ(engine.stats().optimizer_copies, 2u);
  EXPECT_EQ(engine.stats().transfers, 0u) << "activation totals stay the plan's";
  EXPECT_EQ(engine.stats().to_host_bytes, 0u);
  const auto traced = engine.take_traced();
  ASSERT_EQ(traced.size(), 2u);
  EXPECT_EQ(traced[0].request.purpose, TransferPurpose::kOptimizer);
  EXPECT_EQ(traced[1].request.direction, TransferDirection::kToDevice);
  device->pinned().deallocate(host, kBytes);

  // Under a scheduling scheduler the copy carries its deadline to the device's arbiter.
  o.arbiter = recorder;
  auto paced = create_device(o);
  void* a = paced->memory().allocate(kBytes, "a");
  void* pinned = paced->pinned().allocate(kBytes);
  TransferEngine scheduled(*paced, std::make_unique<StretchingScheduler>());
  auto r2 = paced->create_event();
  auto d2 = paced->create_event();
  paced->stream(StreamKind::kCompute).record(*r2);
  scheduled.copy(h2d, a, pinned, *r2, *d2);
  paced->synchronize();
  const auto seen = recorder->seen();
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_TRUE(seen[0].to_device);
  EXPECT_TRUE(seen[0].scheduled);
  EXPECT_DOUBLE_EQ(seen[0].deadline_s, 0.75);
  EXPECT_EQ(seen[0].kind, CopyKind::kOptimizer);
  paced->pinned().deallocate(pinned, kBytes);
}

}  // namespace
}  // namespace ferry
