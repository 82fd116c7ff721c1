// Helpers for the plain-loop kernels' inner loops: instruction-set clones. Invariant: a result
// never depends on which clone runs (no contraction into FMA: the CPU target builds with
// -ffp-contract=off) nor on pointer alignment (sums keep fixed lanes, e.g. Note [Batch norm's
// summation order]).
#pragma once

#include <cstdint>

namespace ferry::cpu {

// Compiles a hot loop once per instruction set and picks the best at load time.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define FERRY_SIMD_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define FERRY_SIMD_CLONES
#endif

}  // namespace ferry::cpu
