// DeviceHeap: first-fit placement, coalescing frees, alignment, statistics, and out-of-memory
// errors that name what is resident.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "device/heap.h"

namespace ferry {
namespace {

constexpr uint64_t kA = DeviceHeap::kAlignment;

class HeapTest : public ::testing::Test {
 protected:
  static constexpr uint64_t kCapacity = 64 * kA;
  HeapTest() : block_(kCapacity + kA), heap_(aligned_base(), kCapacity) {}
  void* aligned_base() {
    auto p = reinterpret_cast<uintptr_t>(block_.data());
    return reinterpret_cast<void*>((p + kA - 1) / kA * kA);
  }
  uint64_t offset(void* p) const {
    return static_cast<uint64_t>(static_cast<std::byte*>(p) -
                                 static_cast<std::byte*>(heap_.base()));
  }
  std::vector<std::byte> block_;
  DeviceHeap heap_;
};

TEST_F(HeapTest, SizesRoundUpToTheAlignment) {
  void* a = heap_.allocate(1, "a");
  void* b = heap_.allocate(kA + 1, "b");
  EXPECT_EQ(offset(a), 0u);
  EXPECT_EQ(offset(b), kA);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(b) % kA, 0u);
  EXPECT_EQ(heap_.stats().in_use, 3 * kA);
  void* c = heap_.allocate(0, "empty");  // still a distinct block
  EXPECT_EQ(offset(c), 3 * kA);
}

TEST_F(HeapTest, FirstFitTakesTheLowestHoleThatFits) {
  void* a = heap_.allocate(4 * kA, "a");
  void* b = heap_.allocate(2 * kA, "b");
  void* c = heap_.allocate(4 * kA, "c");
  void* d = heap_.allocate(kA, "d");
  heap_.release(a);  // hole of 4 at 0
  heap_.release(c);  // hole of 4 at 6
  void* e = heap_.allocate(3 * kA, "e");
  EXPECT_EQ(offset(e), 0u) << "first fit, not best fit or last freed";
  void* f = heap_.allocate(2 * kA, "f");  // 1 left at 3 is too small: next hole at 6
  EXPECT_EQ(offset(f), 6 * kA);
  void* g = heap_.allocate(kA, "g");
  EXPECT_EQ(offset(g), 3 * kA);
  heap_.release(b);
  heap_.release(d);
  heap_.release(e);
  heap_.release(f);
  heap_.release(g);
}

TEST_F(HeapTest, FreesCoalesceWithBothNeighbours) {
  std::vector<void*> blocks;
  for (int i = 0; i < 8; ++i) blocks.push_back(heap_.allocate(8 * kA, "block"));
  EXPECT_THROW(heap_.allocate(kA, "none left"), OutOfMemoryError);
  // Free 1 and 3, then 2 between them: one hole of 24.
  heap_.release(blocks[1]);
  heap_.release(blocks[3]);
  EXPECT_THROW(heap_.allocate(9 * kA, "too big for either hole"), OutOfMemoryError);
  heap_.release(blocks[2]);
  void* big = heap_.allocate(24 * kA, "big");
  EXPECT_EQ(offset(big), 8 * kA);
  heap_.release(big);
  for (int i : {0, 4, 5, 6, 7}) heap_.release(blocks[i]);
  void* all = heap_.allocate(kCapacity, "everything");
  EXPECT_EQ(offset(all), 0u);
  heap_.release(all);
  EXPECT_EQ(heap_.stats().in_use, 0u);
}

TEST_F(HeapTest, OutOfMemoryNamesTheResidentAllocations) {
  void* w = heap_.allocate(40 * kA, "conv1.weight");
  void* y = heap_.allocate(20 * kA, "layer2.0.conv1.y");
  try {
    heap_.allocate(8 * kA, "layer3.0.bn1.y");
    FAIL() << "allocation beyond capacity succeeded";
  } catch (const OutOfMemoryError& e) {
    const std::string what = e.what();
    EXPECT_EQ(e.where(), OutOfMemoryError::Where::kDevice);
    EXPECT_EQ(e.requested(), 8 * kA);
    EXPECT_NE(what.find("layer3.0.bn1.y"), std::string::npos) << what;
    EXPECT_NE(what.find("conv1.weight"), std::string::npos) << what;
    EXPECT_NE(what.find("layer2.0.conv1.y"), std::string::npos) << what;
    ASSERT_EQ(e.resident().size(), 2u);
    EXPECT_EQ(e.resident()[0].label, "conv1.weight");  // largest first
    EXPECT_EQ(e.resident()[1].bytes, 20 * kA);
    EXPECT_FALSE(e.hint().empty());
  }
  EXPECT_EQ(heap_.stats().oom_count, 1u);
  heap_.release(w);
  heap_.release(y);
}

TEST_F(HeapTest, StatsTrackPeakAllocationsAndReset) {
  void* a = heap_.allocate(10 * kA, "a");
  void* b = heap_.allocate(20 * kA, "b");
  heap_.release(a);
  void* c = heap_.allocate(5 * kA, "c");
  MemoryStats s = heap_.stats();
  EXPECT_EQ(s.capacity, kCapacity);
  EXPECT_EQ(s.in_use, 25 * kA);
  EXPECT_EQ(s.peak, 30 * kA);
  EXPECT_EQ(s.allocations, 3u);
  EXPECT_EQ(s.oom_count, 0u);
  heap_.reset_peak();
  EXPECT_EQ(heap_.stats().peak, 25 * kA);
  const auto resident = heap_.resident();
  ASSERT_EQ(resident.size(), 2u);
  EXPECT_EQ(resident[0].label, "b");
  heap_.release(b);
  heap_.release(c);
}

TEST_F(HeapTest, DeviceBufferReleasesOnDestructionAndMove) {
  {
    DeviceBuffer a(heap_, 3 * kA, "a");
    EXPECT_EQ(heap_.stats().in_use, 3 * kA);
    DeviceBuffer b = std::move(a);
    EXPECT_FALSE(a);
    EXPECT_TRUE(b);
    EXPECT_EQ(b.bytes(), 3 * kA);
    EXPECT_EQ(heap_.stats().in_use, 3 * kA);
  }
  EXPECT_EQ(heap_.stats().in_use, 0u);
}

}  // namespace
}  // namespace ferry
