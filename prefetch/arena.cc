// Greedy-by-size offset assignment.
#include "prefetch/arena.h"

#include <algorithm>
#include <numeric>

namespace ferry {

namespace {

bool overlap_in_time(const ArenaBlock& a, const ArenaBlock& b) {
  return a.begin <= b.end && b.begin <= a.end;
}

}  // namespace

uint64_t layout_arena(std::vector<ArenaBlock>& blocks) {
  std::vector<size_t> order(blocks.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    if (blocks[a].bytes != blocks[b].bytes) return blocks[a].bytes > blocks[b].bytes;
    return blocks[a].begin < blocks[b].begin;
  });
  std::vector<size_t> placed;
  uint64_t arena = 0;
  std::vector<std::pair<uint64_t, uint64_t>> busy;  // [offset, end) of time-overlapping blocks
  for (size_t i : order) {
    ArenaBlock& block = blocks[i];
    const uint64_t size = arena_aligned(block.bytes);
    busy.clear();
    for (size_t j : placed) {
      if (overlap_in_time(block, blocks[j])) {
        busy.emplace_back(blocks[j].offset, blocks[j].offset + arena_aligned(blocks[j].bytes));
      }
    }
    std::sort(busy.begin(), busy.end());
    uint64_t offset = 0;
    for (const auto& [start, stop] : busy) {
      if (start >= offset + size) break;  // the gap before this block fits
      offset = std::max(offset, stop);
    }
    block.offset = offset;
    arena = std::max(arena, offset + size);
    placed.push_back(i);
  }
  return arena;
}

uint64_t live_bytes_bound(const std::vector<ArenaBlock>& blocks) {
  int last = -1;
  for (const auto& b : blocks) last = std::max(last, b.end);
  std::vector<int64_t> delta(static_cast<size_t>(last + 2), 0);
  for (const auto& b : blocks) {
    delta[b.begin] += static_cast<int64_t>(arena_aligned(b.bytes));
    delta[b.end + 1] -= static_cast<int64_t>(arena_aligned(b.bytes));
  }
  int64_t live = 0, peak = 0;
  for (int64_t d : delta) {
    live += d;
    peak = std::max(peak, live);
  }
  return static_cast<uint64_t>(peak);
}

bool arena_is_valid(const std::vector<ArenaBlock>& blocks) {
  for (size_t i = 0; i < blocks.size(); ++i) {
    for (size_t j = i + 1; j < blocks.size(); ++j) {
      const ArenaBlock& a = blocks[i];
      const ArenaBlock& b = blocks[j];
      if (!overlap_in_time(a, b)) continue;
      if (a.offset < b.offset + arena_aligned(b.bytes) &&
          b.offset < a.offset + arena_aligned(a.bytes))
        return false;
    }
  }
  return true;
}

}  // namespace ferry
