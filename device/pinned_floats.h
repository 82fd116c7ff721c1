// A block of pinned host floats owned for a lifetime (the host optimizer's weights, gradients and
// state), from the device's PinnedAllocator, so it is placed on the rank's NUMA node before its
// first touch (Note [Pinned pages on a NUMA node] in device/host_pages.h). Invariant: zeroed when
// made, given back to its allocator exactly once.
#pragma once

#include <cstdint>
#include <cstring>
#include <utility>

#include "device/host_pool.h"

namespace ferry {

class PinnedFloats {
 public:
  PinnedFloats() = default;
  PinnedFloats(PinnedAllocator& allocator, int64_t count)
      : allocator_(&allocator), count_(count > 0 ? count : 0) {
    if (count_ == 0) return;
    data_ = static_cast<float*>(allocator.allocate(bytes()));
    std::memset(data_, 0, bytes());  // cudaHostAlloc's pages are not zeroed
  }
  ~PinnedFloats() { reset(); }
  PinnedFloats(PinnedFloats&& o) noexcept { *this = std::move(o); }
  PinnedFloats& operator=(PinnedFloats&& o) noexcept {
    if (this != &o) {
      reset();
      allocator_ = std::exchange(o.allocator_, nullptr);
      data_ = std::exchange(o.data_, nullptr);
      count_ = std::exchange(o.count_, 0);
    }
    return *this;
  }
  PinnedFloats(const PinnedFloats&) = delete;
  PinnedFloats& operator=(const PinnedFloats&) = delete;

  float* data() const { return data_; }
  int64_t size() const { return count_; }
  uint64_t bytes() const { return static_cast<uint64_t>(count_) * sizeof(float); }

 private:
  void reset() {
    if (data_) allocator_->deallocate(data_, bytes());
    data_ = nullptr;
    count_ = 0;
  }

  PinnedAllocator* allocator_ = nullptr;
  float* data_ = nullptr;
  int64_t count_ = 0;
};

}  // namespace ferry
