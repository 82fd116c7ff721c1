// Static arena layout: blocks whose step intervals do not overlap may share offsets, so the
// exact peak is known before the first step and the arena never fragments.
// Invariant: two blocks whose [begin, end] intervals intersect never overlap in memory.
#pragma once

#include <cstdint>
#include <vector>

namespace ferry {

struct ArenaBlock {
  uint64_t bytes = 0;
  int begin = 0;        // first step it occupies
  int end = 0;          // last step it occupies (inclusive)
  uint64_t offset = 0;  // filled by layout_arena
};

constexpr uint64_t kArenaAlignment = 256;

// `bytes` rounded up to kArenaAlignment: what a block of that size occupies.
constexpr uint64_t arena_aligned(uint64_t bytes) {
  return (bytes + kArenaAlignment - 1) / kArenaAlignment * kArenaAlignment;
}

// Assigns offsets (greedy by size: largest first, each at the lowest aligned offset that
// fits beside the blocks it overlaps in time). Returns the arena size.
uint64_t layout_arena(std::vector<ArenaBlock>& blocks);

// max over steps of the bytes live at that step: no layout can be smaller than this.
uint64_t live_bytes_bound(const std::vector<ArenaBlock>& blocks);

// Checks the invariant; returns false if two time-overlapping blocks overlap in memory.
bool arena_is_valid(const std::vector<ArenaBlock>& blocks);

}  // namespace ferry
