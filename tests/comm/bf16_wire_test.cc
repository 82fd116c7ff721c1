// The host loops of comm.dtype bf16 (comm/bf16_wire.h): narrowing rounds to nearest even, one
// pairwise combine widens, adds in fp32 and rounds once (ties to even, infinities and NaN kept),
// and the widened mean divides in fp32.
#include "comm/bf16_wire.h"

#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "device/bf16.h"

namespace ferry {
namespace {

uint16_t bits(float f) { return float_to_bf16(f).bits; }
float value(uint16_t w) { return bf16_to_float(BF16{w}); }

TEST(Bf16Wire, NarrowingRoundsToNearestEven) {
  const std::vector<float> x{1.0f, 1.0f + 0x1p-8f, 1.0f + 3 * 0x1p-8f, 0.1f, -2.5e-3f, 3e38f};
  std::vector<uint16_t> w(x.size());
  narrow_to_bf16(x.data(), w.data(), static_cast<int64_t>(x.size()));
  EXPECT_EQ(value(w[0]), 1.0f);
  EXPECT_EQ(value(w[1]), 1.0f);                // halfway: to the even neighbour below
  EXPECT_EQ(value(w[2]), 1.0f + 4 * 0x1p-8f);  // halfway: to the even neighbour above
  EXPECT_EQ(value(w[3]), 0.10009765625f);      // the nearest bf16 to 0.1
  for (size_t i = 0; i < x.size(); ++i) EXPECT_EQ(w[i], bits(x[i])) << i;
}

TEST(Bf16Wire, ACombineAddsInFp32AndRoundsOnce) {
  const float inf = std::numeric_limits<float>::infinity();
  // in, inout, the expected bf16 sum.
  const std::vector<std::array<float, 3>> cases{
      {1.0f, 1.0f, 2.0f},
      {1.0f, 0x1p-8f, 1.0f},                          // 1 + 2^-8: a tie, to even (1)
      {1.0f, 3 * 0x1p-8f, 1.0f + 4 * 0x1p-8f},        // 1 + 3 * 2^-8: a tie, to even (up)
      {1.0f + 0x1p-7f, 0x1p-8f, 1.0f + 2 * 0x1p-7f},  // tie, odd below: up
      {0.375f, -0.125f, 0.25f},
      {3.3e38f, 3.3e38f, inf},  // past the largest bf16
      {inf, 1.0f, inf},
  };
  std::vector<uint16_t> in, inout;
  for (const auto& c : cases) {
    in.push_back(bits(c[0]));
    inout.push_back(bits(c[1]));
  }
  sum_bf16(in.data(), inout.data(), static_cast<int64_t>(in.size()));
  for (size_t i = 0; i < cases.size(); ++i) EXPECT_EQ(value(inout[i]), cases[i][2]) << i;
  // inf + -inf is NaN.
  uint16_t a = bits(inf), b = bits(-inf);
  sum_bf16(&a, &b, 1);
  EXPECT_TRUE(std::isnan(value(b)));
}

TEST(Bf16Wire, TheMeanWidensExactlyAndDividesInFp32) {
  const std::vector<uint16_t> w{bits(3.0f), bits(-1.5f), bits(0.10009765625f)};
  std::vector<float> x(3);
  widen_mean(w.data(), x.data(), 3, 2);
  EXPECT_EQ(x[0], 1.5f);
  EXPECT_EQ(x[1], -0.75f);
  EXPECT_EQ(x[2], 0.10009765625f / 2);
  widen_mean(w.data(), x.data(), 3, 3);
  EXPECT_EQ(x[0], 1.0f);
  EXPECT_EQ(x[2], 0.10009765625f / 3.0f);  // one fp32 rounding
}

}  // namespace
}  // namespace ferry
