// Optimizer kernels over several steps against float64 transcriptions of torch.optim's SGD
// (first-step buffer copy, dampening 0) and AdamW.
#include <gtest/gtest.h>

#include "common/error.h"
#include "tests/device/cpu/kernel_test_util.h"

namespace ferry {
namespace {

using test::all_close;
using test::random_floats;
using test::to_f64;

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

}  // namespace
}  // namespace ferry
