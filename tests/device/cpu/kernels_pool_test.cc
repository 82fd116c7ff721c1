// Pooling kernels against the float64 reference: padding, ceil_mode, count_include_pad both
// ways (covering both the oneDNN path and the loop fallback), PyTorch's first-maximum tie rule,
// adaptive average pooling, and finite differences of the backward passes.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>

#include "common/error.h"
#include "tests/device/cpu/kernel_test_util.h"

namespace ferry {
namespace {

using namespace test;  // kernel_test_util.h: all_close, random_floats, to_f64, ...

// Sums of at most 25 window values in [-1, 1].
constexpr double kRel = 1e-5;
constexpr double kAbs = 1e-5;

PoolGeom pool(PoolKind kind, int64_t n, int64_t c, int64_t h, int64_t w, int64_t k, int64_t stride,
              int64_t pad, bool ceil_mode = false, bool include_pad = true) {
  PoolGeom g;
  g.kind = kind;
  g.n = n, g.c = c, g.h = h, g.w = w;
  g.kh = g.kw = k;
  g.stride_h = g.stride_w = stride;
  g.pad_h = g.pad_w = pad;
  g.ceil_mode = ceil_mode;
  g.count_include_pad = include_pad;
  return g;
}

std::string describe(const PoolGeom& g) {
  return fmt::format(
      "{} N={} C={} H={} W={} kernel {}x{} stride {}x{} pad {}x{} ceil={} "
      "include_pad={} -> {}x{}",
      g.kind == PoolKind::kMax ? "max" : "avg", g.n, g.c, g.h, g.w, g.kh, g.kw, g.stride_h,
      g.stride_w, g.pad_h, g.pad_w, g.ceil_mode, g.count_include_pad, g.out_h(), g.out_w());
}

std::vector<PoolGeom> fixed_geometries() {
  using enum PoolKind;
  std::vector<PoolGeom> gs = {
      pool(kMax, 2, 3, 8, 8, 2, 2, 0),                // VGG's 2x2 stride 2
      pool(kMax, 1, 2, 32, 33, 2, 2, 0),              // long rows, a leftover column
      pool(kMax, 3, 2, 7, 7, 3, 2, 1),                // ResNet's stem pool, odd size
      pool(kMax, 1, 3, 8, 8, 3, 2, 0, true),          // ceil mode: a partial last window
      pool(kMax, 2, 2, 9, 13, 3, 2, 1, true),         // 9x13, ceil mode with padding
      pool(kAvg, 2, 3, 7, 7, 3, 1, 1),                // include pad: border divisor 9
      pool(kAvg, 2, 3, 7, 7, 3, 1, 1, false, false),  // exclude pad: border divisor 4 or 6
      pool(kAvg, 1, 2, 8, 8, 3, 2, 1, true, true),    // ceil: last window past the padding
      pool(kAvg, 1, 2, 9, 13, 3, 2, 1, true, false),  // ceil, exclude pad
      pool(kAvg, 3, 1, 5, 5, 2, 2, 0, true, true),    // ceil without padding: divisor 2 or 1
      pool(kAvg, 1, 1, 6, 6, 2, 2, 1, false, true),   // windows half in padding
  };
  PoolGeom ns = pool(PoolKind::kMax, 2, 2, 10, 7, 3, 1, 1);  // non-square
  ns.kw = 2, ns.stride_h = 2, ns.pad_w = 0;
  gs.push_back(ns);
  return gs;
}

std::vector<PoolGeom> random_geometries(int count, uint32_t seed) {
  std::mt19937 rng(seed);
  auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  std::vector<PoolGeom> gs;
  while (static_cast<int>(gs.size()) < count) {
    PoolGeom g;
    g.kind = pick(0, 1) ? PoolKind::kMax : PoolKind::kAvg;
    g.n = pick(1, 3), g.c = pick(1, 3), g.h = pick(1, 11), g.w = pick(1, 11);
    g.kh = pick(1, 4), g.kw = pick(1, 4);
    g.stride_h = pick(1, 3), g.stride_w = pick(1, 3);
    g.pad_h = pick(0, g.kh / 2), g.pad_w = pick(0, g.kw / 2);
    g.ceil_mode = pick(0, 1);
    g.count_include_pad = pick(0, 1);
    if (g.h + 2 * g.pad_h < g.kh || g.w + 2 * g.pad_w < g.kw) continue;
    gs.push_back(g);
  }
  return gs;
}

void check_against_reference(test::KernelRunner& k, const PoolGeom& g, uint32_t seed) {
  SCOPED_TRACE(describe(g));
  const auto x = random_floats(g.n * g.c * g.h * g.w, seed);
  const int64_t out = g.n * g.c * g.out_h() * g.out_w();
  const auto dy = random_floats(out, seed + 1);
  // One guard element past the output: the kernel writes exactly out elements.
  std::vector<float> y(out + 1, NAN);
  k.run(PoolForward{g, x.data(), y.data()});
  EXPECT_TRUE(std::isnan(y.back())) << "wrote past the output";
  y.pop_back();
  EXPECT_TRUE(all_close(y, ref::pool_forward(g, to_f64(x)), kRel, kAbs));

  std::vector<float> dx(x.size(), NAN);
  k.run(PoolBackward{g, x.data(), y.data(), dy.data(), dx.data()});
  EXPECT_TRUE(all_close(dx, ref::pool_backward(g, to_f64(x), to_f64(dy)), kRel, kAbs));
}

TEST(PoolKernel, FixedGeometriesMatchReference) {
  test::KernelRunner k;
  uint32_t seed = 10;
  for (const PoolGeom& g : fixed_geometries()) check_against_reference(k, g, seed += 2);
}

TEST(PoolKernel, RandomGeometriesMatchReference) {
  test::KernelRunner k;
  uint32_t seed = 500;
  for (const PoolGeom& g : random_geometries(40, 3)) check_against_reference(k, g, seed += 2);
}

// ceil_mode with padding counted: PyTorch divides the last window by its part inside the padded
// input (here 2x2 of the 3x3 kernel past the corner), not by the whole kernel.
TEST(PoolKernel, AvgCeilModeDivisorStopsAtThePaddedEdge) {
  test::KernelRunner k;
  const PoolGeom g = pool(PoolKind::kAvg, 1, 1, 4, 4, 3, 2, 1, /*ceil=*/true, /*include=*/true);
  ASSERT_EQ(g.out_h(), 3);  // windows start at -1, 1, 3
  std::vector<float> x(16, 1.0f), y(9);
  k.run(PoolForward{g, x.data(), y.data()});
  // Window (2, 2) covers rows/cols 3..5 of which 3..4 lie in the padded input (4 + 1): divisor
  // 2 * 2 = 4 over one real value.
  EXPECT_FLOAT_EQ(y[8], 1.0f / 4.0f);
  // Window (0, 0) covers -1..1: divisor 9, four real values.
  EXPECT_FLOAT_EQ(y[0], 4.0f / 9.0f);
}

// Ties go to the first maximum in row-major order, found from x.
TEST(PoolKernel, MaxBackwardSendsTiesToTheFirstMaximum) {
  test::KernelRunner k;
  const PoolGeom g = pool(PoolKind::kMax, 1, 1, 2, 4, 2, 2, 0);
  const std::vector<float> x = {1, 3, 3, 0,  // window 0: {1, 3 | 3, 2}, window 1: {3, 0 | 1, 3}
                                3, 2, 1, 3};
  std::vector<float> y(2), dx(8, NAN);
  const std::vector<float> dy = {10, 20};
  k.run(PoolForward{g, x.data(), y.data()});
  EXPECT_EQ(y, (std::vector<float>{3, 3}));
  k.run(PoolBackward{g, x.data(), y.data(), dy.data(), dx.data()});
  EXPECT_EQ(dx, (std::vector<float>{0, 10, 20, 0, 0, 0, 0, 0}));

  // All equal, overlapping windows (3x3 stride 1): each window's first element collects its dy.
  const PoolGeom o = pool(PoolKind::kMax, 1, 1, 4, 4, 3, 1, 1);
  std::vector<float> flat(16, 0.5f), oy(16), ody(16, 1.0f), odx(16);
  k.run(PoolForward{o, flat.data(), oy.data()});
  k.run(PoolBackward{o, flat.data(), oy.data(), ody.data(), odx.data()});
  EXPECT_TRUE(all_close(odx, ref::pool_backward(o, to_f64(flat), to_f64(ody)), 0, 0));
  EXPECT_EQ(odx[0], 4.0f);  // windows (0,0) (0,1) (1,0) (1,1) all start at element 0
}

// Heavy ties (values from {0, 1, 2}) and NaNs on every max pooling path: general windows, tiled
// 2x2 windows with short rows, tiled 2x2 with long rows (and a leftover row and column). As in
// PyTorch a NaN is the window's maximum (the last NaN, for the gradient).
TEST(PoolKernel, MaxPoolingTiesAndNaNsOnEveryPath) {
  test::KernelRunner k;
  for (const PoolGeom& g :
       {pool(PoolKind::kMax, 2, 3, 9, 9, 3, 2, 1, true), pool(PoolKind::kMax, 2, 3, 8, 10, 2, 2, 0),
        pool(PoolKind::kMax, 1, 2, 35, 33, 2, 2, 0)}) {
    SCOPED_TRACE(describe(g));
    std::vector<float> x = random_floats(g.n * g.c * g.h * g.w, 5, 0.0f, 3.0f);
    for (auto& v : x) v = std::floor(v);
    for (size_t i = 7; i < x.size(); i += 23) x[i] = NAN;
    const auto dy = random_floats(g.n * g.c * g.out_h() * g.out_w(), 6);
    std::vector<float> y(dy.size(), 5.0f), dx(x.size(), -7.0f);
    k.run(PoolForward{g, x.data(), y.data()});
    EXPECT_TRUE(all_close(y, ref::pool_forward(g, to_f64(x)), 0, 0));  // NaN propagates
    EXPECT_TRUE(std::any_of(y.begin(), y.end(), [](float v) { return std::isnan(v); }));
    k.run(PoolBackward{g, x.data(), y.data(), dy.data(), dx.data()});
    EXPECT_TRUE(all_close(dx, ref::pool_backward(g, to_f64(x), to_f64(dy)), kRel, kAbs));
  }
}

TEST(PoolKernel, BackwardMatchesFiniteDifferences) {
  test::KernelRunner k;
  for (const PoolGeom& g : {pool(PoolKind::kMax, 2, 2, 7, 7, 3, 2, 1, true),
                            pool(PoolKind::kAvg, 2, 2, 7, 6, 3, 2, 1, true, true),
                            pool(PoolKind::kAvg, 1, 2, 9, 5, 3, 2, 1, false, false)}) {
    SCOPED_TRACE(describe(g));
    const auto xf = random_floats(g.n * g.c * g.h * g.w, 71);  // distinct values: no ties
    const auto dyf = random_floats(g.n * g.c * g.out_h() * g.out_w(), 72);
    std::vector<float> y(dyf.size()), dx(xf.size());
    k.run(PoolForward{g, xf.data(), y.data()});
    k.run(PoolBackward{g, xf.data(), y.data(), dyf.data(), dx.data()});
    ref::Vec x = to_f64(xf);
    const ref::Vec dy = to_f64(dyf);
    auto loss = [&](const ref::Vec& v) { return test::dot(dy, ref::pool_forward(g, v)); };
    for (size_t i = 0; i < x.size(); ++i) {
      EXPECT_NEAR(dx[i], test::numeric_partial(loss, x, i, 1e-7), 1e-5) << "dx[" << i << "]";
    }
  }
}

TEST(PoolKernel, InvalidGeometryIsAConfigError) {
  test::KernelRunner k;
  std::vector<float> x(64), y(64);
  // Padding above half the kernel, which PyTorch rejects too.
  EXPECT_THROW(k.run(PoolForward{pool(PoolKind::kMax, 1, 1, 8, 8, 2, 2, 2), x.data(), y.data()}),
               ConfigError);
}

TEST(AdaptiveAvgPoolKernel, MatchesReferenceAndFiniteDifferences) {
  test::KernelRunner k;
  struct Shape {
    int64_t n, c, h, w, oh, ow;
  };
  const Shape shapes[] = {{2, 3, 4, 4, 1, 1}, {1, 2, 7, 7, 3, 3}, {3, 1, 9, 13, 4, 5},
                          {1, 2, 5, 3, 7, 4}, {2, 2, 8, 8, 8, 8}, {1, 1, 1, 1, 2, 3}};
  uint32_t seed = 900;
  for (const Shape& s : shapes) {
    SCOPED_TRACE(fmt::format("({}, {}, {}, {}) -> {}x{}", s.n, s.c, s.h, s.w, s.oh, s.ow));
    const auto x = random_floats(s.n * s.c * s.h * s.w, seed++);
    const auto dy = random_floats(s.n * s.c * s.oh * s.ow, seed++);
    std::vector<float> y(dy.size(), NAN), dx(x.size(), NAN);
    k.run(AdaptiveAvgPoolForward{s.n, s.c, s.h, s.w, s.oh, s.ow, x.data(), y.data()});
    EXPECT_TRUE(all_close(
        y, ref::adaptive_avg_pool_forward(s.n, s.c, s.h, s.w, s.oh, s.ow, to_f64(x)), kRel, kAbs));
    k.run(AdaptiveAvgPoolBackward{s.n, s.c, s.h, s.w, s.oh, s.ow, dy.data(), dx.data()});
    EXPECT_TRUE(
        all_close(dx, ref::adaptive_avg_pool_backward(s.n, s.c, s.h, s.w, s.oh, s.ow, to_f64(dy)),
                  kRel, kAbs));
    ref::Vec xv = to_f64(x);
    const ref::Vec dyv = to_f64(dy);
    auto loss = [&](const ref::Vec& v) {
      return test::dot(dyv, ref::adaptive_avg_pool_forward(s.n, s.c, s.h, s.w, s.oh, s.ow, v));
    };
    for (size_t i : test::sample_indices(xv.size(), 10, seed)) {
      EXPECT_NEAR(dx[i], test::numeric_partial(loss, xv, i), 1e-5) << "dx[" << i << "]";
    }
  }
}

}  // namespace
}  // namespace ferry
