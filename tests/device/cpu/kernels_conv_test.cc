// Convolution kernels against the float64 reference and finite differences, on fixed awkward
// geometries (odd sizes, stride 2, padding, groups, depthwise, 1x1, non-square) and random ones;
// plus determinism and the workspace contract.
#include <gtest/gtest.h>

#include <random>

#include "common/error.h"
#include "tests/device/cpu/kernel_test_util.h"

namespace ferry {
namespace {

using namespace test;  // kernel_test_util.h: all_close, random_floats, to_f64, ...

// fp32 kernel vs fp64 reference: sums of at most a few hundred products of values in [-1, 1].
constexpr double kRel = 1e-4;
constexpr double kAbs = 1e-4;

std::string describe(const ConvGeom& g) {
  return fmt::format("N={} C={} H={} W={} K={} {}x{} stride {}x{} pad {}x{} groups {}", g.n, g.c,
                     g.h, g.w, g.k, g.r, g.s, g.stride_h, g.stride_w, g.pad_h, g.pad_w, g.groups);
}

ConvGeom geom(int64_t n, int64_t c, int64_t h, int64_t w, int64_t k, int64_t r, int64_t s,
              int64_t stride, int64_t pad, int64_t groups = 1) {
  ConvGeom g;
  g.n = n, g.c = c, g.h = h, g.w = w, g.k = k, g.r = r, g.s = s;
  g.stride_h = g.stride_w = stride;
  g.pad_h = g.pad_w = pad;
  g.groups = groups;
  return g;
}

std::vector<ConvGeom> fixed_geometries() {
  std::vector<ConvGeom> gs = {
      geom(2, 3, 7, 7, 5, 3, 3, 2, 1),       // C=3, K=5, H=W=7, stride 2, padding 1
      geom(3, 4, 9, 13, 6, 3, 3, 1, 1),      // 9x13 input, odd batch
      geom(1, 8, 9, 9, 8, 3, 3, 1, 1, 8),    // depthwise, batch 1
      geom(2, 6, 8, 8, 4, 3, 3, 2, 1, 2),    // groups 2, stride 2
      geom(3, 5, 7, 7, 7, 1, 1, 1, 0),       // 1x1
      geom(2, 8, 9, 9, 16, 1, 1, 2, 0),      // 1x1 stride 2 (resnet downsample)
      geom(1, 6, 11, 10, 9, 5, 5, 1, 2, 3),  // 5x5, groups 3
      geom(2, 16, 8, 8, 16, 3, 3, 1, 1),     // blocked-friendly channel counts
      geom(1, 3, 5, 5, 4, 5, 5, 1, 0),       // kernel as large as the input
  };
  ConvGeom ns = geom(2, 4, 10, 7, 3, 3, 1, 1, 0);  // non-square kernel, asymmetric stride/pad
  ns.stride_h = 2, ns.stride_w = 1, ns.pad_h = 1, ns.pad_w = 0;
  gs.push_back(ns);
  return gs;
}

std::vector<ConvGeom> random_geometries(int count, uint32_t seed) {
  std::mt19937 rng(seed);
  auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  std::vector<ConvGeom> gs;
  while (static_cast<int>(gs.size()) < count) {
    ConvGeom g;
    g.groups = pick(0, 3) == 0 ? pick(2, 4) : 1;
    g.n = pick(1, 3);
    g.c = g.groups * pick(1, 5);
    g.k = pick(0, 4) == 0 ? g.c : g.groups * pick(1, 5);  // sometimes depthwise-shaped
    g.h = pick(1, 12);
    g.w = pick(1, 12);
    g.r = pick(1, 5);
    g.s = pick(1, 5);
    g.stride_h = pick(1, 3);
    g.stride_w = pick(1, 3);
    g.pad_h = pick(0, g.r / 2 + 1);
    g.pad_w = pick(0, g.s / 2 + 1);
    if (g.h + 2 * g.pad_h < g.r || g.w + 2 * g.pad_w < g.s) continue;
    gs.push_back(g);
  }
  return gs;
}

struct ConvCase {
  ConvGeom g;
  std::vector<float> x, w, bias, dy;
};

ConvCase make_case(const ConvGeom& g, uint32_t seed) {
  ConvCase c{g, {}, {}, {}, {}};
  c.x = random_floats(g.n * g.c * g.h * g.w, seed);
  c.w = random_floats(g.k * (g.c / g.groups) * g.r * g.s, seed + 1);
  c.bias = random_floats(g.k, seed + 2);
  c.dy = random_floats(g.n * g.k * g.out_h() * g.out_w(), seed + 3);
  return c;
}

// Forward, both backward passes, against the float64 reference.
void check_against_reference(test::KernelRunner& k, const ConvCase& c, bool with_bias) {
  const ConvGeom& g = c.g;
  SCOPED_TRACE(describe(g) + (with_bias ? " with bias" : " without bias"));
  const ref::Vec bias = to_f64(c.bias);

  std::vector<float> y(c.dy.size(), NAN);
  k.run(ConvForward{g, c.x.data(), c.w.data(), with_bias ? c.bias.data() : nullptr, y.data()});
  EXPECT_TRUE(all_close(
      y, ref::conv_forward(g, to_f64(c.x), to_f64(c.w), with_bias ? &bias : nullptr), kRel, kAbs));

  std::vector<float> dx(c.x.size(), NAN);
  k.run(ConvBackwardData{g, c.dy.data(), c.w.data(), dx.data()});
  EXPECT_TRUE(all_close(dx, ref::conv_backward_data(g, to_f64(c.dy), to_f64(c.w)), kRel, kAbs));

  std::vector<float> dw(c.w.size(), NAN), db(g.k, NAN);
  k.run(
      ConvBackwardWeights{g, c.x.data(), c.dy.data(), dw.data(), with_bias ? db.data() : nullptr});
  ref::Vec db_ref;
  EXPECT_TRUE(
      all_close(dw, ref::conv_backward_weights(g, to_f64(c.x), to_f64(c.dy), &db_ref), kRel, kAbs));
  if (with_bias) {
    EXPECT_TRUE(all_close(db, db_ref, kRel, kAbs));
  }
}

TEST(ConvKernel, FixedGeometriesMatchReference) {
  test::KernelRunner k;
  uint32_t seed = 100;
  for (const ConvGeom& g : fixed_geometries()) {
    check_against_reference(k, make_case(g, seed), /*with_bias=*/true);
    check_against_reference(k, make_case(g, seed + 10), /*with_bias=*/false);
    seed += 20;
  }
}

TEST(ConvKernel, RandomGeometriesMatchReference) {
  test::KernelRunner k;
  uint32_t seed = 1000;
  for (const ConvGeom& g : random_geometries(24, 7)) {
    check_against_reference(k, make_case(g, seed), /*with_bias=*/(seed / 4) % 2 == 0);
    seed += 4;
  }
}

// The kernels' gradients against central differences of the float64 forward, on sampled
// elements: L = sum(dy * conv(x, w) + b).
TEST(ConvKernel, GradientsMatchFiniteDifferences) {
  test::KernelRunner k;
  std::vector<ConvGeom> gs = {geom(2, 3, 7, 7, 5, 3, 3, 2, 1), geom(1, 4, 6, 5, 4, 3, 3, 1, 1, 2),
                              geom(3, 2, 5, 5, 3, 1, 1, 2, 0)};
  auto random = random_geometries(4, 99);
  gs.insert(gs.end(), random.begin(), random.end());
  uint32_t seed = 5000;
  for (const ConvGeom& g : gs) {
    SCOPED_TRACE(describe(g));
    const ConvCase c = make_case(g, seed += 4);
    ref::Vec x = to_f64(c.x), w = to_f64(c.w), b = to_f64(c.bias);
    const ref::Vec dy = to_f64(c.dy);

    std::vector<float> dx(c.x.size()), dw(c.w.size()), db(g.k);
    k.run(ConvBackwardData{g, c.dy.data(), c.w.data(), dx.data()});
    k.run(ConvBackwardWeights{g, c.x.data(), c.dy.data(), dw.data(), db.data()});

    auto loss = [&](const ref::Vec&) { return test::dot(dy, ref::conv_forward(g, x, w, &b)); };
    for (size_t i : test::sample_indices(x.size(), 6, seed)) {
      EXPECT_NEAR(dx[i], test::numeric_partial(loss, x, i), kAbs + kRel * std::fabs(dx[i]))
          << "dx[" << i << "]";
    }
    for (size_t i : test::sample_indices(w.size(), 6, seed + 1)) {
      EXPECT_NEAR(dw[i], test::numeric_partial(loss, w, i), kAbs + kRel * std::fabs(dw[i]))
          << "dw[" << i << "]";
    }
    for (size_t i : test::sample_indices(b.size(), 3, seed + 2)) {
      EXPECT_NEAR(db[i], test::numeric_partial(loss, b, i), kAbs + kRel * std::fabs(db[i]))
          << "db[" << i << "]";
    }
  }
}

// Same inputs, fresh outputs: the same bits, for every pass (oneDNN fixes its partitioning when
// the primitive is created; the plan cache reuses it).
TEST(ConvKernel, RepeatedRunsAreBitwiseIdentical) {
  const ConvGeom g = geom(8, 16, 16, 16, 32, 3, 3, 1, 1);
  const ConvCase c = make_case(g, 77);
  auto run_all = [&](test::KernelRunner& k) {
    std::vector<float> y(c.dy.size()), dx(c.x.size()), dw(c.w.size()), db(g.k);
    k.run(ConvForward{g, c.x.data(), c.w.data(), c.bias.data(), y.data()});
    k.run(ConvBackwardData{g, c.dy.data(), c.w.data(), dx.data()});
    k.run(ConvBackwardWeights{g, c.x.data(), c.dy.data(), dw.data(), db.data()});
    return std::vector<std::vector<float>>{y, dx, dw, db};
  };
  test::KernelRunner k1, k2;  // the second also re-creates the primitives
  const auto first = run_all(k1);
  const auto again = run_all(k1);
  const auto other = run_all(k2);
  for (size_t i = 0; i < first.size(); ++i) {
    EXPECT_TRUE(test::bitwise_equal(first[i], again[i])) << "output " << i;
    EXPECT_TRUE(test::bitwise_equal(first[i], other[i])) << "output " << i;
  }
}

// A convolution run with exactly workspace_bytes() of workspace is right and writes nothing
// past it; one byte less, or none, is refused with an error naming the size (never a silent
// overrun, never a hidden allocation).
TEST(ConvKernel, WorkspaceIsExactlyWhatItAsksFor) {
  cpu::CpuKernels kernels(test::kThreads);
  const ConvGeom g = geom(4, 16, 12, 12, 32, 3, 3, 1, 1);
  const ConvCase c = make_case(g, 31);
  const ref::Vec y_ref = ref::conv_forward(g, to_f64(c.x), to_f64(c.w), nullptr);

  ConvForward args{g, c.x.data(), c.w.data(), nullptr, nullptr};
  const uint64_t bytes = kernels.workspace_bytes(args);
  // Pointers are ignored when sizing.
  EXPECT_EQ(kernels.workspace_bytes(ConvForward{g}), bytes);
  if (bytes == 0) GTEST_SKIP() << "oneDNN runs this geometry in plain layouts on this CPU";

  constexpr size_t kGuard = 4096;
  std::vector<unsigned char> ws(bytes + kGuard, 0xA5);
  std::vector<float> y(c.dy.size(), NAN);
  args.y = y.data();
  args.ws = Workspace{ws.data(), bytes};
  kernels.run(args);
  EXPECT_TRUE(all_close(y, y_ref, kRel, kAbs));
  for (size_t i = bytes; i < ws.size(); ++i) {
    ASSERT_EQ(ws[i], 0xA5) << "byte " << i - bytes << " past the workspace";
  }

  args.ws = Workspace{ws.data(), bytes - 1};
  EXPECT_THROW(kernels.run(args), UnsupportedError);
  args.ws = Workspace{};
  try {
    kernels.run(args);
    ADD_FAILURE() << "a convolution that needs workspace ran without one";
  } catch (const UnsupportedError& e) {
    EXPECT_NE(std::string(e.what()).find(std::to_string(bytes)), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("conv_forward"), std::string::npos) << e.what();
  }
}

TEST(ConvKernel, BackwardWorkspacesAreSizedPerPass) {
  cpu::CpuKernels kernels(test::kThreads);
  const ConvGeom g = geom(4, 16, 12, 12, 32, 3, 3, 2, 1);
  const ConvCase c = make_case(g, 41);
  std::vector<float> dx(c.x.size()), dw(c.w.size()), db(g.k);
  ConvBackwardData bd{g, c.dy.data(), c.w.data(), dx.data()};
  ConvBackwardWeights bw{g, c.x.data(), c.dy.data(), dw.data(), db.data()};
  std::vector<std::byte> ws_d(kernels.workspace_bytes(bd)), ws_w(kernels.workspace_bytes(bw));
  bd.ws = Workspace{ws_d.data(), ws_d.size()};
  bw.ws = Workspace{ws_w.data(), ws_w.size()};
  kernels.run(bd);
  kernels.run(bw);
  ref::Vec db_ref;
  EXPECT_TRUE(all_close(dx, ref::conv_backward_data(g, to_f64(c.dy), to_f64(c.w)), kRel, kAbs));
  EXPECT_TRUE(
      all_close(dw, ref::conv_backward_weights(g, to_f64(c.x), to_f64(c.dy), &db_ref), kRel, kAbs));
  EXPECT_TRUE(all_close(db, db_ref, kRel, kAbs));
}

TEST(ConvKernel, InvalidGeometryIsAConfigError) {
  cpu::CpuKernels kernels(test::kThreads);
  EXPECT_THROW(kernels.workspace_bytes(ConvForward{geom(1, 6, 8, 8, 4, 3, 3, 1, 1, 4)}),
               ConfigError);  // 6 channels in 4 groups
  EXPECT_THROW(kernels.workspace_bytes(ConvForward{geom(1, 3, 2, 2, 4, 5, 5, 1, 0)}),
               ConfigError);  // kernel larger than the input
  EXPECT_THROW(kernels.workspace_bytes(ConvForward{geom(1, 3, 2, 2, 4, 3, 3, 2, 0)}),
               ConfigError);  // the same under a stride, where out_h() rounds up to one row
}

}  // namespace
}  // namespace ferry
