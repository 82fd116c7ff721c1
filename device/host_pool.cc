// Exact-size caching of pinned host blocks.
#include "device/host_pool.h"

#include <algorithm>

#include "common/bytes.h"

namespace ferry {

HostPool::HostPool(PinnedAllocator& allocator, uint64_t limit)
    : allocator_(allocator), limit_(limit) {
  stats_.limit = limit;
}

HostPool::~HostPool() {
  trim();
  for (auto& [ptr, entry] : live_) allocator_.deallocate(ptr, entry.first);
}

void* HostPool::acquire(uint64_t bytes, const std::string& label) {
  std::lock_guard lock(mu_);
  void* ptr = nullptr;
  if (auto it = cached_.find(bytes); it != cached_.end()) {
    ptr = it->second;
    cached_.erase(it);
  } else {
    if (stats_.reserved + bytes > limit_) {
      // Drop cached blocks of other sizes before giving up.
      for (auto c = cached_.begin(); c != cached_.end() && stats_.reserved + bytes > limit_;) {
        allocator_.deallocate(c->second, c->first);
        stats_.reserved -= c->first;
        c = cached_.erase(c);
      }
    }
    if (stats_.reserved + bytes > limit_) {
      ++stats_.oom_count;
      std::vector<ResidentBlock> resident;
      for (const auto& [p, entry] : live_) resident.push_back({entry.second, entry.first});
      std::sort(resident.begin(), resident.end(),
                [](const ResidentBlock& a, const ResidentBlock& b) { return a.bytes > b.bytes; });
      throw OutOfMemoryError(OutOfMemoryError::Where::kHostPool, label, bytes, stats_.reserved,
                             limit_, std::move(resident),
                             "raise memory.host_limit, or offload less (memory.policy, "
                             "memory.budget)");
    }
    ptr = allocator_.allocate(bytes);
    stats_.reserved += bytes;
  }
  live_[ptr] = {bytes, label};
  stats_.in_use += bytes;
  stats_.peak_in_use = std::max(stats_.peak_in_use, stats_.in_use);
  return ptr;
}

void HostPool::release(void* ptr) {
  if (ptr == nullptr) return;
  std::lock_guard lock(mu_);
  auto it = live_.find(ptr);
  FERRY_ASSERT(it != live_.end(), "release of a block the host pool did not hand out");
  const uint64_t bytes = it->second.first;
  stats_.in_use -= bytes;
  live_.erase(it);
  cached_.emplace(bytes, ptr);
}

void HostPool::trim() {
  std::lock_guard lock(mu_);
  for (auto& [bytes, ptr] : cached_) {
    allocator_.deallocate(ptr, bytes);
    stats_.reserved -= bytes;
  }
  cached_.clear();
}

HostPoolStats HostPool::stats() const {
  std::lock_guard lock(mu_);
  return stats_;
}

}  // namespace ferry
