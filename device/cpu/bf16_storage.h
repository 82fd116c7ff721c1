// bf16 storage for the CPU kernels: whole arrays widened to fp32 and narrowed back (round to
// nearest even, NaN kept NaN), in parallel chunks. Invariant: widen(narrow(x)) is x rounded to
// bf16 whatever the chunking, so every kernel gives the same bits on any thread count.
#pragma once

#include <cstdint>

namespace ferry::cpu {

// TEMPORARY until the shared conversion header lands (h-bf16plan): scalar conversions.
inline float bf16_to_float(uint16_t b) {
  const uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  __builtin_memcpy(&f, &u, sizeof f);
  return f;
}
inline uint16_t float_to_bf16(float f) {
  uint32_t u;
  __builtin_memcpy(&u, &f, sizeof u);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

// y[i] = float(x[i]) for i < n (exact).
void widen_bf16(const uint16_t* x, float* y, int64_t n);
// y[i] = bf16(x[i]) for i < n, rounded to nearest even; NaN stays (quiet) NaN.
void narrow_to_bf16(const float* x, uint16_t* y, int64_t n);

inline const uint16_t* bf16_bits(const float* p) { return reinterpret_cast<const uint16_t*>(p); }
inline uint16_t* bf16_bits(float* p) { return reinterpret_cast<uint16_t*>(p); }

}  // namespace ferry::cpu
