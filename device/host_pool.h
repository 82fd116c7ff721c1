// Pinned host memory for offloaded tensors and input batches: blocks of exact sizes, reused
// across steps, capped by a limit. Invariant: reserved bytes (live + cached) <= limit.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "common/error.h"

namespace ferry {

// Where pinned pages come from: cudaHostAlloc on CUDA, page-aligned (optionally NUMA-bound)
// memory on the CPU backend.
class PinnedAllocator {
 public:
  virtual ~PinnedAllocator() = default;
  virtual void* allocate(uint64_t bytes) = 0;
  virtual void deallocate(void* ptr, uint64_t bytes) = 0;
};

struct HostPoolStats {
  uint64_t limit = 0;
  uint64_t reserved = 0;  // live + cached for reuse
  uint64_t in_use = 0;
  uint64_t peak_in_use = 0;
  uint64_t oom_count = 0;
};

class HostPool {
 public:
  HostPool(PinnedAllocator& allocator, uint64_t limit);
  ~HostPool();
  HostPool(const HostPool&) = delete;
  HostPool& operator=(const HostPool&) = delete;

  // A block of exactly `bytes`, reused from an earlier release of the same size when one is
  // cached. Throws OutOfMemoryError (kHostPool) when the limit would be exceeded.
  void* acquire(uint64_t bytes, const std::string& label);
  void release(void* ptr);
  // Frees the cached (released) blocks.
  void trim();

  HostPoolStats stats() const;
  uint64_t limit() const { return limit_; }

 private:
  PinnedAllocator& allocator_;
  uint64_t limit_;
  mutable std::mutex mu_;
  std::map<void*, std::pair<uint64_t, std::string>> live_;
  std::multimap<uint64_t, void*> cached_;  // bytes -> block
  HostPoolStats stats_;
};

}  // namespace ferry
