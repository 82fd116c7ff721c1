// Helpers of the bf16 parity suites (bf16_parity_test.cc, bf16_transformer_parity_test.cc):
// bf16 operands as their bits, the float pointers the kernel structs carry them in, and the one
// bf16 rounding tolerance. Fresh buffers are NaN-poisoned (0xFFFF) as every other suite's.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <random>
#include <vector>

#include "device/bf16.h"
#include "tests/device/cuda/parity_helpers.h"

namespace ferry {

using Bits = std::vector<uint16_t>;

// n seeded values in [lo, hi), rounded to bf16.
inline Bits random_bf16(size_t n, std::mt19937& rng, float lo = -1.0f, float hi = 1.0f) {
  Bits v(n);
  std::uniform_real_distribution<float> dist(lo, hi);
  for (auto& b : v) b = float_to_bf16(dist(rng)).bits;
  return v;
}

inline Bits poisoned_bf16(size_t n) { return Bits(n, 0xFFFF); }

inline std::vector<float> widened(const Bits& v) {
  std::vector<float> f(v.size());
  for (size_t i = 0; i < v.size(); ++i) f[i] = bf16_to_float(BF16{v[i]});
  return f;
}

// The float pointer fields of the kernel structs carry bf16 bits (Note [Storage dtype of a
// kernel] in device/kernels.h).
inline const float* fp(const uint16_t* p) { return reinterpret_cast<const float*>(p); }
inline float* fp(uint16_t* p) { return reinterpret_cast<float*>(p); }

// A bf16's place on the number line: consecutive finite values differ by 1.
inline int32_t bf16_order(uint16_t b) {
  return (b & 0x8000u) ? -static_cast<int32_t>(b & 0x7FFFu) : static_cast<int32_t>(b);
}

// Note [One bf16 rounding apart]
// Where the target's fp32 math may differ from the CPU backend's in the last fp32 places (a GPU's
// exp, another summation order), the two fp32 results lie within the fp32 suites' 1e-4 relative
// of each other, far inside one bf16 step (2^-8 relative), so rounding them to bf16 gives the
// same value or its neighbour: at most `ulps` bf16 steps apart, or within `abs` of each other
// (sums that cancel to about zero). NaN must match NaN.
inline ::testing::AssertionResult bf16_within(const Bits& gpu, const Bits& cpu, int ulps = 1,
                                              double abs = kAbs) {
  if (gpu.size() != cpu.size()) return ::testing::AssertionFailure() << "sizes differ";
  size_t bad = 0, worst = 0;
  int32_t worst_steps = -1;
  for (size_t i = 0; i < gpu.size(); ++i) {
    const float g = bf16_to_float(BF16{gpu[i]}), c = bf16_to_float(BF16{cpu[i]});
    if (std::isnan(g) || std::isnan(c)) {
      if (std::isnan(g) && std::isnan(c)) continue;
      ++bad;
      worst = i;
      worst_steps = INT32_MAX;
      continue;
    }
    const int32_t steps = std::abs(bf16_order(gpu[i]) - bf16_order(cpu[i]));
    if (steps <= ulps || std::fabs(static_cast<double>(g) - c) <= abs) continue;
    ++bad;
    if (steps > worst_steps) {
      worst_steps = steps;
      worst = i;
    }
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << bad << " of " << gpu.size() << " differ by more than " << ulps
         << " bf16 step(s); worst [" << worst << "] gpu " << bf16_to_float(BF16{gpu[worst]})
         << " cpu " << bf16_to_float(BF16{cpu[worst]});
}

}  // namespace ferry
