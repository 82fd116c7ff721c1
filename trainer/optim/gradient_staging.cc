// The staging layout of Note [Gradients through a staging ring]: a replay of one backward.
#include "trainer/optim/gradient_staging.h"

#include <algorithm>
#include <limits>

#include "common/error.h"

namespace ferry {

StagingPlan plan_staging(const StagingInputs& in) {
  const size_t buckets = in.buckets.size(), steps = in.touched.size(), params = in.slices.size();
  FERRY_ASSERT(in.written.size() == steps, "plan_staging: touched and written differ in steps");
  constexpr size_t kNotYet = std::numeric_limits<size_t>::max();
  StagingPlan plan;
  plan.bucket_offset.assign(buckets, 0);
  plan.param_offset.assign(params, 0);
  plan.waits.assign(steps + 1, {});
  plan.range_offsets.resize(buckets);
  std::vector<uint64_t> size(buckets, 0);
  for (size_t b = 0; b < buckets; ++b) {
    for (const ByteRange& r : in.buckets[b].ranges) {
      plan.range_offsets[b].push_back(size[b]);
      size[b] += r.bytes;
    }
  }
  // A bucket is held when one of its gradients is written before the step that completes it.
  std::vector<size_t> first(params, kNotYet), last(params, kNotYet);
  for (size_t s = 0; s < steps; ++s) {
    for (size_t p : in.touched[s]) first[p] = std::min(first[p], s);
    for (size_t p : in.written[s]) last[p] = s;
  }
  std::vector<uint8_t> held(buckets, 0);
  for (size_t p = 0; p < params; ++p) {
    if (first[p] != kNotYet && last[p] != kNotYet && first[p] < last[p]) held[in.bucket_of[p]] = 1;
  }
  // Replay: launched[b] is the step after which bucket b launches (steps: at the end).
  std::vector<size_t> pending(buckets, 0), launched(buckets, kNotYet);
  std::vector<uint8_t> placed(buckets, 0);
  for (size_t p = 0; p < params; ++p) ++pending[in.bucket_of[p]];
  struct Slot {
    uint64_t offset = 0, bytes = 0;
    size_t bucket = kNotYet;  // its last bucket
  };
  std::vector<Slot> slots;
  for (int i = 0; i < 2 && (i + 1) * in.slot_bytes <= in.capacity; ++i)
    slots.push_back({i * in.slot_bytes, in.slot_bytes});
  uint64_t held_next = slots.size() * in.slot_bytes;
  const auto grow = [&](uint64_t bytes) {
    const uint64_t at = std::max(plan.bytes, in.capacity);
    plan.bytes = at + bytes;
    return at;
  };
  const auto place = [&](size_t b, size_t s) {
    placed[b] = 1;
    const uint64_t z = size[b];
    if (z == 0) return;
    uint64_t at = 0;
    if (held[b]) {
      at = held_next + z <= in.capacity ? held_next : grow(z);
      held_next = std::max(held_next, at + z);
    } else {
      // A free slot, else the one whose bucket launched longest ago (before this step).
      Slot* best = nullptr;
      for (Slot& slot : slots) {
        if (slot.bytes < z) continue;
        if (slot.bucket == kNotYet) {
          best = &slot;
          break;
        }
        const size_t l = launched[slot.bucket];
        if (l == kNotYet || l >= s) continue;
        if (!best || (best->bucket != kNotYet && l < launched[best->bucket])) best = &slot;
      }
      if (!best) {
        slots.push_back({grow(std::max(z, in.slot_bytes)), std::max(z, in.slot_bytes)});
        best = &slots.back();
      }
      if (best->bucket != kNotYet) plan.waits[s].push_back(best->bucket);
      best->bucket = b;
      at = best->offset;
    }
    plan.bucket_offset[b] = at;
    plan.bytes = std::max(plan.bytes, at + z);
  };
  size_t next = 0;
  for (size_t s = 0; s <= steps; ++s) {
    if (s < steps) {
      for (size_t p : in.touched[s]) {
        if (!placed[in.bucket_of[p]]) place(in.bucket_of[p], s);
      }
      for (size_t p : in.written[s]) --pending[in.bucket_of[p]];
      while (in.overlap && next < buckets && pending[next] == 0) launched[next++] = s;
    } else {
      for (size_t b = 0; b < buckets; ++b) {
        if (!placed[b]) place(b, s);
      }
    }
  }
  for (size_t p = 0; p < params; ++p) {
    if (first[p] == kNotYet) plan.unwritten.push_back(p);
    const size_t b = in.bucket_of[p];
    const auto& ranges = in.buckets[b].ranges;
    for (size_t r = 0; r < ranges.size(); ++r) {
      const ByteRange& range = ranges[r];
      if (in.slices[p].offset >= range.offset && in.slices[p].offset < range.offset + range.bytes) {
        plan.param_offset[p] =
            plan.bucket_offset[b] + plan.range_offsets[b][r] + (in.slices[p].offset - range.offset);
      }
    }
  }
  return plan;
}

}  // namespace ferry
