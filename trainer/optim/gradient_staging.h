// Where memory.zero 2's backward writes each gradient bucket: a staging area of a few buckets
// reused as buckets are reduce-scattered, laid out once per program. Invariant: a bucket's region
// is written only after the reduction of every bucket that used those bytes before has completed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "comm/bucket_plan.h"

namespace ferry {

// Note [Gradients through a staging ring]
// Under memory.zero 2 (ranks > 1, comm.overlap) no rank keeps a whole gradient block. Backward
// writes each parameter's gradient into the region of its bucket in a staging area; a bucket's
// region holds its byte ranges back to back, so each range is one contiguous reduce-scatter. As
// soon as backward completes a bucket it is reduce-scattered on the comm stream and this rank's
// part is copied (first micro-batch of an update) or added (later ones, optim.accumulate) into
// the gradient shard, S floats, on the comm stream behind the collective. Only the shard
// persists.
//
// The layout is planned once per program by replaying its backward. The area is cut as Note
// [Model state per rank] sizes it: two bucket slots, then the held buckets. Before the step that
// first writes any parameter of a bucket, the bucket takes a free slot, else the slot of the
// bucket launched longest ago, whose reduction (and shard copy) compute then waits for before
// that step (an event, never a host wait). A bucket launched after step s frees its slot for
// steps after s only. A bucket with a gradient written by several steps (a tied embedding: the
// head starts it, the embedding finishes it) is held: it gets bytes of its own past the slots
// for the whole backward. A backward the replay cannot fit (three buckets live at once: one
// step first writes several buckets while the one before is not yet complete) grows the area
// past the plan; the run says so on stderr, and its measured peak then exceeds the planned one.

struct StagingInputs {
  std::span<const Bucket> buckets;    // in launch order (assign_buckets)
  std::span<const size_t> bucket_of;  // per parameter
  std::span<const GradSlice> slices;  // per parameter, in the (padded) gradient block
  // Per backward-ordered step: the parameters it writes at all, and those it writes last
  // (marked ready for their bucket after it).
  std::span<const std::vector<size_t>> touched;
  std::span<const std::vector<size_t>> written;
  bool overlap = true;      // buckets launch as they become ready (false: all at finish)
  uint64_t slot_bytes = 0;  // one bucket slot (two at the area's start)
  uint64_t capacity = 0;    // the staging area's bytes: two slots and the held buckets
};

struct StagingPlan {
  std::vector<uint64_t> bucket_offset;  // bytes into the staging area, per bucket
  std::vector<uint64_t> param_offset;   // bytes into the staging area, per parameter
  // Per step, and one more entry for the end of backward (before the remaining launches): the
  // buckets whose reduction must complete before that step writes the bytes they held.
  std::vector<std::vector<size_t>> waits;
  // Parameters no step writes: their staged bytes are zeroed before their bucket launches.
  std::vector<size_t> unwritten;
  std::vector<std::vector<uint64_t>> range_offsets;  // per bucket, per range: bytes in
  uint64_t bytes = 0;  // the extent the layout uses (> capacity: the area must grow)
};

StagingPlan plan_staging(const StagingInputs& in);

}  // namespace ferry
