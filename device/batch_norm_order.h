// The order in which both backends sum a batch-norm channel (Note [Batch norm's summation
// order]), shared so that the CUDA kernels and the CPU kernels add the same doubles in the same
// order and agree bit for bit. C++17, for nvcc.
#pragma once

#include <algorithm>
#include <cstdint>

namespace ferry {

// Note [Batch norm's summation order]
// A channel's count = N*HW values, in NCHW order (plane by plane), are cut into `chunks` runs of
// `len` consecutive values (the last may be shorter) by batch_norm_split, a function of the shape
// only. Inside a chunk, lane l of kBatchNormLanes adds the chunk's values l, l + kBatchNormLanes,
// ... in order, starting from 0.0; the lanes are then added by a pairwise tree (at each level,
// with half = kBatchNormLanes / 2, ..., 1, lane l += lane l + half for l < half). The channel's
// sum is 0.0 plus the chunks' sums in chunk order. On the GPU each chunk is one block's work (a
// thread per lane), so a channel spreads over up to kBatchNormMaxChunks blocks; on the CPU the
// same loops run in one thread per channel. Sums are in double; the statistics take two passes
// (the mean, then the squared deviations from it), and the backward pass's two sums one.

inline constexpr int kBatchNormLanes = 256;
// A chunk holds at least this many values (16 per lane) ...
inline constexpr int64_t kBatchNormMinChunk = 16 * kBatchNormLanes;
// ... a channel has at most this many chunks ...
inline constexpr int64_t kBatchNormMaxChunks = 256;
// ... and all channels together at most this many (the CUDA backend's scratch of partial sums).
inline constexpr int64_t kBatchNormMaxPartials = 16384;

struct BatchNormSplit {
  int64_t chunks = 1, len = 1;
};

// How each of `channels` channels of `count` values is cut; no chunk is empty.
inline BatchNormSplit batch_norm_split(int64_t count, int64_t channels) {
  int64_t chunks = (count + kBatchNormMinChunk - 1) / kBatchNormMinChunk;
  chunks = std::min(chunks, std::min(kBatchNormMaxChunks, kBatchNormMaxPartials / channels));
  chunks = std::max<int64_t>(chunks, 1);
  BatchNormSplit split;
  split.len = (count + chunks - 1) / chunks;
  split.chunks = (count + split.len - 1) / split.len;
  return split;
}

}  // namespace ferry
