// The fused attention core (kernels_flash_attention.cc) against the naive core and the float64
// reference: outputs, log-sum-exp and gradients for causal, padded and packed rows, with and
// without dropout; bitwise the same for every thread count, and with y or lse alone.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "common/error.h"
#include "tests/device/cpu/kernel_test_util.h"

namespace ferry {
namespace {

using namespace test;  // kernel_test_util.h: all_close, random_floats, to_f64, ...

// Note [Fused against naive tolerance]
// "Within 1e-5 relative": |fused - naive| <= 1e-5 (|naive| + rms(naive)) per element. The two
// cores round differently (blockwise sums, rescaled accumulators), so an element that cancels
// to near zero can differ by a few ulps of its operands, not of itself: the rms term is the
// scale those ulps are measured against.
::testing::AssertionResult close_to_naive(const std::vector<float>& fused,
                                          const std::vector<float>& naive, double rel = 1e-5) {
  if (fused.size() != naive.size()) return ::testing::AssertionFailure() << "sizes differ";
  double sq = 0.0;
  for (float x : naive) sq += static_cast<double>(x) * x;
  const double rms = std::sqrt(sq / std::max<size_t>(naive.size(), 1));
  double worst = 0.0;
  size_t at = 0, bad = 0;
  for (size_t i = 0; i < fused.size(); ++i) {
    const double err = std::fabs(static_cast<double>(fused[i]) - naive[i]);
    const double excess = err / (std::fabs(static_cast<double>(naive[i])) + rms);
    if (!(excess <= rel)) ++bad;
    if (!(excess <= worst)) worst = excess, at = i;
  }
  if (bad == 0) return ::testing::AssertionSuccess() << "worst " << worst;
  return ::testing::AssertionFailure()
         << bad << " of " << fused.size() << " elements off; worst " << worst << " at " << at
         << ": " << fused[at] << " vs " << naive[at];
}

std::vector<int32_t> random_segments(int64_t n, int64_t t, int64_t longest, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int64_t> length(1, longest);
  std::vector<int32_t> s(static_cast<size_t>(n * t));
  for (int64_t b = 0; b < n; ++b) {
    int64_t start = 0, left = 0;
    for (int64_t i = 0; i < t; ++i) {
      if (left == 0) start = i, left = length(rng);
      s[static_cast<size_t>(b * t + i)] = static_cast<int32_t>(start);
      --left;
    }
  }
  return s;
}

struct CoreRun {
  std::vector<float> y, aux, dqkv;  // aux: lse (fused) or probs (naive)
  std::vector<uint8_t> mask;        // naive only
};

CoreRun run_naive(KernelRunner& k, const AttentionGeom& g, uint64_t seed,
                  const std::vector<float>& qkv, const std::vector<float>& dy,
                  const std::vector<int32_t>* segments) {
  CoreRun r;
  const int64_t scores = g.n * g.heads * g.t * g.t;
  r.y.assign(g.n * g.t * g.c, NAN);
  r.aux.assign(scores, NAN);
  r.mask.assign(scores, 7);
  r.dqkv.assign(qkv.size(), NAN);
  AttentionForward f;
  f.g = g, f.training = true, f.seed = seed;
  f.qkv = qkv.data(), f.y = r.y.data(), f.probs = r.aux.data(), f.mask = r.mask.data();
  f.segments = segments ? segments->data() : nullptr;
  k.run(f);
  AttentionBackward b;
  b.g = g, b.qkv = qkv.data(), b.probs = r.aux.data(), b.mask = r.mask.data();
  b.dy = dy.data(), b.dqkv = r.dqkv.data(), b.segments = f.segments;
  k.run(b);
  return r;
}

CoreRun run_fused(KernelRunner& k, const AttentionGeom& g, uint64_t seed,
                  const std::vector<float>& qkv, const std::vector<float>& dy,
                  const std::vector<int32_t>* segments) {
  CoreRun r;
  r.y.assign(g.n * g.t * g.c, NAN);
  r.aux.assign(g.n * g.heads * g.t, NAN);
  r.dqkv.assign(qkv.size(), NAN);
  const int32_t* s = segments ? segments->data() : nullptr;
  k.run(FlashAttentionForward{g, true, seed, qkv.data(), r.y.data(), r.aux.data(), s});
  k.run(FlashAttentionBackward{g, seed, qkv.data(), r.y.data(), r.aux.data(), dy.data(),
                               r.dqkv.data(), s});
  return r;
}

// The log-sum-exp of every query's scaled, masked scores, in float64.
ref::Vec reference_lse(const AttentionGeom& g, const std::vector<float>& qkv,
                       const std::vector<int32_t>* segments) {
  const int64_t d = g.head_dim();
  ref::Vec out(g.n * g.heads * g.t);
  for (int64_t n = 0; n < g.n; ++n) {
    for (int64_t h = 0; h < g.heads; ++h) {
      for (int64_t i = 0; i < g.t; ++i) {
        const int64_t first = segments ? (*segments)[n * g.t + i] : 0;
        std::vector<double> s;
        for (int64_t j = first; j <= i; ++j) {
          double dot = 0;
          for (int64_t e = 0; e < d; ++e) {
            dot += static_cast<double>(qkv[(n * g.t + i) * 3 * g.c + h * d + e]) *
                   qkv[(n * g.t + j) * 3 * g.c + g.c + h * d + e];
          }
          s.push_back(dot / std::sqrt(static_cast<double>(d)));
        }
        const double m = *std::max_element(s.begin(), s.end());
        double sum = 0;
        for (double x : s) sum += std::exp(x - m);
        out[(n * g.heads + h) * g.t + i] = m + std::log(sum);
      }
    }
  }
  return out;
}

// (N, T, heads, C, dropout): one tile, a partial last tile (T = 65, 130), several full tiles
// (T = 256), head widths 4 to 64.
const AttentionGeom kShapes[] = {{1, 1, 1, 1, 0.0f},   {2, 7, 2, 8, 0.0f},    {1, 17, 3, 12, 0.1f},
                                 {2, 33, 2, 64, 0.0f}, {3, 20, 4, 32, 0.5f},  {2, 65, 2, 16, 0.0f},
                                 {2, 130, 2, 8, 0.2f}, {1, 256, 2, 128, 0.0f}};

void expect_fused_equals_naive(const AttentionGeom& g, const std::vector<int32_t>* segments,
                               uint32_t seed) {
  KernelRunner k;
  const auto qkv = random_floats(g.n * g.t * 3 * g.c, seed, -2.0f, 2.0f);
  const auto dy = random_floats(g.n * g.t * g.c, seed + 1);
  const CoreRun naive = run_naive(k, g, 99, qkv, dy, segments);
  const CoreRun fused = run_fused(k, g, 99, qkv, dy, segments);
  EXPECT_TRUE(close_to_naive(fused.y, naive.y));
  EXPECT_TRUE(close_to_naive(fused.dqkv, naive.dqkv));
  EXPECT_TRUE(all_close(fused.aux, reference_lse(g, qkv, segments), 1e-5, 1e-5));
  // Against float64 as well (the naive core's mask is the fused core's draw).
  const bool drop = g.dropout > 0.0f;
  const auto ref = ref::attention_forward(g, to_f64(qkv), drop ? &naive.mask : nullptr, segments);
  EXPECT_TRUE(all_close(fused.y, ref.y, 1e-4, 1e-4));
  EXPECT_TRUE(all_close(
      fused.dqkv,
      ref::attention_backward(g, to_f64(qkv), to_f64(dy), drop ? &naive.mask : nullptr, segments),
      1e-4, 1e-4));
}

TEST(FlashAttentionKernel, CausalEqualsNaive) {
  uint32_t seed = 300;
  for (const AttentionGeom& g : kShapes) {
    SCOPED_TRACE(
        fmt::format("N={} T={} heads={} C={} dropout={}", g.n, g.t, g.heads, g.c, g.dropout));
    expect_fused_equals_naive(g, nullptr, seed);
    seed += 2;
  }
}

TEST(FlashAttentionKernel, PackedEqualsNaive) {
  uint32_t seed = 400;
  for (const AttentionGeom& g : kShapes) {
    // Documents shorter than a tile, and documents spanning several (longest T / 2).
    for (int64_t longest : {std::max<int64_t>(1, g.t / 6), std::max<int64_t>(1, g.t / 2)}) {
      SCOPED_TRACE(fmt::format("N={} T={} heads={} C={} dropout={} documents of 1..{}", g.n, g.t,
                               g.heads, g.c, g.dropout, longest));
      const auto segments = random_segments(g.n, g.t, longest, seed + 7);
      expect_fused_equals_naive(g, &segments, seed);
      seed += 2;
    }
  }
}

// Padded rows (data.documents): each row a document followed by padding whose gradient is 0 (the
// loss ignores it). Real positions never see the padding: their outputs and the gradients
// reaching real positions are the naive core's, and bitwise unchanged by what the padding holds.
TEST(FlashAttentionKernel, PaddedRowsEqualNaiveAndIgnoreThePadding) {
  const AttentionGeom g{3, 150, 2, 32, 0.0f};
  const int64_t lengths[] = {150, 97, 3};
  auto qkv = random_floats(g.n * g.t * 3 * g.c, 500, -2.0f, 2.0f);
  auto dy = random_floats(g.n * g.t * g.c, 501);
  for (int64_t n = 0; n < g.n; ++n) {
    for (int64_t i = lengths[n]; i < g.t; ++i) {
      for (int64_t e = 0; e < g.c; ++e) dy[(n * g.t + i) * g.c + e] = 0.0f;
    }
  }
  KernelRunner k;
  const CoreRun naive = run_naive(k, g, 0, qkv, dy, nullptr);
  const CoreRun fused = run_fused(k, g, 0, qkv, dy, nullptr);
  EXPECT_TRUE(close_to_naive(fused.y, naive.y));
  EXPECT_TRUE(close_to_naive(fused.dqkv, naive.dqkv));
  // Other padding values: real rows' y, lse and gradients keep their bits.
  for (int64_t n = 0; n < g.n; ++n) {
    for (int64_t i = lengths[n]; i < g.t; ++i) {
      for (int64_t e = 0; e < 3 * g.c; ++e) qkv[(n * g.t + i) * 3 * g.c + e] *= -3.0f;
    }
  }
  const CoreRun other = run_fused(k, g, 0, qkv, dy, nullptr);
  for (int64_t n = 0; n < g.n; ++n) {
    for (int64_t i = 0; i < lengths[n]; ++i) {
      for (int64_t e = 0; e < g.c; ++e) {
        ASSERT_EQ(other.y[(n * g.t + i) * g.c + e], fused.y[(n * g.t + i) * g.c + e]);
      }
      for (int64_t e = 0; e < 3 * g.c; ++e) {
        ASSERT_EQ(other.dqkv[(n * g.t + i) * 3 * g.c + e], fused.dqkv[(n * g.t + i) * 3 * g.c + e]);
      }
    }
  }
}

// The same bits for 1, 2 and 3 threads; y alone and lse alone (recomputes) as with both.
TEST(FlashAttentionKernel, DeterministicAndPartialOutputs) {
  const AttentionGeom g{2, 200, 3, 48, 0.1f};
  const auto qkv = random_floats(g.n * g.t * 3 * g.c, 600, -2.0f, 2.0f);
  const auto dy = random_floats(g.n * g.t * g.c, 601);
  const auto segments = random_segments(g.n, g.t, 90, 602);
  KernelRunner one(1);
  const CoreRun base = run_fused(one, g, 5, qkv, dy, &segments);
  for (int threads : {2, 3}) {
    KernelRunner k(threads);
    const CoreRun r = run_fused(k, g, 5, qkv, dy, &segments);
    EXPECT_TRUE(bitwise_equal(r.y, base.y)) << threads;
    EXPECT_TRUE(bitwise_equal(r.aux, base.aux)) << threads;
    EXPECT_TRUE(bitwise_equal(r.dqkv, base.dqkv)) << threads;
  }
  std::vector<float> y(base.y.size(), NAN), lse(base.aux.size(), NAN);
  one.run(FlashAttentionForward{g, true, 5, qkv.data(), y.data(), nullptr, segments.data()});
  one.run(FlashAttentionForward{g, true, 5, qkv.data(), nullptr, lse.data(), segments.data()});
  EXPECT_TRUE(bitwise_equal(y, base.y));
  EXPECT_TRUE(bitwise_equal(lse, base.aux));
  // Another seed draws another mask; evaluation (training off) draws none.
  one.run(FlashAttentionForward{g, true, 6, qkv.data(), y.data(), nullptr, segments.data()});
  EXPECT_FALSE(bitwise_equal(y, base.y));
  KernelRunner k;
  const AttentionGeom no_drop{g.n, g.t, g.heads, g.c, 0.0f};
  const CoreRun plain = run_fused(k, no_drop, 5, qkv, dy, &segments);
  one.run(FlashAttentionForward{g, false, 5, qkv.data(), y.data(), nullptr, segments.data()});
  EXPECT_TRUE(bitwise_equal(y, plain.y));
}

TEST(FlashAttentionKernel, RefusesNeitherOutputAndBadSegments) {
  KernelRunner k;
  const AttentionGeom g{1, 4, 1, 4, 0.0f};
  const auto qkv = random_floats(g.t * 3 * g.c, 700);
  std::vector<float> y(g.t * g.c), lse(g.t);
  EXPECT_THROW(k.run(FlashAttentionForward{g, true, 0, qkv.data(), nullptr, nullptr}), ConfigError);
  const std::vector<int32_t> bad = {0, 0, 3, 1};  // position 2 cannot start at 3
  EXPECT_THROW(
      k.run(FlashAttentionForward{g, true, 0, qkv.data(), y.data(), lse.data(), bad.data()}),
      DataError);
}

}  // namespace
}  // namespace ferry
