// Vectorizable float exp and tanh for the plain-loop kernels (softmax, GELU): branch-free
// polynomials of plain float operations, so a loop calling them vectorizes under any
// FERRY_SIMD_CLONES clone and every clone gives the same bits (simd.h's invariant).
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>

namespace ferry::cpu {

// Row sums of the plain-loop kernels use kLanes lanes (lane l adds elements l, l + kLanes, ... in
// order), then lane_total adds the lanes by a pairwise tree: a fixed order that vectorizes.
constexpr int kLanes = 16;

template <typename T>
T lane_total(T* lanes) {
  for (int half = kLanes / 2; half > 0; half /= 2) {
    for (int l = 0; l < half; ++l) lanes[l] += lanes[l + half];
  }
  return lanes[0];
}

// e^x within about 2 ulp (Cephes' expf: x = n ln2 + r, |r| <= ln2 / 2, a degree-7 polynomial in
// r, then the exponent bits). x is clamped to [-87, 88] first, so e^x never reaches 0 or inf
// (e^-87 ~ 1.6e-38, the softmax's weight of a score 87 below the row's maximum). NaN stays NaN.
inline float exp_approx(float x) {
  x = x < -87.0f ? -87.0f : x;
  x = x > 88.0f ? 88.0f : x;
  const float n = std::floor(x * 1.44269504088896341f + 0.5f);
  const float r = (x - n * 0.693359375f) - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float e = p * (r * r) + r + 1.0f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;  // 2^n, n in [-126, 127]
  return e * std::bit_cast<float>(bits);
}

// tanh(x) = sign(x) (1 - 2 / (e^{2|x|} + 1)): within about 1e-7 absolute; towards +-1 the
// rounding of 1 - (a small term) is std::tanh's own, so 1 - tanh^2 in the tails (GELU's
// derivative) is as good as PyTorch's. The relative error grows as x -> 0, where tanh(x) ~ x;
// GELU multiplies it by x, keeping its own error relative.
inline float tanh_approx(float x) {
  const float t = 1.0f - 2.0f / (exp_approx(2.0f * std::fabs(x)) + 1.0f);
  return std::copysign(t, x);
}

}  // namespace ferry::cpu
