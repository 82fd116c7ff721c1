// Bucket assignment for gradient all-reduce, PyTorch DDP's rule: walk the parameters in the
// order backward produces their gradients and fill buckets up to a byte cap. The assignment
// depends only on the slice table, the order and the cap, so it is identical on every rank.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace ferry {

// Where one parameter's gradient lies in the gradient block. Offsets and sizes are in bytes
// and multiples of sizeof(float); slices must not overlap.
struct GradSlice {
  uint64_t offset = 0;
  uint64_t bytes = 0;
};

// A contiguous byte range of the gradient block; all-reduced as one collective.
struct ByteRange {
  uint64_t offset = 0;
  uint64_t bytes = 0;
  bool operator==(const ByteRange&) const = default;
};

struct Bucket {
  std::vector<size_t> params;     // indices into the slice table, in production order
  std::vector<ByteRange> ranges;  // the params' slices sorted by offset, touching ones merged
  uint64_t bytes = 0;             // sum of the params' slice sizes
};

// n-1, n-2, ..., 0: the order backward produces the gradients of a feed-forward network whose
// parameters are listed in forward order (DDP's default).
std::vector<size_t> reverse_order(size_t n);

// Buckets in launch order. `order` is a permutation of [0, params.size()) (empty: reverse_order).
// A parameter joins the current bucket unless that would take it past `cap_bytes`; then the
// bucket closes and the parameter starts the next one. So no bucket exceeds the cap except a
// bucket of a single parameter larger than the cap, which is its own bucket. A bucket's slices
// that touch (one ends where the next begins) merge into one range, so parameters produced in
// the reverse of their layout order give one range per bucket. Zero-byte parameters join the
// current bucket and add no range. cap_bytes must be positive.
std::vector<Bucket> assign_buckets(std::span<const GradSlice> params, std::span<const size_t> order,
                                   uint64_t cap_bytes);

}  // namespace ferry
