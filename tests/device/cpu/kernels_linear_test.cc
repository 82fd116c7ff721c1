// Fully connected kernels against the float64 reference and finite differences, odd shapes
// included (batch 1, one output, sizes not multiples of any vector width).
#include <gtest/gtest.h>

#include "tests/device/cpu/kernel_test_util.h"

namespace ferry {
namespace {

using namespace test;  // kernel_test_util.h: all_close, random_floats, to_f64, ...

// fp32 vs fp64 on dot products of at most ~600 terms in [-1, 1].
constexpr double kRel = 1e-4;
constexpr double kAbs = 1e-4;

TEST(LinearKernel, MatchesReference) {
  test::KernelRunner k;
  const LinearGeom shapes[] = {{1, 1, 1},   {1, 7, 3},    {3, 5, 1},    {64, 512, 10},
                               {5, 33, 17}, {17, 9, 130}, {2, 300, 257}};
  uint32_t seed = 1;
  for (const LinearGeom& g : shapes) {
    for (bool with_bias : {true, false}) {
      SCOPED_TRACE(fmt::format("M={} K={} N={} bias={}", g.m, g.k, g.n, with_bias));
      const auto x = random_floats(g.m * g.k, seed++), w = random_floats(g.n * g.k, seed++);
      const auto b = random_floats(g.n, seed++), dy = random_floats(g.m * g.n, seed++);
      const ref::Vec b64 = to_f64(b);

      std::vector<float> y(g.m * g.n, NAN);
      k.run(LinearForward{g, x.data(), w.data(), with_bias ? b.data() : nullptr, y.data()});
      EXPECT_TRUE(all_close(
          y, ref::linear_forward(g, to_f64(x), to_f64(w), with_bias ? &b64 : nullptr), kRel, kAbs));

      std::vector<float> dx(g.m * g.k, NAN);
      k.run(LinearBackwardData{g, dy.data(), w.data(), dx.data()});
      EXPECT_TRUE(all_close(dx, ref::linear_backward_data(g, to_f64(dy), to_f64(w)), kRel, kAbs));

      std::vector<float> dw(g.n * g.k, NAN), db(g.n, NAN);
      k.run(LinearBackwardWeights{g, x.data(), dy.data(), dw.data(),
                                  with_bias ? db.data() : nullptr});
      ref::Vec db_ref;
      EXPECT_TRUE(all_close(dw, ref::linear_backward_weights(g, to_f64(x), to_f64(dy), &db_ref),
                            kRel, kAbs));
      if (with_bias) {
        EXPECT_TRUE(all_close(db, db_ref, kRel, kAbs));
      } else {
        EXPECT_TRUE(std::isnan(db[0])) << "dbias written although null was passed";
      }
    }
  }
}

TEST(LinearKernel, GradientsMatchFiniteDifferences) {
  test::KernelRunner k;
  const LinearGeom g{3, 7, 5};
  const auto xf = random_floats(g.m * g.k, 11), wf = random_floats(g.n * g.k, 12);
  const auto bf = random_floats(g.n, 13), dyf = random_floats(g.m * g.n, 14);
  std::vector<float> dx(g.m * g.k), dw(g.n * g.k), db(g.n);
  k.run(LinearBackwardData{g, dyf.data(), wf.data(), dx.data()});
  k.run(LinearBackwardWeights{g, xf.data(), dyf.data(), dw.data(), db.data()});
  ref::Vec x = to_f64(xf), w = to_f64(wf), b = to_f64(bf);
  const ref::Vec dy = to_f64(dyf);
  auto loss = [&](const ref::Vec&) { return test::dot(dy, ref::linear_forward(g, x, w, &b)); };
  for (size_t i = 0; i < x.size(); ++i) EXPECT_NEAR(dx[i], test::numeric_partial(loss, x, i), kAbs);
  for (size_t i = 0; i < w.size(); ++i) EXPECT_NEAR(dw[i], test::numeric_partial(loss, w, i), kAbs);
  for (size_t i = 0; i < b.size(); ++i) EXPECT_NEAR(db[i], test::numeric_partial(loss, b, i), kAbs);
}

TEST(LinearKernel, RepeatedRunsAreBitwiseIdentical) {
  const LinearGeom g{64, 512, 100};
  const auto x = random_floats(g.m * g.k, 1), w = random_floats(g.n * g.k, 2);
  const auto dy = random_floats(g.m * g.n, 3);
  auto run_all = [&](test::KernelRunner& k) {
    std::vector<float> y(g.m * g.n), dx(g.m * g.k), dw(g.n * g.k), db(g.n);
    k.run(LinearForward{g, x.data(), w.data(), nullptr, y.data()});
    k.run(LinearBackwardData{g, dy.data(), w.data(), dx.data()});
    k.run(LinearBackwardWeights{g, x.data(), dy.data(), dw.data(), db.data()});
    return std::vector<std::vector<float>>{y, dx, dw, db};
  };
  test::KernelRunner k1, k2;
  const auto a = run_all(k1), b = run_all(k1), c = run_all(k2);
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_TRUE(test::bitwise_equal(a[i], b[i])) << "output " << i;
    EXPECT_TRUE(test::bitwise_equal(a[i], c[i])) << "output " << i;
  }
}

}  // namespace
}  // namespace ferry
