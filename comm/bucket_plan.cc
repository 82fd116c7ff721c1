// DDP's bucket assignment, and the merging of a bucket's slices into contiguous ranges.
#include "comm/bucket_plan.h"

#include <algorithm>
#include <numeric>

#include <fmt/format.h>

#include "common/error.h"

namespace ferry {
namespace {

std::vector<ByteRange> merge_ranges(std::span<const GradSlice> params,
                                    const std::vector<size_t>& members) {
  std::vector<ByteRange> ranges;
  for (size_t p : members) {
    if (params[p].bytes > 0) ranges.push_back({params[p].offset, params[p].bytes});
  }
  std::sort(ranges.begin(), ranges.end(),
            [](const ByteRange& a, const ByteRange& b) { return a.offset < b.offset; });
  std::vector<ByteRange> merged;
  for (const ByteRange& r : ranges) {
    if (!merged.empty() && merged.back().offset + merged.back().bytes == r.offset) {
      merged.back().bytes += r.bytes;
    } else {
      merged.push_back(r);
    }
  }
  return merged;
}

void check_table(std::span<const GradSlice> params, std::span<const size_t> order) {
  for (size_t i = 0; i < params.size(); ++i) {
    FERRY_ASSERT(params[i].offset % sizeof(float) == 0 && params[i].bytes % sizeof(float) == 0,
                 fmt::format("gradient slice {} (offset {}, {} bytes) is not whole floats", i,
                             params[i].offset, params[i].bytes));
  }
  std::vector<size_t> by_offset(params.size());
  std::iota(by_offset.begin(), by_offset.end(), size_t{0});
  std::sort(by_offset.begin(), by_offset.end(),
            [&](size_t a, size_t b) { return params[a].offset < params[b].offset; });
  for (size_t k = 1; k < by_offset.size(); ++k) {
    const GradSlice& prev = params[by_offset[k - 1]];
    FERRY_ASSERT(prev.offset + prev.bytes <= params[by_offset[k]].offset || prev.bytes == 0 ||
                     params[by_offset[k]].bytes == 0,
                 fmt::format("gradient slices {} and {} overlap", by_offset[k - 1], by_offset[k]));
  }
  std::vector<bool> seen(params.size(), false);
  FERRY_ASSERT(order.size() == params.size(),
               fmt::format("bucket order lists {} parameters, the table has {}", order.size(),
                           params.size()));
  for (size_t p : order) {
    FERRY_ASSERT(p < params.size() && !seen[p],
                 fmt::format("bucket order is not a permutation (parameter {})", p));
    seen[p] = true;
  }
}

}  // namespace

std::vector<size_t> reverse_order(size_t n) {
  std::vector<size_t> order(n);
  for (size_t i = 0; i < n; ++i) order[i] = n - 1 - i;
  return order;
}

std::vector<Bucket> assign_buckets(std::span<const GradSlice> params, std::span<const size_t> order,
                                   uint64_t cap_bytes) {
  FERRY_ASSERT(cap_bytes > 0, "the bucket cap must be positive");
  std::vector<size_t> reversed;
  if (order.empty() && !params.empty()) {
    reversed = reverse_order(params.size());
    order = reversed;
  }
  check_table(params, order);

  std::vector<Bucket> buckets;
  Bucket current;
  auto close = [&] {
    if (current.params.empty()) return;
    current.ranges = merge_ranges(params, current.params);
    buckets.push_back(std::move(current));
    current = Bucket();
  };
  for (size_t p : order) {
    const uint64_t bytes = params[p].bytes;
    if (!current.params.empty() && current.bytes + bytes > cap_bytes) close();
    current.params.push_back(p);
    current.bytes += bytes;
    if (current.bytes >= cap_bytes) close();  // full (or one parameter past the cap)
  }
  close();
  return buckets;
}

}  // namespace ferry
