// DeviceHeap with a HeapBacking (Note [Backing a heap on use]), against a backing that records
// its pieces: every granule a live allocation touches backed exactly once, nothing else backed,
// every piece given back exactly as backed and only once no live allocation touches it, held =
// the granules touched, first-fit offsets those of a heap without a backing, held_after exact,
// and a piece that cannot be backed leaving the heap as it was.
#include <gtest/gtest.h>

#include <cstdint>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "device/heap.h"

namespace ferry {
namespace {

constexpr uint64_t kA = DeviceHeap::kAlignment;
constexpr uint64_t kG = 4 * kA;  // the recording backing's granule

// Records the pieces backed; checks each call against the contract of HeapBacking.
class RecordingBacking : public HeapBacking {
 public:
  explicit RecordingBacking(uint64_t reach) : reach_(reach) {}
  uint64_t granule() const override { return kG; }
  void back(uint64_t offset, uint64_t bytes, const std::string& label, uint64_t asked) override {
    ++backs;
    if (fail_at > 0 && backs == fail_at) {
      throw OutOfMemoryError(OutOfMemoryError::Where::kDevice, label, asked, 0, 0, {},
                             "the recording backing refused");
    }
    EXPECT_EQ(offset % kG, 0u) << offset;
    EXPECT_EQ(bytes % kG, 0u) << bytes;
    EXPECT_GT(bytes, 0u);
    EXPECT_LE(offset + bytes, reach_) << "beyond the reserved range";
    for (uint64_t k = offset; k < offset + bytes; k += kG) {
      EXPECT_TRUE(granules_.insert(k).second) << "granule " << k << " backed twice";
    }
    pieces[offset] = bytes;
  }
  void unback(uint64_t offset, uint64_t bytes) noexcept override {
    ++unbacks;
    const auto it = pieces.find(offset);
    if (it == pieces.end() || it->second != bytes) {
      ADD_FAILURE() << "gave back [" << offset << ", +" << bytes << ") which was not one piece";
      return;
    }
    pieces.erase(it);
    for (uint64_t k = offset; k < offset + bytes; k += kG) granules_.erase(k);
  }
  uint64_t mapped() const { return granules_.size() * kG; }
  const std::set<uint64_t>& granules() const { return granules_; }

  std::map<uint64_t, uint64_t> pieces;  // offset -> bytes
  int backs = 0;
  int unbacks = 0;
  int fail_at = 0;  // > 0: that back() call (counted from 1) throws

 private:
  uint64_t reach_;
  std::set<uint64_t> granules_;
};

// A range aligned to the granule, never touched (the backing is a recorder).
class Range {
 public:
  explicit Range(uint64_t bytes) : block_(bytes + kG) {}
  void* base() {
    auto p = reinterpret_cast<uintptr_t>(block_.data());
    return reinterpret_cast<void*>((p + kG - 1) / kG * kG);
  }

 private:
  std::vector<std::byte> block_;
};

class HeapBackingTest : public ::testing::Test {
 protected:
  static constexpr uint64_t kCapacity = 64 * kG + 3 * kA;  // not a whole number of granules
  static constexpr uint64_t kReach = 65 * kG;              // round_up(capacity, granule)
  HeapBackingTest()
      : range_(kReach), backing_(kReach), heap_(range_.base(), kCapacity, &backing_) {}

  uint64_t offset(void* p) const {
    return static_cast<uint64_t>(static_cast<std::byte*>(p) -
                                 static_cast<std::byte*>(heap_.base()));
  }
  // The granules that the live allocations touch, by brute force.
  std::set<uint64_t> touched() const {
    std::set<uint64_t> out;
    for (const auto& [at, bytes] : live_)
      for (uint64_t k = at / kG * kG; k < at + bytes; k += kG) out.insert(k);
    return out;
  }
  void* allocate(uint64_t bytes) {
    void* p = heap_.allocate(bytes, "block");
    live_[offset(p)] = (std::max<uint64_t>(bytes, 1) + kA - 1) / kA * kA;
    return p;
  }
  void release(void* p) {
    live_.erase(offset(p));
    heap_.release(p);
  }
  // Backed = touched, exactly, and held counts it.
  void expect_backed_as_touched(const std::string& when) {
    EXPECT_EQ(backing_.granules(), touched()) << when;
    EXPECT_EQ(heap_.stats().held, backing_.mapped()) << when;
    EXPECT_EQ(heap_.stats().held, touched().size() * kG) << when;
  }

  Range range_;
  RecordingBacking backing_;
  DeviceHeap heap_;
  std::map<uint64_t, uint64_t> live_;  // offset -> rounded bytes
};

TEST_F(HeapBackingTest, AnAllocationIsBackedAsItsEdgesAndItsWholeGranules) {
  EXPECT_EQ(heap_.granule(), kG);
  void* pad = allocate(kA);  // so the next one starts inside granule 0
  EXPECT_EQ(backing_.pieces, (std::map<uint64_t, uint64_t>{{0, kG}}));
  void* big = allocate(3 * kG);  // [kA, kA + 3kG): granule 0 (shared), 1-2 whole, 3 an edge
  EXPECT_EQ(offset(big), kA);
  EXPECT_EQ(backing_.pieces, (std::map<uint64_t, uint64_t>{{0, kG}, {kG, 2 * kG}, {3 * kG, kG}}));
  EXPECT_EQ(heap_.stats().held, 4 * kG);
  EXPECT_EQ(heap_.stats().in_use, 3 * kG + kA);
  expect_backed_as_touched("after two");
  release(pad);  // granule 0 is still big's
  EXPECT_EQ(backing_.unbacks, 0);
  expect_backed_as_touched("after pad");
  release(big);
  EXPECT_TRUE(backing_.pieces.empty());
  EXPECT_EQ(backing_.unbacks, 3);
  EXPECT_EQ(heap_.stats().held, 0u);
}

TEST_F(HeapBackingTest, AGranuleSharedByNeighboursGoesBackWithTheLastOfThem) {
  void* a = allocate(kG + kA);  // [0, kG + kA): granule 0 whole, granule 1 an edge
  void* b = allocate(kA);       // inside granule 1
  void* c = allocate(kG);       // [kG + 2kA, 2kG + 2kA): granule 1 shared, granule 2 an edge
  EXPECT_EQ(backing_.pieces, (std::map<uint64_t, uint64_t>{{0, kG}, {kG, kG}, {2 * kG, kG}}));
  expect_backed_as_touched("three");
  release(b);
  release(a);  // granule 1 stays: c touches it
  EXPECT_EQ(backing_.pieces, (std::map<uint64_t, uint64_t>{{kG, kG}, {2 * kG, kG}}));
  expect_backed_as_touched("c alone");
  void* d = allocate(kA);  // first fit at 0: granule 0 backed again
  EXPECT_EQ(offset(d), 0u);
  expect_backed_as_touched("d");
  release(c);
  EXPECT_EQ(backing_.pieces, (std::map<uint64_t, uint64_t>{{0, kG}}));
  release(d);
  EXPECT_TRUE(backing_.pieces.empty());
  EXPECT_EQ(backing_.backs, backing_.unbacks);
}

TEST_F(HeapBackingTest, SmallAllocationsInOneGranuleBackItOnce) {
  std::vector<void*> small;
  for (int i = 0; i < 4; ++i) small.push_back(allocate(kA));
  EXPECT_EQ(backing_.backs, 1);
  EXPECT_EQ(heap_.stats().held, kG);
  for (int i : {2, 0, 3}) {
    release(small[static_cast<size_t>(i)]);
    EXPECT_EQ(backing_.unbacks, 0);
  }
  release(small[1]);
  EXPECT_EQ(backing_.unbacks, 1);
  EXPECT_EQ(heap_.stats().held, 0u);
}

TEST_F(HeapBackingTest, TheLastGranuleReachesPastTheCapacity) {
  void* all = allocate(kCapacity);
  EXPECT_EQ(heap_.stats().held, kReach);
  EXPECT_EQ(backing_.pieces, (std::map<uint64_t, uint64_t>{{0, 64 * kG}, {64 * kG, kG}}));
  release(all);
  EXPECT_EQ(heap_.stats().held, 0u);
}

// Random allocations and releases: backed = touched after every step, offsets as without a
// backing, and held_after foretells held.
TEST_F(HeapBackingTest, RandomTrafficKeepsBackedEqualToTouched) {
  Range plain_range(kReach);
  DeviceHeap plain(plain_range.base(), kCapacity);
  std::mt19937 rng(19);
  std::vector<std::pair<void*, void*>> held;  // (backed heap's, plain heap's)
  int allocations = 0, failures = 0;
  for (int step = 0; step < 3000; ++step) {
    // Phases that fill the heap and phases that drain it.
    const bool grow = held.empty() || rng() % 100 < ((step / 300) % 2 == 0 ? 75u : 35u);
    if (grow) {
      const uint64_t bytes = rng() % 4 == 0 ? 1 + rng() % (6 * kG) : 1 + rng() % (kG + kA);
      // Sometimes in place of a live block, as the executor replaces its arena.
      const bool replace = !held.empty() && rng() % 4 == 0;
      const size_t r = replace ? rng() % held.size() : 0;
      const uint64_t foretold = heap_.held_after(bytes, replace ? held[r].first : nullptr);
      if (replace) {
        release(held[r].first);
        plain.release(held[r].second);
        held.erase(held.begin() + static_cast<std::ptrdiff_t>(r));
      }
      void* p = nullptr;
      void* q = nullptr;
      try {
        q = plain.allocate(bytes, "block");
      } catch (const OutOfMemoryError&) {
        EXPECT_THROW(allocate(bytes), OutOfMemoryError) << "step " << step;
        ++failures;
        continue;
      }
      p = allocate(bytes);
      ++allocations;
      EXPECT_EQ(offset(p), static_cast<uint64_t>(static_cast<std::byte*>(q) -
                                                 static_cast<std::byte*>(plain.base())))
          << "first fit placed it elsewhere, step " << step;
      EXPECT_EQ(heap_.stats().held, foretold) << "held_after, step " << step;
      held.emplace_back(p, q);
    } else {
      const size_t r = rng() % held.size();
      release(held[r].first);
      plain.release(held[r].second);
      held.erase(held.begin() + static_cast<std::ptrdiff_t>(r));
    }
    expect_backed_as_touched("step " + std::to_string(step));
    EXPECT_EQ(heap_.stats().in_use, plain.stats().in_use);
    EXPECT_GE(heap_.stats().held, heap_.stats().in_use);
    if (HasFailure()) return;
  }
  EXPECT_GT(allocations, 1000);
  EXPECT_GT(failures, 0) << "the traffic never filled the heap";
  for (auto& [p, q] : held) {
    release(p);
    plain.release(q);
  }
  EXPECT_TRUE(backing_.pieces.empty());
  EXPECT_EQ(backing_.backs, backing_.unbacks);
  EXPECT_EQ(heap_.stats().held, 0u);
}

TEST_F(HeapBackingTest, APieceThatCannotBeBackedLeavesTheHeapAsItWas) {
  void* pad = allocate(kA);
  const MemoryStats before = heap_.stats();
  const auto pieces_before = backing_.pieces;
  backing_.fail_at = backing_.backs + 2;  // the second piece of the next allocation: its tail
  try {
    heap_.allocate(2 * kG, "activation arena");  // [kA, 2kG + kA): granule 1 whole, 2 an edge
    FAIL() << "the backing's refusal did not reach the caller";
  } catch (const OutOfMemoryError& e) {
    EXPECT_EQ(e.requested(), 2 * kG);
    EXPECT_NE(std::string(e.what()).find("activation arena"), std::string::npos) << e.what();
  }
  EXPECT_EQ(backing_.pieces, pieces_before) << "the piece backed before the failure stayed";
  EXPECT_EQ(heap_.stats().in_use, before.in_use);
  EXPECT_EQ(heap_.stats().held, before.held);
  EXPECT_EQ(heap_.stats().allocations, before.allocations);
  EXPECT_EQ(heap_.stats().oom_count, before.oom_count + 1);
  backing_.fail_at = 0;
  void* again = allocate(2 * kG);
  EXPECT_EQ(offset(again), kA) << "the range went back to the free list";
  expect_backed_as_touched("after the retry");
  release(again);
  release(pad);
  EXPECT_TRUE(backing_.pieces.empty());
}

TEST_F(HeapBackingTest, HeldAfterReplacingFreesTheOldBlockFirst) {
  void* persistent = allocate(kG + kA);  // [0, kG + kA)
  void* arena = allocate(5 * kG);        // [kG + kA, 6kG + kA)
  EXPECT_EQ(heap_.stats().held, 7 * kG);
  // A smaller arena in its place: granules 0..3 (the shared granule 1 stays).
  EXPECT_EQ(heap_.held_after(2 * kG, arena), 4 * kG);
  // A larger one than fits beside the old: placed after it only when the old one stays.
  EXPECT_EQ(heap_.held_after(10 * kG, arena), 12 * kG);
  // Beside it: granule 6 is shared, 7..15 whole, 16 an edge.
  EXPECT_EQ(heap_.held_after(10 * kG), 17 * kG);
  EXPECT_EQ(heap_.stats().held, 7 * kG) << "held_after changed nothing";
  EXPECT_EQ(backing_.backs, 4);  // persistent: whole 0, edge 1; arena: whole 2..5, edge 6
  release(arena);
  release(persistent);
}

TEST_F(HeapBackingTest, DestroyingTheHeapGivesBackWhatIsStillAllocated) {
  Range range(kReach);
  RecordingBacking backing(kReach);
  {
    DeviceHeap heap(range.base(), kCapacity, &backing);
    heap.allocate(3 * kA, "leaked");
    heap.allocate(2 * kG, "leaked too");
    EXPECT_FALSE(backing.pieces.empty());
  }
  EXPECT_TRUE(backing.pieces.empty());
  EXPECT_EQ(backing.backs, backing.unbacks);
}

TEST(HeapWithoutBacking, HoldsItsInUseAndForetellsItPlainly) {
  Range range(64 * kA);
  DeviceHeap heap(range.base(), 64 * kA);
  EXPECT_EQ(heap.granule(), 0u);
  void* a = heap.allocate(3 * kA + 1, "a");
  void* b = heap.allocate(kA, "b");
  EXPECT_EQ(heap.stats().held, heap.stats().in_use);
  EXPECT_EQ(heap.held_after(10 * kA), 15 * kA);
  EXPECT_EQ(heap.held_after(10 * kA, a), 11 * kA);
  heap.release(a);
  EXPECT_EQ(heap.stats().held, kA);
  heap.release(b);
  EXPECT_EQ(heap.stats().held, 0u);
}

}  // namespace
}  // namespace ferry
