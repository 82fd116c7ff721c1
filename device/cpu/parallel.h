// Deterministic parallel loops for the plain-loop kernels. Work is cut by the data (fixed
// chunks or one item per index), never by the thread count, and every reduction runs inside one
// item in a fixed order, so results are bitwise the same whatever the threads and scheduling.
#pragma once

#include <omp.h>

#include <algorithm>
#include <cstdint>

namespace ferry::cpu {

// Elements below which an elementwise loop is not worth an OpenMP region.
inline constexpr int64_t kParallelGrain = 1 << 15;

// Calls body(begin, end) on consecutive chunks of [0, n), each at most `grain` long, in parallel
// when there is more than one chunk. `body` must write disjoint outputs per index.
template <typename Body>
void parallel_chunks(int64_t n, int64_t grain, const Body& body) {
  if (n <= 0) return;
  const int64_t chunks = (n + grain - 1) / grain;
  if (chunks == 1 || omp_get_max_threads() == 1 || omp_in_parallel()) {
    body(int64_t{0}, n);
    return;
  }
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < chunks; ++i) body(i * grain, std::min(n, (i + 1) * grain));
}

// Calls body(i) for every i in [0, n), in parallel when `work` (a rough element count of the
// whole loop) is worth it. Each body(i) must write disjoint outputs.
template <typename Body>
void parallel_items(int64_t n, int64_t work, const Body& body) {
  if (n <= 0) return;
  if (n == 1 || work < kParallelGrain || omp_get_max_threads() == 1 || omp_in_parallel()) {
    for (int64_t i = 0; i < n; ++i) body(i);
    return;
  }
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) body(i);
}

}  // namespace ferry::cpu
