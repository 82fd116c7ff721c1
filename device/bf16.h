// bf16 <-> fp32 conversion for CPU code, the CUDA kernels and their host emulation (C++17, no
// intrinsics). Invariant: bf16 is fp32's upper half, so widening is exact and narrowing rounds to
// nearest even (Note [Rounding to bf16]).
#pragma once

#include <cstdint>
#include <cstring>

#include "device/host_device.h"

namespace ferry {

// Note [Rounding to bf16]
// bf16 keeps fp32's sign, its 8 exponent bits and the top 7 of its 23 mantissa bits, so
// bf16 -> fp32 appends 16 zero bits and is exact (subnormals, infinities and NaN included).
// fp32 -> bf16 rounds the dropped 16 bits to nearest, ties to even: add 0x7FFF plus the kept
// lowest bit, then truncate. A finite value that rounds past the largest bf16 (above
// 0x7F7F7FFF in magnitude) becomes infinity, as in IEEE rounding. Two variants, which differ
// only on fp32 subnormal inputs (magnitude < 2^-126):
// - float_to_bf16: rounds subnormals too (PyTorch's c10::BFloat16 and its vectorised CPU
//   conversion: 0x807FFFFF -> 0x8080, the smallest normal in magnitude). This is the conversion
//   ferry's own kernels use when they store bf16, on both backends.
// - float_to_bf16_daz: treats a subnormal input as zero of the same sign, as the AVX512-BF16
//   instruction VCVTNEPS2BF16 does and therefore oneDNN's bf16 primitives and reorders on a CPU
//   with avx512_bf16 (checked bitwise against both in tests/device/bf16_test.cc). Use it where a
//   result must equal what oneDNN wrote.
// NaN stays NaN: the sign and the top payload bits are kept and the quiet bit set (0x7FA00001 ->
// 0x7FE0), as VCVTNEPS2BF16 and oneDNN do. (PyTorch writes 0x7FC0 or 0xFFFF instead; every NaN
// compares unequal anyway, so no tolerance test can tell.)

// The bits of a bf16 value.
struct BF16 {
  uint16_t bits;
};

FERRY_HOST_DEVICE inline uint32_t float_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}

FERRY_HOST_DEVICE inline float bits_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

// Exact: every bf16 value is an fp32 value.
FERRY_HOST_DEVICE inline float bf16_to_float(BF16 h) {
  return bits_float(static_cast<uint32_t>(h.bits) << 16);
}

// Round to nearest even, subnormals rounded, NaN kept (Note [Rounding to bf16]).
FERRY_HOST_DEVICE inline BF16 float_to_bf16(float f) {
  const uint32_t u = float_bits(f);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) {
    return BF16{static_cast<uint16_t>((u >> 16) | 0x0040u)};  // quiet NaN, sign and payload kept
  }
  const uint32_t rounding_bias = 0x7FFFu + ((u >> 16) & 1u);
  return BF16{static_cast<uint16_t>((u + rounding_bias) >> 16)};
}

// As float_to_bf16, but an fp32 subnormal input gives a zero of its sign (VCVTNEPS2BF16, oneDNN).
FERRY_HOST_DEVICE inline BF16 float_to_bf16_daz(float f) {
  const uint32_t u = float_bits(f);
  if ((u & 0x7F800000u) == 0) return BF16{static_cast<uint16_t>((u >> 16) & 0x8000u)};
  return float_to_bf16(f);
}

// fp32 rounded to bf16 and widened back: the value a bf16 tensor holds for `f`.
FERRY_HOST_DEVICE inline float round_to_bf16(float f) { return bf16_to_float(float_to_bf16(f)); }

}  // namespace ferry
