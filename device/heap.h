// Device memory with a hard capacity: one block handed over by the backend, cut by a first-fit
// allocator that remembers a label per allocation, so an out-of-memory error can say what was
// resident. Invariant: in_use <= capacity, and live ranges never overlap.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "common/error.h"

namespace ferry {

struct MemoryStats {
  uint64_t capacity = 0;
  uint64_t in_use = 0;
  uint64_t peak = 0;
  uint64_t window_peak = 0;  // the largest in_use since the last start_window()
  uint64_t oom_count = 0;
  uint64_t allocations = 0;
};

class DeviceHeap {
 public:
  static constexpr uint64_t kAlignment = 256;

  // `base` points at `capacity` bytes of device memory owned by the caller.
  DeviceHeap(void* base, uint64_t capacity);
  DeviceHeap(const DeviceHeap&) = delete;
  DeviceHeap& operator=(const DeviceHeap&) = delete;

  // Reserves `bytes` (rounded up to kAlignment). Throws OutOfMemoryError naming the resident
  // allocations when no free range fits.
  void* allocate(uint64_t bytes, const std::string& label);
  void release(void* ptr);

  MemoryStats stats() const;
  void reset_peak();
  // Starts a new window for MemoryStats::window_peak (a job sharing its device measures its
  // peak per budget) without touching the run's peak.
  void start_window();
  // Live allocations, largest first.
  std::vector<ResidentBlock> resident() const;
  uint64_t capacity() const { return capacity_; }
  void* base() const { return base_; }

 private:
  struct Block {
    uint64_t bytes;
    std::string label;
  };
  std::byte* base_;
  uint64_t capacity_;
  mutable std::mutex mu_;
  std::map<uint64_t, Block> live_;     // offset -> block
  std::map<uint64_t, uint64_t> free_;  // offset -> bytes, coalesced
  MemoryStats stats_;
};

// An allocation owned by its holder; released on destruction.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(DeviceHeap& heap, uint64_t bytes, const std::string& label)
      : heap_(&heap), ptr_(heap.allocate(bytes, label)), bytes_(bytes) {}
  DeviceBuffer(DeviceBuffer&& o) noexcept { *this = std::move(o); }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() { reset(); }

  void reset();
  void* data() const { return ptr_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }
  uint64_t bytes() const { return bytes_; }
  explicit operator bool() const { return ptr_ != nullptr; }

 private:
  DeviceHeap* heap_ = nullptr;
  void* ptr_ = nullptr;
  uint64_t bytes_ = 0;
};

}  // namespace ferry
