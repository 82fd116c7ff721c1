// The residency transitions.
#include "device/residency.h"

#include <fmt/format.h>

#include "common/error.h"

namespace ferry {

std::string_view residency_name(ResidencyState s) {
  switch (s) {
    case ResidencyState::kOnDevice:
      return "on_device";
    case ResidencyState::kOffloading:
      return "offloading";
    case ResidencyState::kOnHost:
      return "on_host";
    case ResidencyState::kPrefetching:
      return "prefetching";
  }
  return "?";
}

ResidentTensor::ResidentTensor(Device& device, std::string name, uint64_t bytes)
    : device_(device),
      name_(std::move(name)),
      bytes_(bytes),
      offloaded_(device.create_event()),
      prefetched_(device.create_event()) {}

void ResidentTensor::expect(bool ok, std::string_view action) const {
  FERRY_ASSERT(ok, fmt::format("residency of '{}': cannot {} in state {}", name_, action,
                               residency_name(state_)));
}

void ResidentTensor::offload(const void* device_ptr, void* host_ptr, Stream& d2h, Event& ready,
                             const CopyDeadline& deadline) {
  expect(state_ == ResidencyState::kOnDevice || state_ == ResidencyState::kPrefetching, "offload");
  // A new offload of a tensor whose last fetch may still be in flight (the next step's, issued
  // without a host wait) writes the host copy only after that fetch has read it.
  if (state_ == ResidencyState::kPrefetching) d2h.wait(*prefetched_);
  host_ = host_ptr;
  d2h.wait(ready);
  device_.copy_async(host_ptr, device_ptr, bytes_, d2h, deadline);
  d2h.record(*offloaded_);
  state_ = ResidencyState::kOffloading;
}

void ResidentTensor::prefetch(void* device_ptr, Stream& h2d, Event& ready,
                              const CopyDeadline& deadline) {
  expect(state_ == ResidencyState::kOnHost || state_ == ResidencyState::kOffloading, "prefetch");
  // A fetch of a tensor whose offload is still in flight reads the host copy only after it.
  if (state_ == ResidencyState::kOffloading) h2d.wait(*offloaded_);
  h2d.wait(ready);
  device_.copy_async(device_ptr, host_, bytes_, h2d, deadline);
  h2d.record(*prefetched_);
  state_ = ResidencyState::kPrefetching;
}

void ResidentTensor::order_after_offload(Stream& stream) {
  expect(state_ == ResidencyState::kOffloading || state_ == ResidencyState::kOnHost,
         "wait for its offload");
  stream.wait(*offloaded_);
}

void ResidentTensor::order_after_prefetch(Stream& stream) {
  expect(state_ == ResidencyState::kPrefetching || state_ == ResidencyState::kOnDevice,
         "wait for its prefetch");
  stream.wait(*prefetched_);
}

ResidencyState ResidentTensor::poll() {
  if (state_ == ResidencyState::kOffloading && offloaded_->ready())
    state_ = ResidencyState::kOnHost;
  if (state_ == ResidencyState::kPrefetching && prefetched_->ready()) {
    state_ = ResidencyState::kOnDevice;
  }
  return state_;
}

ResidencyState ResidentTensor::synchronize() {
  if (state_ == ResidencyState::kOffloading) offloaded_->synchronize();
  if (state_ == ResidencyState::kPrefetching) prefetched_->synchronize();
  return poll();
}

}  // namespace ferry
