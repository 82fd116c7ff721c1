// A counter-based random stream: the value at (seed, index) is a pure function, so every
// backend and every thread draws the same numbers without shared state.
#pragma once

#include <cstdint>

#include "device/host_device.h"

namespace ferry {

// splitmix64's finaliser of seed ^ golden-ratio-scrambled index.
FERRY_HOST_DEVICE inline uint64_t counter_hash(uint64_t seed, uint64_t index) {
  uint64_t z = seed ^ (index * 0x9E3779B97F4A7C15ull + 0x632BE59BD9B4E019ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Uniform in [0, 1) with 24 bits of resolution (exact in float).
FERRY_HOST_DEVICE inline float counter_uniform(uint64_t seed, uint64_t index) {
  return static_cast<float>(counter_hash(seed, index) >> 40) * (1.0f / 16777216.0f);
}

}  // namespace ferry
