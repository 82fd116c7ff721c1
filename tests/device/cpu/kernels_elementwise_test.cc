// Elementwise kernels: exact results (each output is one fp32 operation of its inputs), sizes
// below and above the parallel grain, in-place use, and dropout's counter-based mask.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "common/error.h"
#include "device/counter_rng.h"
#include "tests/device/cpu/kernel_test_util.h"

namespace ferry {
namespace {

using test::random_floats;

// Small, odd, and past the parallel grain (so the chunked path and its tail run).
const int64_t kSizes[] = {1, 7, 1000, 100003};

TEST(ReluKernel, ForwardIsMaxWithZero) {
  test::KernelRunner k;
  for (int64_t n : kSizes) {
    auto x = random_floats(n, 1 + n);
    x[0] = 0.0f;
    if (n > 2) {
      x[1] = -0.0f;
      x[2] = -1e-30f;
    }
    std::vector<float> y(n + 1, NAN);
    k.run(ReluForward{n, x.data(), y.data()});
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_EQ(y[i], std::max(x[i], 0.0f)) << "n=" << n << " i=" << i;
    }
    EXPECT_TRUE(std::isnan(y[n])) << "wrote past n";
    // In place.
    k.run(ReluForward{n, x.data(), x.data()});
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(x[i], y[i]);
  }
}

// As PyTorch's relu: NaN stays NaN, so a diverged run shows in the loss.
TEST(ReluKernel, ForwardPropagatesNaN) {
  test::KernelRunner k;
  const std::vector<float> x = {NAN, -1.0f, 2.0f, -NAN, 0.0f};
  std::vector<float> y(5);
  k.run(ReluForward{5, x.data(), y.data()});
  EXPECT_TRUE(std::isnan(y[0]));
  EXPECT_EQ(y[1], 0.0f);
  EXPECT_EQ(y[2], 2.0f);
  EXPECT_TRUE(std::isnan(y[3]));
  EXPECT_EQ(y[4], 0.0f);
}

TEST(ReluKernel, BackwardPassesGradientWhereOutputIsPositive) {
  test::KernelRunner k;
  for (int64_t n : kSizes) {
    auto y = random_floats(n, 2 + n);
    for (int64_t i = 0; i < n; i += 3) y[i] = 0.0f;  // relu outputs: zeros are common
    for (auto& v : y) v = std::max(v, 0.0f);
    const auto dy = random_floats(n, 3 + n);
    std::vector<float> dx(n, NAN);
    k.run(ReluBackward{n, y.data(), dy.data(), dx.data()});
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(dx[i], y[i] > 0 ? dy[i] : 0.0f) << i;
  }
}

TEST(ElementwiseKernel, AddAccumulateScaleFillCopy) {
  test::KernelRunner k;
  for (int64_t n : kSizes) {
    SCOPED_TRACE(n);
    const auto a = random_floats(n, 10), b = random_floats(n, 11);
    std::vector<float> y(n);
    k.run(AddForward{n, a.data(), b.data(), y.data()});
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(y[i], a[i] + b[i]);

    std::vector<float> acc = b;
    k.run(Accumulate{n, a.data(), acc.data()});
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(acc[i], b[i] + a[i]);

    std::vector<float> s = a;
    k.run(Scale{n, -0.37f, s.data()});
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(s[i], a[i] * -0.37f);

    std::vector<float> f(n + 1, 1.0f);
    k.run(Fill{n, 2.5f, f.data()});
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(f[i], 2.5f);
    EXPECT_EQ(f[n], 1.0f);
    k.run(Fill{n, NAN, f.data()});
    EXPECT_TRUE(std::isnan(f[n - 1]));

    // Copy an odd byte count (not a whole number of floats).
    const uint64_t bytes = n * sizeof(float) - (n > 1 ? 3 : 0);
    std::vector<unsigned char> dst(n * sizeof(float), 0xEE);
    k.run(CopyDevice{bytes, a.data(), dst.data()});
    EXPECT_EQ(std::memcmp(dst.data(), a.data(), bytes), 0);
    for (uint64_t i = bytes; i < dst.size(); ++i) ASSERT_EQ(dst[i], 0xEE);
  }
  // In place: y = y + y.
  std::vector<float> v = random_floats(1000, 12), expect(1000);
  for (int i = 0; i < 1000; ++i) expect[i] = v[i] + v[i];
  k.run(AddForward{1000, v.data(), v.data(), v.data()});
  EXPECT_EQ(v, expect);
}

TEST(DropoutKernel, MaskFollowsTheCounterStream) {
  test::KernelRunner k;
  const int64_t n = 100003;
  const float p = 0.3f;
  const uint64_t seed = 1234, offset = 77;
  const auto x = random_floats(n, 20);
  std::vector<float> y(n);
  std::vector<uint8_t> mask(n, 9);
  k.run(DropoutForward{n, p, seed, offset, x.data(), y.data(), mask.data()});
  int64_t kept = 0;
  for (int64_t i = 0; i < n; ++i) {
    const bool keep = counter_uniform(seed, offset + i) >= p;
    ASSERT_EQ(mask[i], keep ? 1 : 0) << i;
    ASSERT_EQ(y[i], keep ? x[i] / (1.0f - p) : 0.0f) << i;
    kept += keep;
  }
  EXPECT_NEAR(static_cast<double>(kept) / n, 0.7, 0.01);

  // A launch that starts `offset` later continues the same stream.
  std::vector<float> y2(n - 100);
  std::vector<uint8_t> mask2(n - 100);
  k.run(DropoutForward{n - 100, p, seed, offset + 100, x.data() + 100, y2.data(), mask2.data()});
  EXPECT_EQ(std::memcmp(mask2.data(), mask.data() + 100, n - 100), 0);

  const auto dy = random_floats(n, 21);
  std::vector<float> dx(n, NAN);
  k.run(DropoutBackward{n, p, dy.data(), mask.data(), dx.data()});
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(dx[i], mask[i] ? dy[i] / (1.0f - p) : 0.0f) << i;
}

TEST(DropoutKernel, ProbabilityZeroKeepsAndOneDropsEverything) {
  test::KernelRunner k;
  const int64_t n = 1000;
  const auto x = random_floats(n, 30);
  std::vector<float> y(n);
  std::vector<uint8_t> mask(n);
  k.run(DropoutForward{n, 0.0f, 5, 0, x.data(), y.data(), mask.data()});
  EXPECT_EQ(y, x);
  k.run(DropoutForward{n, 1.0f, 5, 0, x.data(), y.data(), mask.data()});
  EXPECT_EQ(y, std::vector<float>(n, 0.0f));
  EXPECT_EQ(mask, std::vector<uint8_t>(n, 0));
  EXPECT_THROW(k.run(DropoutForward{n, 1.5f, 5, 0, x.data(), y.data(), mask.data()}), ConfigError);
}

}  // namespace
}  // namespace ferry
