// HostPool: exact-size reuse of pinned blocks, the limit (dropping cached blocks of other sizes
// before failing), out-of-memory errors of kind kHostPool, trim and statistics.
#include <gtest/gtest.h>

#include <cstdlib>
#include <map>

#include "device/host_pool.h"

namespace ferry {
namespace {

// Counts what the pool asks of the pinned allocator.
class CountingAllocator : public PinnedAllocator {
 public:
  void* allocate(uint64_t bytes) override {
    ++allocations;
    void* p = std::malloc(bytes);
    live[p] = bytes;
    return p;
  }
  void deallocate(void* ptr, uint64_t bytes) override {
    ++deallocations;
    EXPECT_EQ(live.at(ptr), bytes);
    live.erase(ptr);
    std::free(ptr);
  }
  int allocations = 0, deallocations = 0;
  std::map<void*, uint64_t> live;
};

TEST(HostPool, ReusesReleasedBlocksOfExactlyTheSameSize) {
  CountingAllocator alloc;
  HostPool pool(alloc, 1 << 20);
  void* a = pool.acquire(1000, "a");
  pool.release(a);
  void* b = pool.acquire(1000, "b");
  EXPECT_EQ(b, a);
  EXPECT_EQ(alloc.allocations, 1);
  void* c = pool.acquire(999, "c");  // not the same size: a new block
  EXPECT_NE(c, a);
  EXPECT_EQ(alloc.allocations, 2);
  pool.release(b);
  pool.release(c);
  EXPECT_EQ(pool.stats().reserved, 1999u);
  EXPECT_EQ(pool.stats().in_use, 0u);
}

TEST(HostPool, LimitIsEnforcedWithAnErrorNamingLiveBlocks) {
  CountingAllocator alloc;
  HostPool pool(alloc, 4096);
  void* a = pool.acquire(3000, "layer1.0.conv1.y");
  try {
    pool.acquire(2000, "layer1.0.bn1.y");
    FAIL() << "acquired past the limit";
  } catch (const OutOfMemoryError& e) {
    EXPECT_EQ(e.where(), OutOfMemoryError::Where::kHostPool);
    EXPECT_EQ(e.requested(), 2000u);
    const std::string what = e.what();
    EXPECT_NE(what.find("layer1.0.conv1.y"), std::string::npos) << what;
    EXPECT_NE(what.find("pinned host pool"), std::string::npos) << what;
  }
  EXPECT_EQ(pool.stats().oom_count, 1u);
  pool.release(a);
}

TEST(HostPool, DropsCachedBlocksOfOtherSizesBeforeFailing) {
  CountingAllocator alloc;
  HostPool pool(alloc, 4096);
  pool.release(pool.acquire(3000, "old"));
  void* b = pool.acquire(2000, "new");  // 3000 cached + 2000 > limit: the cache is dropped
  EXPECT_NE(b, nullptr);
  EXPECT_EQ(alloc.deallocations, 1);
  EXPECT_EQ(pool.stats().reserved, 2000u);
  pool.release(b);
}

TEST(HostPool, TrimFreesCachedBlocksAndStatsTrackPeak) {
  CountingAllocator alloc;
  {
    HostPool pool(alloc, 1 << 20);
    void* a = pool.acquire(100, "a");
    void* b = pool.acquire(200, "b");
    pool.release(a);
    void* c = pool.acquire(50, "c");
    HostPoolStats s = pool.stats();
    EXPECT_EQ(s.limit, 1u << 20);
    EXPECT_EQ(s.in_use, 250u);
    EXPECT_EQ(s.peak_in_use, 300u);
    EXPECT_EQ(s.reserved, 350u);
    pool.trim();  // frees the cached 100
    EXPECT_EQ(pool.stats().reserved, 250u);
    EXPECT_EQ(alloc.deallocations, 1);
    pool.release(b);
    (void)c;  // still live: the destructor frees it
  }
  EXPECT_TRUE(alloc.live.empty()) << "the pool leaked blocks";
}

}  // namespace
}  // namespace ferry
