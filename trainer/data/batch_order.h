// The order of a loader's batches, without threads: the samples of each epoch, the slice of a
// global batch each rank takes, the next position and each batch's image side. Invariant: every
// answer is a pure function of (dataset size, batch settings, seed, position).
#pragma once

#include <cstdint>
#include <vector>

namespace ferry {

// Where a loader is in its endless sequence of batches: batch `batch` of epoch `epoch`.
struct LoaderPosition {
  int64_t epoch = 0;
  int64_t batch = 0;
  bool operator==(const LoaderPosition&) const = default;
};

// A run of the epoch order: order[begin, begin + count).
struct SliceRange {
  int64_t begin = 0;
  int64_t count = 0;
};

// Note [Partial global batch]
// The global batch b of an epoch is order[b*G, min((b+1)*G, N)) with G = world_size *
// batch_size, and rank r takes the r-th batch_size slice of it. When the last global batch holds
// R < G samples (drop_last = false), it is split as evenly as possible in order: ranks r < R % W
// get R / W + 1 samples, the others R / W (possibly 0), and rank r's slice starts at
// r * (R / W) + min(r, R % W). Concatenating the ranks' slices in rank order gives the global
// batch, as for full batches, so the data seen does not depend on W.

// How `size` samples cut into global batches of world_size * batch_size, as seen by `rank`.
class BatchOrder {
 public:
  BatchOrder() = default;
  // size >= 0, batch_size >= 1, 0 <= rank < world_size (DataLoader checks them).
  BatchOrder(int64_t size, int64_t batch_size, int world_size, int rank, bool drop_last);

  // Global batches in an epoch (0 when drop_last and size < one global batch).
  int64_t per_epoch() const { return per_epoch_; }
  // This rank's part of global batch `batch` (Note [Partial global batch]).
  SliceRange rank_slice(int64_t batch) const;
  // Every rank's part of global batch `batch`.
  SliceRange global_slice(int64_t batch) const;
  // The position after `p` (per_epoch() >= 1).
  LoaderPosition next(LoaderPosition p) const;
  // The position `batches` batches after (0, 0) (per_epoch() >= 1).
  LoaderPosition after(int64_t batches) const;

 private:
  int64_t size_ = 0;
  int64_t batch_size_ = 1;
  int world_size_ = 1;
  int rank_ = 0;
  int64_t per_epoch_ = 0;
};

// The order of the samples in `epoch`: a permutation of [0, size) that depends only on
// (seed, epoch) (Fisher-Yates on counter-based random numbers); the identity when !shuffle.
std::vector<int64_t> epoch_order(int64_t size, bool shuffle, uint64_t seed, int64_t epoch);

// The image side of the batch at `p` (Note [Per-batch sides] in loader.h): one of `scales`,
// drawn from (seed, epoch, batch); 0 when scales is empty.
int64_t batch_side(const std::vector<int64_t>& scales, uint64_t seed, LoaderPosition p);

}  // namespace ferry
