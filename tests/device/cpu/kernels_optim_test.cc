// Optimizer kernels over several steps against float64 transcriptions of torch.optim's SGD
// (first-step buffer copy, dampening 0) and AdamW, and gradient clipping (SumOfSquares,
// ClipByNorm) against float64 and torch.nn.utils.clip_grad_norm_'s rule.
#include <cmath>
#include <limits>

#include <gtest/gtest.h>

#include "common/error.h"
#include "tests/device/cpu/kernel_test_util.h"

namespace ferry {
namespace {

using namespace test;  // kernel_test_util.h: all_close, random_floats, to_f64, ...

// Five fp32 steps against exact arithmetic: a few roundings per step.
constexpr double kRel = 1e-5;
constexpr double kAbs = 1e-6;
constexpr int kSteps = 5;

struct SgdCase {
  float lr, momentum, wd;
  bool nesterov;
};

TEST(SgdKernel, MatchesTorchOverSeveralSteps) {
  test::KernelRunner k;
  const SgdCase cases[] = {{0.1f, 0.0f, 0.0f, false},
                           {0.05f, 0.9f, 0.0f, false},
                           {0.05f, 0.9f, 5e-4f, false},
                           {0.02f, 0.8f, 1e-2f, true},
                           {0.1f, 0.0f, 1e-3f, false}};
  for (const SgdCase& c : cases) {
    for (int64_t n : {int64_t{13}, int64_t{100003}}) {
      SCOPED_TRACE(fmt::format("lr {} momentum {} wd {} nesterov {} n {}", c.lr, c.momentum, c.wd,
                               c.nesterov, n));
      std::vector<float> p = random_floats(n, 1), buf(n, 0.0f);
      ref::Vec p64 = to_f64(p), buf64(n, 0.0);
      for (int step = 0; step < kSteps; ++step) {
        const auto g = random_floats(n, 100 + step);
        k.run(SgdUpdate{n, c.lr, c.momentum, c.wd, c.nesterov, p.data(), g.data(),
                        c.momentum != 0.0f ? buf.data() : nullptr});
        ref::sgd_step(p64, to_f64(g), buf64, c.lr, c.momentum, c.wd, c.nesterov, step == 0);
      }
      EXPECT_TRUE(all_close(p, p64, kRel, kAbs));
      if (c.momentum != 0.0f) {
        EXPECT_TRUE(all_close(buf, buf64, kRel, kAbs));
      }
    }
  }
}

TEST(AdamWKernel, MatchesTorchOverSeveralSteps) {
  test::KernelRunner k;
  struct Case {
    float lr, b1, b2, eps, wd;
  };
  for (const Case c :
       {Case{1e-2f, 0.9f, 0.999f, 1e-8f, 1e-2f}, Case{3e-3f, 0.8f, 0.99f, 1e-6f, 0.0f},
        Case{1e-1f, 0.5f, 0.9f, 1e-3f, 0.1f}}) {
    for (int64_t n : {int64_t{9}, int64_t{100003}}) {
      SCOPED_TRACE(
          fmt::format("lr {} betas {} {} eps {} wd {} n {}", c.lr, c.b1, c.b2, c.eps, c.wd, n));
      std::vector<float> p = random_floats(n, 2), m(n, 0.0f), v(n, 0.0f);
      ref::Vec p64 = to_f64(p), m64(n, 0.0), v64(n, 0.0);
      for (int step = 1; step <= kSteps; ++step) {
        const auto g = random_floats(n, 200 + step);
        k.run(AdamWUpdate{n, c.lr, c.b1, c.b2, c.eps, c.wd, step, p.data(), g.data(), m.data(),
                          v.data()});
        ref::adamw_step(p64, to_f64(g), m64, v64, c.lr, c.b1, c.b2, c.eps, c.wd, step);
      }
      EXPECT_TRUE(all_close(p, p64, kRel, kAbs));
      EXPECT_TRUE(all_close(m, m64, kRel, kAbs));
      EXPECT_TRUE(all_close(v, v64, kRel, kAbs));
    }
  }
}

TEST(OptimizerKernels, RefuseMissingStateAndStepZero) {
  test::KernelRunner k;
  std::vector<float> p(4), g(4), m(4), v(4);
  EXPECT_THROW(k.run(SgdUpdate{4, 0.1f, 0.9f, 0.0f, false, p.data(), g.data(), nullptr}),
               ConfigError);
  EXPECT_THROW(k.run(AdamWUpdate{4, 0.1f, 0.9f, 0.999f, 1e-8f, 0.0f, 0, p.data(), g.data(),
                                 m.data(), v.data()}),
               ConfigError);
}

double sum_of_squares64(const std::vector<float>& x) {
  double s = 0.0;
  for (float v : x) s += static_cast<double>(v) * v;
  return s;
}

TEST(SumOfSquaresKernel, MatchesFloat64) {
  test::KernelRunner k;
  // Around the 65536-value chunks: one partial chunk, whole chunks, many chunks and a tail.
  for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{15}, int64_t{17}, int64_t{65536},
                    int64_t{65537}, int64_t{1000003}}) {
    SCOPED_TRACE(fmt::format("n {}", n));
    const auto x = random_floats(static_cast<size_t>(n), 7, -3.0f, 3.0f);
    float out = -1.0f;
    k.run(SumOfSquares{n, x.data(), &out});
    const double ref = sum_of_squares64(x);
    // Summed in double: only the final rounding to float remains.
    EXPECT_NEAR(out, ref, 1e-7 * ref) << "n " << n;
    if (n == 0) {
      EXPECT_EQ(out, 0.0f);
    }
  }
}

TEST(SumOfSquaresKernel, SameBitsWhateverTheThreads) {
  const int64_t n = 5 * 65536 + 123;
  // Values of very different sizes, so that a change of summation order would show.
  auto x = random_floats(static_cast<size_t>(n), 11);
  for (int64_t i = 0; i < n; i += 97) x[static_cast<size_t>(i)] *= 1e4f;
  std::vector<float> outs;
  for (int threads : {1, 2, 3, 8}) {
    test::KernelRunner k(threads);
    for (int rep = 0; rep < 3; ++rep) {
      float out = 0.0f;
      k.run(SumOfSquares{n, x.data(), &out});
      outs.push_back(out);
    }
  }
  for (float o : outs) EXPECT_TRUE(test::bitwise_equal({o}, {outs[0]}));
}

// torch.nn.utils.clip_grad_norm_(params, max_norm) on one tensor, in float64.
ref::Vec clip64(const std::vector<float>& g, double max_norm) {
  const double coef = std::min(1.0, max_norm / (std::sqrt(sum_of_squares64(g)) + 1e-6));
  ref::Vec out = to_f64(g);
  for (double& v : out) v *= coef;
  return out;
}

TEST(ClipByNormKernel, ScalesToTheMaxNormWhenAbove) {
  test::KernelRunner k;
  for (int64_t n : {int64_t{5}, int64_t{100003}}) {
    for (float max_norm : {0.5f, 1.0f, n > 100 ? 7.25f : 0.25f}) {
      SCOPED_TRACE(fmt::format("n {} max_norm {}", n, max_norm));
      auto g = random_floats(static_cast<size_t>(n), 3);
      const auto before = g;
      float sum_sq = 0.0f;
      k.run(SumOfSquares{n, g.data(), &sum_sq});
      k.run(ClipByNorm{n, max_norm, &sum_sq, g.data()});
      const double norm = std::sqrt(sum_of_squares64(before));
      ASSERT_GT(norm, max_norm);  // the case under test: clipping happens
      EXPECT_TRUE(all_close(g, clip64(before, max_norm), 1e-6, 0.0));
      EXPECT_NEAR(std::sqrt(sum_of_squares64(g)), max_norm, 1e-5 * max_norm);
    }
  }
}

TEST(ClipByNormKernel, LeavesGradientsBelowTheNormBitwiseAlone) {
  test::KernelRunner k;
  const int64_t n = 1001;
  auto g = random_floats(static_cast<size_t>(n), 4, -1e-3f, 1e-3f);
  const auto before = g;
  float sum_sq = 0.0f;
  k.run(SumOfSquares{n, g.data(), &sum_sq});
  k.run(ClipByNorm{n, 1.0f, &sum_sq, g.data()});
  EXPECT_TRUE(test::bitwise_equal(g, before));
  // Exactly at the norm, max_norm / (norm + 1e-6) < 1: torch scales by it, and so do we.
  const float exact = std::sqrt(sum_sq);
  k.run(ClipByNorm{n, exact, &sum_sq, g.data()});
  EXPECT_FALSE(test::bitwise_equal(g, before));
  EXPECT_TRUE(all_close(g, clip64(before, exact), 1e-6, 0.0));
}

TEST(ClipByNormKernel, ANonFiniteNormPoisonsTheGradientsAsTorchDoes) {
  // clip_grad_norm_(error_if_nonfinite=False) multiplies by clamp(nan, max=1) = nan, and the
  // loss then shows it; silently skipping the clip would hide the overflow.
  test::KernelRunner k;
  std::vector<float> g = {1.0f, std::numeric_limits<float>::infinity(), 2.0f};
  float sum_sq = 0.0f;
  k.run(SumOfSquares{3, g.data(), &sum_sq});
  EXPECT_TRUE(std::isinf(sum_sq));
  k.run(ClipByNorm{3, 1.0f, &sum_sq, g.data()});
  EXPECT_EQ(g[0], 0.0f);          // 1 * (1 / inf), as torch
  EXPECT_TRUE(std::isnan(g[1]));  // inf * 0
  std::vector<float> h = {1.0f, 2.0f};
  float nan_sq = std::numeric_limits<float>::quiet_NaN();
  k.run(ClipByNorm{2, 1.0f, &nan_sq, h.data()});
  EXPECT_TRUE(std::isnan(h[0]) && std::isnan(h[1]));
}

TEST(ClipByNormKernel, RefusesANegativeCount) {
  test::KernelRunner k;
  float s = 0.0f, y = 0.0f;
  EXPECT_THROW(k.run(SumOfSquares{-1, &y, &s}), ConfigError);
  EXPECT_THROW(k.run(ClipByNorm{-1, 1.0f, &s, &y}), ConfigError);
}

}  // namespace
}  // namespace ferry
