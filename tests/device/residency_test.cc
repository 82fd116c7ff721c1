// The residency state machine: each transition, the in-flight states ending only on their
// copy's event, and streams ordered after in-flight copies. Copies run on the CPU backend with
// an emulated slow link, so they are still in flight when the test looks.
#include "device/residency.h"

#include <cstring>
#include <numeric>
#include <thread>

#include <gtest/gtest.h>

#include "device/device.h"

namespace ferry {
namespace {

constexpr uint64_t kBytes = 256 << 10;  // 256 KiB: about 50 ms at 0.005 GB/s

class ResidencyTest : public ::testing::Test {
 protected:
  void SetUp() override {
    DeviceOptions o;
    o.memory = 16 << 20;
    o.cpu.link_gbps = 0.005;
    device_ = create_device(o);
    data_ = static_cast<float*>(device_->memory().allocate(kBytes, "tensor"));
    other_ = static_cast<float*>(device_->memory().allocate(kBytes, "fetch target"));
    host_ = device_->pinned().allocate(kBytes);
    std::vector<float> values(kBytes / sizeof(float));
    std::iota(values.begin(), values.end(), 1.0f);
    std::memcpy(data_, values.data(), kBytes);  // CPU device memory is host-addressable
    expected_ = values;
    ready_ = device_->create_event();
    device_->stream(StreamKind::kCompute).record(*ready_);
  }
  void TearDown() override {
    device_->synchronize();
    device_->pinned().deallocate(host_, kBytes);
  }
  std::vector<float> read(const float* p) {
    std::vector<float> out(kBytes / sizeof(float));
    std::memcpy(out.data(), p, kBytes);
    return out;
  }
  Stream& compute() { return device_->stream(StreamKind::kCompute); }
  Stream& d2h() { return device_->stream(StreamKind::kDeviceToHost); }
  Stream& h2d() { return device_->stream(StreamKind::kHostToDevice); }

  std::unique_ptr<Device> device_;
  float* data_ = nullptr;
  float* other_ = nullptr;
  void* host_ = nullptr;
  std::vector<float> expected_;
  std::unique_ptr<Event> ready_;
};

TEST_F(ResidencyTest, StartsOnDeviceAndOffloadEndsOnlyWhenTheCopyHasFinished) {
  ResidentTensor t(*device_, "x", kBytes);
  EXPECT_EQ(t.state(), ResidencyState::kOnDevice);
  t.offload(data_, host_, d2h(), *ready_);
  EXPECT_EQ(t.state(), ResidencyState::kOffloading);
  EXPECT_EQ(t.poll(), ResidencyState::kOffloading) << "a 50 ms copy cannot be done yet";
  EXPECT_EQ(t.synchronize(), ResidencyState::kOnHost);
  EXPECT_EQ(std::memcmp(host_, expected_.data(), kBytes), 0);
}

TEST_F(ResidencyTest, ComputeOrderedAfterAnOffloadDoesNotOverwriteItsSource) {
  ResidentTensor t(*device_, "x", kBytes);
  t.offload(data_, host_, d2h(), *ready_);
  t.order_after_offload(compute());
  // Reuse the space at once: without the wait this fill would race the 50 ms copy.
  device_->kernels().launch(Fill{static_cast<int64_t>(kBytes / 4), -1.0f, data_}, compute());
  compute().synchronize();
  EXPECT_EQ(t.synchronize(), ResidencyState::kOnHost);
  EXPECT_EQ(std::memcmp(host_, expected_.data(), kBytes), 0);
  EXPECT_EQ(read(data_)[0], -1.0f);
}

TEST_F(ResidencyTest, APrefetchOfAnInFlightOffloadWaitsForIt) {
  ResidentTensor t(*device_, "x", kBytes);
  t.offload(data_, host_, d2h(), *ready_);
  ASSERT_EQ(t.state(), ResidencyState::kOffloading);
  t.prefetch(other_, h2d(), *ready_);  // still offloading: must read the finished host copy
  EXPECT_EQ(t.state(), ResidencyState::kPrefetching);
  t.order_after_prefetch(compute());
  device_->kernels().launch(Scale{static_cast<int64_t>(kBytes / 4), 2.0f, other_}, compute());
  compute().synchronize();
  EXPECT_EQ(t.synchronize(), ResidencyState::kOnDevice);
  const std::vector<float> got = read(other_);
  for (size_t i = 0; i < got.size(); i += 997) ASSERT_EQ(got[i], 2.0f * expected_[i]) << i;
}

TEST_F(ResidencyTest, PrefetchFromHostThenOnDevice) {
  ResidentTensor t(*device_, "x", kBytes);
  t.offload(data_, host_, d2h(), *ready_);
  ASSERT_EQ(t.synchronize(), ResidencyState::kOnHost);
  t.prefetch(other_, h2d(), *ready_);
  EXPECT_EQ(t.poll(), ResidencyState::kPrefetching);
  EXPECT_EQ(t.synchronize(), ResidencyState::kOnDevice);
  EXPECT_EQ(read(other_), expected_);
}

TEST_F(ResidencyTest, APrefetchWaitsForTheSpaceToBeFree) {
  ResidentTensor t(*device_, "x", kBytes);
  t.offload(data_, host_, d2h(), *ready_);
  t.synchronize();
  // Compute still writes the target space for ~30 ms; the fetch must land after that.
  device_->kernels().launch(Fill{static_cast<int64_t>(kBytes / 4), 7.0f, other_}, compute());
  auto space_free = device_->create_event();
  compute().record(*space_free);
  t.prefetch(other_, h2d(), *space_free);
  t.synchronize();
  EXPECT_EQ(read(other_), expected_);
}

TEST_F(ResidencyTest, AnOffloadOfAPrefetchingTensorWaitsForTheFetch) {
  // The next step offloads the tensor again before the host has seen the last fetch finish:
  // the new copy into the same host buffer must not overwrite what the fetch still reads.
  ResidentTensor t(*device_, "x", kBytes);
  t.offload(data_, host_, d2h(), *ready_);
  t.synchronize();
  t.prefetch(other_, h2d(), *ready_);
  ASSERT_EQ(t.state(), ResidencyState::kPrefetching);
  device_->kernels().launch(Fill{static_cast<int64_t>(kBytes / 4), 5.0f, data_}, compute());
  auto produced = device_->create_event();
  compute().record(*produced);
  t.offload(data_, host_, d2h(), *produced);
  EXPECT_EQ(t.state(), ResidencyState::kOffloading);
  EXPECT_EQ(t.synchronize(), ResidencyState::kOnHost);
  h2d().synchronize();
  EXPECT_EQ(read(other_), expected_) << "the fetch read the next step's host copy";
  EXPECT_EQ(read(static_cast<const float*>(host_)), std::vector<float>(kBytes / 4, 5.0f));
}

TEST_F(ResidencyTest, InvalidTransitionsAreInvariantViolations) {
  ResidentTensor t(*device_, "x", kBytes);
  EXPECT_DEATH(t.prefetch(other_, h2d(), *ready_), "cannot prefetch in state on_device");
  EXPECT_DEATH(t.order_after_offload(compute()), "cannot wait for its offload in state on_device");
  t.offload(data_, host_, d2h(), *ready_);
  EXPECT_DEATH(t.offload(data_, host_, d2h(), *ready_), "cannot offload in state offloading");
  EXPECT_DEATH(t.order_after_prefetch(compute()),
               "cannot wait for its prefetch in state offloading");
  t.synchronize();
}

}  // namespace
}  // namespace ferry
