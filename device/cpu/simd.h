// Helpers for the plain-loop kernels' inner loops: instruction-set clones and fixed-order sums.
// Invariant: a result never depends on which clone runs (no contraction into FMA: the CPU target
// builds with -ffp-contract=off) nor on pointer alignment (sums use fixed interleaved lanes).
#pragma once

#include <cstdint>

namespace ferry::cpu {

// Compiles a hot loop once per instruction set and picks the best at load time.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define FERRY_SIMD_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define FERRY_SIMD_CLONES
#endif

inline constexpr int kLanes = 8;

// A sum kept as kLanes interleaved double lanes: element i of a run goes to lane i % kLanes, and
// total() combines the lanes in a fixed tree.
struct LaneSum {
  double lane[kLanes] = {};
  double total() const {
    const double a = (lane[0] + lane[4]) + (lane[2] + lane[6]);
    const double b = (lane[1] + lane[5]) + (lane[3] + lane[7]);
    return a + b;
  }
};

}  // namespace ferry::cpu
