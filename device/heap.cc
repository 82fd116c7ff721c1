// First-fit allocation over the device block, with coalescing frees.
#include "device/heap.h"

#include <algorithm>

#include <fmt/format.h>

#include "common/bytes.h"

namespace ferry {

namespace {
uint64_t round_up(uint64_t n, uint64_t a) { return (n + a - 1) / a * a; }
}  // namespace

DeviceHeap::DeviceHeap(void* base, uint64_t capacity)
    : base_(static_cast<std::byte*>(base)), capacity_(capacity) {
  stats_.capacity = capacity;
  if (capacity > 0) free_[0] = capacity;
}

void* DeviceHeap::allocate(uint64_t bytes, const std::string& label) {
  const uint64_t size = round_up(std::max<uint64_t>(bytes, 1), kAlignment);
  std::lock_guard lock(mu_);
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    if (it->second < size) continue;
    const uint64_t offset = it->first;
    const uint64_t remaining = it->second - size;
    free_.erase(it);
    if (remaining > 0) free_[offset + size] = remaining;
    live_[offset] = Block{size, label};
    stats_.in_use += size;
    stats_.peak = std::max(stats_.peak, stats_.in_use);
    stats_.window_peak = std::max(stats_.window_peak, stats_.in_use);
    ++stats_.allocations;
    return base_ + offset;
  }
  ++stats_.oom_count;
  std::vector<ResidentBlock> resident;
  for (const auto& [offset, block] : live_) resident.push_back({block.label, block.bytes});
  std::sort(resident.begin(), resident.end(),
            [](const ResidentBlock& a, const ResidentBlock& b) { return a.bytes > b.bytes; });
  uint64_t largest_free = 0;
  for (const auto& [offset, len] : free_) largest_free = std::max(largest_free, len);
  throw OutOfMemoryError(
      OutOfMemoryError::Where::kDevice, label, size, stats_.in_use, capacity_, std::move(resident),
      fmt::format("raise device.memory (largest free range {}), lower data.batch_size, or set "
                  "memory.policy to vdnn-all or auto with a memory.budget",
                  format_bytes(largest_free)));
}

void DeviceHeap::release(void* ptr) {
  if (ptr == nullptr) return;
  std::lock_guard lock(mu_);
  const uint64_t offset = static_cast<uint64_t>(static_cast<std::byte*>(ptr) - base_);
  auto it = live_.find(offset);
  FERRY_ASSERT(it != live_.end(), "release of a pointer the heap did not allocate");
  uint64_t start = offset;
  uint64_t size = it->second.bytes;
  stats_.in_use -= size;
  live_.erase(it);
  // Coalesce with the free neighbours.
  auto next = free_.lower_bound(start);
  if (next != free_.end() && next->first == start + size) {
    size += next->second;
    next = free_.erase(next);
  }
  if (next != free_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == start) {
      start = prev->first;
      size += prev->second;
      free_.erase(prev);
    }
  }
  free_[start] = size;
}

MemoryStats DeviceHeap::stats() const {
  std::lock_guard lock(mu_);
  return stats_;
}

void DeviceHeap::reset_peak() {
  std::lock_guard lock(mu_);
  stats_.peak = stats_.in_use;
}

void DeviceHeap::start_window() {
  std::lock_guard lock(mu_);
  stats_.window_peak = stats_.in_use;
}

std::vector<ResidentBlock> DeviceHeap::resident() const {
  std::lock_guard lock(mu_);
  std::vector<ResidentBlock> out;
  for (const auto& [offset, block] : live_) out.push_back({block.label, block.bytes});
  std::sort(out.begin(), out.end(),
            [](const ResidentBlock& a, const ResidentBlock& b) { return a.bytes > b.bytes; });
  return out;
}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& o) noexcept {
  if (this != &o) {
    reset();
    heap_ = o.heap_;
    ptr_ = o.ptr_;
    bytes_ = o.bytes_;
    o.heap_ = nullptr;
    o.ptr_ = nullptr;
    o.bytes_ = 0;
  }
  return *this;
}

void DeviceBuffer::reset() {
  if (heap_ && ptr_) heap_->release(ptr_);
  heap_ = nullptr;
  ptr_ = nullptr;
  bytes_ = 0;
}

}  // namespace ferry
