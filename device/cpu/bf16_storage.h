// bf16 storage for the CPU kernels: whole arrays widened to fp32 and narrowed back (round to
// nearest even, NaN kept NaN), in parallel chunks. Invariant: widen(narrow(x)) is x rounded to
// bf16 whatever the chunking, so every kernel gives the same bits on any thread count.
#pragma once

#include <cstdint>

#include "device/bf16.h"

namespace ferry::cpu {

// y[i] = float(x[i]) for i < n (exact).
void widen_bf16(const uint16_t* x, float* y, int64_t n);
// y[i] = float_to_bf16(x[i]) (device/bf16.h: nearest even, subnormals rounded, NaN kept).
void narrow_to_bf16(const float* x, uint16_t* y, int64_t n);

inline const uint16_t* bf16_bits(const float* p) { return reinterpret_cast<const uint16_t*>(p); }
inline uint16_t* bf16_bits(float* p) { return reinterpret_cast<uint16_t*>(p); }

}  // namespace ferry::cpu
