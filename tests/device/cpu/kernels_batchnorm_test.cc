// Batch norm kernels against the float64 reference (training forward with PyTorch's running
// statistics, inference, backward) and finite differences, on odd shapes.
#include <gtest/gtest.h>

#include "common/error.h"
#include "tests/device/cpu/kernel_test_util.h"

namespace ferry {
namespace {

using namespace test;  // kernel_test_util.h: all_close, random_floats, to_f64, ...

// Normalised outputs are O(1); gradients are sums over N*HW terms.
constexpr double kRel = 1e-4;
constexpr double kAbs = 1e-5;
constexpr double kGradAbs = 1e-4;

const BatchNormGeom kShapes[] = {
    {2, 3, 1, 1e-5f},   {3, 5, 49, 1e-5f}, {1, 4, 63, 1e-3f},
    {4, 16, 64, 1e-5f}, {7, 2, 81, 1e-5f}, {64, 3, 9, 1e-5f},
};

struct BnInputs {
  std::vector<float> x, gamma, beta, dy;
};

BnInputs inputs(const BatchNormGeom& g, uint32_t seed) {
  BnInputs in;
  in.x = random_floats(g.n * g.c * g.hw, seed, -2.0f, 3.0f);  // mean away from zero
  in.gamma = random_floats(g.c, seed + 1, 0.5f, 1.5f);
  in.beta = random_floats(g.c, seed + 2);
  in.dy = random_floats(g.n * g.c * g.hw, seed + 3);
  return in;
}

std::string describe(const BatchNormGeom& g) {
  return fmt::format("N={} C={} HW={} eps={}", g.n, g.c, g.hw, g.eps);
}

TEST(BatchNormKernel, TrainingForwardMatchesReferenceAndUpdatesRunningStats) {
  test::KernelRunner k;
  uint32_t seed = 1;
  for (const BatchNormGeom& g : kShapes) {
    SCOPED_TRACE(describe(g));
    const BnInputs in = inputs(g, seed += 4);
    auto running_mean = random_floats(g.c, seed + 100);
    auto running_var = random_floats(g.c, seed + 101, 0.5f, 2.0f);
    const ref::Vec rm0 = to_f64(running_mean), rv0 = to_f64(running_var);
    std::vector<float> y(in.x.size(), NAN), mean(g.c, NAN), var(g.c, NAN);
    const float momentum = 0.1f;
    k.run(BatchNormForwardTraining{g, momentum, in.x.data(), in.gamma.data(), in.beta.data(),
                                   y.data(), running_mean.data(), running_var.data(), mean.data(),
                                   var.data()});
    const auto r = ref::batch_norm_train(g, to_f64(in.x), to_f64(in.gamma), to_f64(in.beta));
    EXPECT_TRUE(all_close(y, r.y, kRel, kAbs));
    EXPECT_TRUE(all_close(mean, r.mean, kRel, kAbs));
    EXPECT_TRUE(all_close(var, r.var, kRel, kAbs));  // biased
    // running = (1 - m) running + m stat, the variance unbiased by n / (n - 1).
    const double count = static_cast<double>(g.n * g.hw);
    ref::Vec rm(g.c), rv(g.c);
    for (int64_t c = 0; c < g.c; ++c) {
      rm[c] = (1 - 0.1) * rm0[c] + 0.1 * r.mean[c];
      rv[c] = (1 - 0.1) * rv0[c] + 0.1 * r.var[c] * count / (count - 1);
    }
    EXPECT_TRUE(all_close(running_mean, rm, kRel, kAbs));
    EXPECT_TRUE(all_close(running_var, rv, kRel, kAbs));
  }
}

TEST(BatchNormKernel, InferenceUsesTheRunningStatistics) {
  test::KernelRunner k;
  uint32_t seed = 300;
  for (const BatchNormGeom& g : kShapes) {
    SCOPED_TRACE(describe(g));
    const BnInputs in = inputs(g, seed += 4);
    const auto rm = random_floats(g.c, seed + 1), rv = random_floats(g.c, seed + 2, 0.1f, 3.0f);
    std::vector<float> y(in.x.size(), NAN);
    k.run(BatchNormForwardInference{g, in.x.data(), in.gamma.data(), in.beta.data(), rm.data(),
                                    rv.data(), y.data()});
    EXPECT_TRUE(all_close(y,
                          ref::batch_norm_infer(g, to_f64(in.x), to_f64(in.gamma), to_f64(in.beta),
                                                to_f64(rm), to_f64(rv)),
                          kRel, kAbs));
  }
}

TEST(BatchNormKernel, BackwardMatchesReference) {
  test::KernelRunner k;
  uint32_t seed = 600;
  for (const BatchNormGeom& g : kShapes) {
    SCOPED_TRACE(describe(g));
    const BnInputs in = inputs(g, seed += 4);
    std::vector<float> y(in.x.size()), mean(g.c), var(g.c);
    k.run(BatchNormForwardTraining{g, 0.1f, in.x.data(), in.gamma.data(), in.beta.data(), y.data(),
                                   nullptr, nullptr, mean.data(), var.data()});
    std::vector<float> dx(in.x.size(), NAN), dgamma(g.c, NAN), dbeta(g.c, NAN);
    k.run(BatchNormBackward{g, in.x.data(), in.dy.data(), in.gamma.data(), mean.data(), var.data(),
                            dx.data(), dgamma.data(), dbeta.data()});
    const auto r = ref::batch_norm_backward(g, to_f64(in.x), to_f64(in.dy), to_f64(in.gamma));
    EXPECT_TRUE(all_close(dx, r.dx, kRel, kGradAbs));
    EXPECT_TRUE(all_close(dgamma, r.dgamma, kRel, kGradAbs));
    EXPECT_TRUE(all_close(dbeta, r.dbeta, kRel, kGradAbs));
  }
}

// L = sum(dy * bn_train(x, gamma, beta)) differentiated numerically through the batch stats.
TEST(BatchNormKernel, BackwardMatchesFiniteDifferences) {
  test::KernelRunner k;
  for (const BatchNormGeom& g : {BatchNormGeom{3, 2, 5, 1e-5f}, BatchNormGeom{1, 3, 7, 1e-3f}}) {
    SCOPED_TRACE(describe(g));
    const BnInputs in = inputs(g, 42);
    std::vector<float> y(in.x.size()), mean(g.c), var(g.c);
    k.run(BatchNormForwardTraining{g, 0.1f, in.x.data(), in.gamma.data(), in.beta.data(), y.data(),
                                   nullptr, nullptr, mean.data(), var.data()});
    std::vector<float> dx(in.x.size()), dgamma(g.c), dbeta(g.c);
    k.run(BatchNormBackward{g, in.x.data(), in.dy.data(), in.gamma.data(), mean.data(), var.data(),
                            dx.data(), dgamma.data(), dbeta.data()});
    ref::Vec x = to_f64(in.x), gamma = to_f64(in.gamma), beta = to_f64(in.beta);
    const ref::Vec dy = to_f64(in.dy);
    auto loss = [&](const ref::Vec&) {
      return test::dot(dy, ref::batch_norm_train(g, x, gamma, beta).y);
    };
    for (size_t i = 0; i < x.size(); ++i) {
      EXPECT_NEAR(dx[i], test::numeric_partial(loss, x, i), kGradAbs) << "dx[" << i << "]";
    }
    for (int64_t c = 0; c < g.c; ++c) {
      EXPECT_NEAR(dgamma[c], test::numeric_partial(loss, gamma, c), kGradAbs);
      EXPECT_NEAR(dbeta[c], test::numeric_partial(loss, beta, c), kGradAbs);
    }
  }
}

TEST(BatchNormKernel, OneValuePerChannelIsRefusedInTraining) {
  test::KernelRunner k;
  const BatchNormGeom g{1, 2, 1, 1e-5f};
  std::vector<float> x(2, 1.0f), ones(2, 1.0f), zeros(2, 0.0f), y(2), m(2), v(2);
  EXPECT_THROW(k.run(BatchNormForwardTraining{g, 0.1f, x.data(), ones.data(), zeros.data(),
                                              y.data(), nullptr, nullptr, m.data(), v.data()}),
               ConfigError);
}

}  // namespace
}  // namespace ferry
