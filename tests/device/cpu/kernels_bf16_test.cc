// The CPU kernels in bf16 storage (Note [Storage dtype of a kernel] in device/kernels.h) against
// the float64 reference on the same bf16-rounded inputs: the only error left is fp32 math and
// the final rounding to bf16 (a relative 2^-9), so the tolerances below are bf16's, not looser.
#include <gtest/gtest.h>

#include <bit>
#include <chrono>
#include <cstdio>
#include <cstring>

#include "device/cpu/bf16_storage.h"
#include "device/cpu/cpu_kernels_impl.h"
#include "device/cpu/parallel.h"
#include "device/kernel_checks.h"
#include "tests/device/cpu/kernel_test_util.h"

namespace ferry {
namespace {

using namespace test;  // kernel_test_util.h

// One rounding to bf16 (2^-9 relative) with margin, plus fp32 accumulation.
constexpr double kRel = 8e-3;
constexpr double kAbs = 1e-4;

class Bf16Kernels : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!k.kernels().supports(kernel_kind<ConvForward>(), DType::kBF16)) {
      GTEST_SKIP() << "this CPU has no avx512_bf16: no bf16 kernels to test";
    }
  }
  KernelRunner k;
};

TEST(Bf16Storage, RoundsToNearestEvenAndKeepsNan) {
  const std::vector<float> x = {1.0f,
                                std::bit_cast<float>(0x3f808000u),  // a tie, even below: down
                                std::bit_cast<float>(0x3f818000u),  // a tie, odd below: up
                                std::bit_cast<float>(0x3f808001u),  // above the tie: up
                                NAN,
                                -INFINITY,
                                3.4e38f};  // rounds up to inf
  std::vector<uint16_t> b(x.size());
  cpu::narrow_to_bf16(x.data(), b.data(), static_cast<int64_t>(x.size()));
  EXPECT_EQ(b[0], 0x3f80);
  EXPECT_EQ(b[1], 0x3f80);
  EXPECT_EQ(b[2], 0x3f82);
  EXPECT_EQ(b[3], 0x3f81);
  EXPECT_TRUE((b[4] & 0x7f80) == 0x7f80 && (b[4] & 0x7f) != 0) << std::hex << b[4];
  EXPECT_EQ(b[5], 0xff80);
  EXPECT_EQ(b[6], 0x7f80);
  std::vector<float> back(x.size());
  cpu::widen_bf16(b.data(), back.data(), static_cast<int64_t>(b.size()));
  EXPECT_EQ(back[0], 1.0f);
  EXPECT_EQ(back[2], std::bit_cast<float>(0x3f820000u));
}

TEST_F(Bf16Kernels, SupportsWhatHasADtype) {
  const auto& kernels = k.kernels();
  for (KernelKind kind : {kernel_kind<LinearForward>(), kernel_kind<AttentionBackward>(),
                          kernel_kind<LayerNormForward>(), kernel_kind<Fill>()}) {
    EXPECT_TRUE(kernels.supports(kind, DType::kBF16)) << kernel_name(kind);
  }
  // fp32 master weights and optimizer state: the updates and clipping stay fp32.
  for (KernelKind kind : {kernel_kind<SgdUpdate>(), kernel_kind<AdamWUpdate>(),
                          kernel_kind<SumOfSquares>(), kernel_kind<CopyDevice>()}) {
    EXPECT_FALSE(kernels.supports(kind, DType::kBF16)) << kernel_name(kind);
  }
  EXPECT_FALSE(kernels.supports(kernel_kind<ReluForward>(), DType::kF64));
}

TEST_F(Bf16Kernels, ConvolutionMatchesReference) {
  const ConvGeom shapes[] = {
      {.n = 2, .c = 3, .h = 7, .w = 7, .k = 4, .r = 3, .s = 3, .pad_h = 1, .pad_w = 1},
      {.n = 2,
       .c = 16,
       .h = 9,
       .w = 8,
       .k = 32,
       .r = 3,
       .s = 3,
       .stride_h = 2,
       .stride_w = 2,
       .pad_h = 1,
       .pad_w = 1},
      {.n = 1, .c = 8, .h = 5, .w = 5, .k = 6, .r = 1, .s = 1},
      {.n = 2,
       .c = 4,
       .h = 6,
       .w = 6,
       .k = 4,
       .r = 3,
       .s = 3,
       .pad_h = 1,
       .pad_w = 1,
       .groups = 2}};
  uint32_t seed = 100;
  for (const ConvGeom& g : shapes) {
    SCOPED_TRACE(conv_geom_text(g));
    const int64_t xs = g.n * g.c * g.h * g.w, ws = g.k * (g.c / g.groups) * g.r * g.s;
    const int64_t ys = g.n * g.k * g.out_h() * g.out_w();
    Bf16 x(random_floats(xs, seed++)), w(random_floats(ws, seed++)), dy(random_floats(ys, seed++));
    const auto bias = random_floats(g.k, seed++);
    const ref::Vec b64 = to_f64(bias);
    Bf16 y(ys);
    k.run(ConvForward{.g = g,
                      .x = x.ptr(),
                      .w = w.ptr(),
                      .bias = bias.data(),
                      .y = y.ptr(),
                      .dtype = DType::kBF16});
    EXPECT_TRUE(all_close(y.values(), ref::conv_forward(g, x.f64(), w.f64(), &b64), kRel, kAbs));
    Bf16 dx(xs);
    k.run(ConvBackwardData{
        .g = g, .dy = dy.ptr(), .w = w.ptr(), .dx = dx.ptr(), .dtype = DType::kBF16});
    EXPECT_TRUE(all_close(dx.values(), ref::conv_backward_data(g, dy.f64(), w.f64()), kRel, kAbs));
    // The weight gradient is fp32: only fp32 accumulation error.
    std::vector<float> dw(ws, NAN), db(g.k, NAN);
    k.run(ConvBackwardWeights{.g = g,
                              .x = x.ptr(),
                              .dy = dy.ptr(),
                              .dw = dw.data(),
                              .dbias = db.data(),
                              .dtype = DType::kBF16});
    ref::Vec db_ref;
    EXPECT_TRUE(
        all_close(dw, ref::conv_backward_weights(g, x.f64(), dy.f64(), &db_ref), 1e-4, 1e-4));
    EXPECT_TRUE(all_close(db, db_ref, 1e-4, 1e-4));
  }
}

TEST_F(Bf16Kernels, LinearMatchesReferenceInBothWeightLayouts) {
  uint32_t seed = 200;
  for (const LinearGeom& g : {LinearGeom{5, 33, 17}, LinearGeom{64, 96, 40, true},
                              LinearGeom{1, 7, 3}, LinearGeom{17, 64, 130, true}}) {
    SCOPED_TRACE(fmt::format("M={} K={} N={} in_out={}", g.m, g.k, g.n, g.weight_in_out));
    Bf16 x(random_floats(g.m * g.k, seed++)), w(random_floats(g.n * g.k, seed++));
    Bf16 dy(random_floats(g.m * g.n, seed++));
    const auto bias = random_floats(g.n, seed++);
    const ref::Vec b64 = to_f64(bias);
    // The reference takes nn.Linear's (N, K); a Conv1D weight (K, N) is its transpose.
    const ref::Vec w64 = w.f64();
    ref::Vec w_nk = w64;
    if (g.weight_in_out) {
      for (int64_t n = 0; n < g.n; ++n)
        for (int64_t kk = 0; kk < g.k; ++kk) w_nk[n * g.k + kk] = w64[kk * g.n + n];
    }
    LinearGeom plain = g;
    plain.weight_in_out = false;
    Bf16 y(g.m * g.n);
    k.run(LinearForward{.g = g,
                        .x = x.ptr(),
                        .w = w.ptr(),
                        .bias = bias.data(),
                        .y = y.ptr(),
                        .dtype = DType::kBF16});
    EXPECT_TRUE(all_close(y.values(), ref::linear_forward(plain, x.f64(), w_nk, &b64), kRel, kAbs));
    Bf16 dx(g.m * g.k);
    k.run(LinearBackwardData{
        .g = g, .dy = dy.ptr(), .w = w.ptr(), .dx = dx.ptr(), .dtype = DType::kBF16});
    EXPECT_TRUE(
        all_close(dx.values(), ref::linear_backward_data(plain, dy.f64(), w_nk), kRel, kAbs));
    std::vector<float> dw(g.n * g.k, NAN), db(g.n, NAN);
    k.run(LinearBackwardWeights{.g = g,
                                .x = x.ptr(),
                                .dy = dy.ptr(),
                                .dw = dw.data(),
                                .dbias = db.data(),
                                .dtype = DType::kBF16});
    ref::Vec db_ref;
    ref::Vec dw_ref = ref::linear_backward_weights(plain, x.f64(), dy.f64(), &db_ref);
    if (g.weight_in_out) {
      const ref::Vec nk = dw_ref;
      for (int64_t n = 0; n < g.n; ++n)
        for (int64_t kk = 0; kk < g.k; ++kk) dw_ref[kk * g.n + n] = nk[n * g.k + kk];
    }
    EXPECT_TRUE(all_close(dw, dw_ref, 1e-4, 1e-4));
    EXPECT_TRUE(all_close(db, db_ref, 1e-5, 1e-5));
  }
}

TEST_F(Bf16Kernels, PoolingMatchesReference) {
  PoolGeom maxg{.kind = PoolKind::kMax,
                .n = 2,
                .c = 3,
                .h = 9,
                .w = 8,
                .kh = 3,
                .kw = 3,
                .stride_h = 2,
                .stride_w = 2,
                .pad_h = 1,
                .pad_w = 1};
  PoolGeom avgg = maxg;
  avgg.kind = PoolKind::kAvg;
  uint32_t seed = 300;
  for (const PoolGeom& g : {maxg, avgg}) {
    const int64_t xs = g.n * g.c * g.h * g.w, ys = g.n * g.c * g.out_h() * g.out_w();
    Bf16 x(random_floats(xs, seed++)), dy(random_floats(ys, seed++)), y(ys), dx(xs);
    k.run(PoolForward{.g = g, .x = x.ptr(), .y = y.ptr(), .dtype = DType::kBF16});
    EXPECT_TRUE(all_close(y.values(), ref::pool_forward(g, x.f64()), kRel, kAbs));
    k.run(PoolBackward{
        .g = g, .x = x.ptr(), .y = y.ptr(), .dy = dy.ptr(), .dx = dx.ptr(), .dtype = DType::kBF16});
    EXPECT_TRUE(all_close(dx.values(), ref::pool_backward(g, x.f64(), dy.f64()), kRel, kAbs));
  }
  Bf16 x(random_floats(2 * 3 * 7 * 7, seed++)), y(2 * 3), dy(random_floats(2 * 3, seed++));
  Bf16 dx(2 * 3 * 7 * 7);
  k.run(AdaptiveAvgPoolForward{2, 3, 7, 7, 1, 1, x.ptr(), y.ptr(), DType::kBF16});
  EXPECT_TRUE(
      all_close(y.values(), ref::adaptive_avg_pool_forward(2, 3, 7, 7, 1, 1, x.f64()), kRel, kAbs));
  k.run(AdaptiveAvgPoolBackward{2, 3, 7, 7, 1, 1, dy.ptr(), dx.ptr(), DType::kBF16});
  EXPECT_TRUE(all_close(dx.values(), ref::adaptive_avg_pool_backward(2, 3, 7, 7, 1, 1, dy.f64()),
                        kRel, kAbs));
}

TEST_F(Bf16Kernels, BatchNormKeepsFp32StatisticsAndMatchesReference) {
  const BatchNormGeom g{.n = 4, .c = 5, .hw = 37};
  const int64_t n = g.n * g.c * g.hw;
  Bf16 x(random_floats(n, 401, -2.0f, 3.0f)), dy(random_floats(n, 402)), y(n), dx(n);
  const auto gamma = random_floats(g.c, 403, 0.5f, 1.5f), beta = random_floats(g.c, 404);
  std::vector<float> rm(g.c, 0.0f), rv(g.c, 1.0f), mean(g.c), var(g.c), dgamma(g.c), dbeta(g.c);
  k.run(BatchNormForwardTraining{g, 0.1f, x.ptr(), gamma.data(), beta.data(), y.ptr(), rm.data(),
                                 rv.data(), mean.data(), var.data(), DType::kBF16});
  const auto r = ref::batch_norm_train(g, x.f64(), to_f64(gamma), to_f64(beta));
  EXPECT_TRUE(all_close(y.values(), r.y, kRel, 1e-3));
  EXPECT_TRUE(all_close(mean, r.mean, 1e-5, 1e-6));  // fp32 statistics of the bf16 values
  EXPECT_TRUE(all_close(var, r.var, 1e-5, 1e-6));
  k.run(BatchNormBackward{g, x.ptr(), dy.ptr(), gamma.data(), mean.data(), var.data(), dx.ptr(),
                          dgamma.data(), dbeta.data(), DType::kBF16});
  const auto gr = ref::batch_norm_backward(g, x.f64(), dy.f64(), to_f64(gamma));
  EXPECT_TRUE(all_close(dx.values(), gr.dx, kRel, 1e-3));
  EXPECT_TRUE(all_close(dgamma, gr.dgamma, 1e-4, 1e-4));
  EXPECT_TRUE(all_close(dbeta, gr.dbeta, 1e-5, 1e-5));
  Bf16 yi(n);
  k.run(BatchNormForwardInference{g, x.ptr(), gamma.data(), beta.data(), mean.data(), var.data(),
                                  yi.ptr(), DType::kBF16});
  EXPECT_TRUE(all_close(yi.values(), r.y, kRel, 1e-3));
}

TEST_F(Bf16Kernels, ElementwiseMatchReference) {
  const int64_t n = 100003;  // several parallel chunks and a ragged tail
  Bf16 a(random_floats(n, 501, -3.0f, 3.0f)), b(random_floats(n, 502)), y(n), dx(n);
  k.run(ReluForward{n, a.ptr(), y.ptr(), DType::kBF16});
  EXPECT_EQ(y.bits, Bf16([&] {
                      auto v = a.values();
                      for (float& e : v) e = e < 0 ? 0 : e;
                      return v;
                    }())
                        .bits);
  k.run(ReluBackward{n, y.ptr(), b.ptr(), dx.ptr(), DType::kBF16});
  const auto yv = y.values();
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(dx.bits[i], yv[i] > 0 ? b.bits[i] : 0) << i;
  ref::Vec sum = a.f64();
  const ref::Vec b64 = b.f64();
  for (int64_t i = 0; i < n; ++i) sum[i] += b64[i];
  k.run(AddForward{n, a.ptr(), b.ptr(), y.ptr(), DType::kBF16});
  EXPECT_TRUE(all_close(y.values(), sum, 4e-3, 0.0));
  Bf16 acc = a;
  k.run(Accumulate{n, b.ptr(), acc.ptr(), DType::kBF16});
  EXPECT_EQ(acc.bits, y.bits);  // y += x is a + b, rounded once
  k.run(Scale{n, 0.5f, acc.ptr(), DType::kBF16});
  EXPECT_TRUE(all_close(
      acc.values(),
      [&] {
        ref::Vec h = to_f64(y.values());
        for (double& e : h) e *= 0.5;
        return h;
      }(),
      0.0, 0.0));
  k.run(GeluForward{n, a.ptr(), y.ptr(), DType::kBF16});
  EXPECT_TRUE(all_close(y.values(), ref::gelu_forward(a.f64()), kRel, 1e-4));
  k.run(GeluBackward{n, a.ptr(), b.ptr(), dx.ptr(), DType::kBF16});
  EXPECT_TRUE(all_close(dx.values(), ref::gelu_backward(a.f64(), b.f64()), kRel, 1e-4));
  // Poison mode's NaN fill stays NaN in bf16.
  k.run(Fill{n, NAN, y.ptr(), DType::kBF16});
  for (float v : y.values()) ASSERT_TRUE(std::isnan(v));
  // Dropout draws the fp32 kernel's mask; kept values are x / keep rounded once.
  std::vector<uint8_t> mask(n);
  k.run(DropoutForward{n, 0.25f, 7, 11, a.ptr(), y.ptr(), mask.data(), DType::kBF16});
  std::vector<float> y32(n);
  std::vector<uint8_t> mask32(n);
  const auto av = a.values();
  k.run(DropoutForward{n, 0.25f, 7, 11, av.data(), y32.data(), mask32.data()});
  EXPECT_EQ(mask, mask32);
  EXPECT_EQ(y.bits, Bf16(y32).bits);
  k.run(DropoutBackward{n, 0.25f, b.ptr(), mask.data(), dx.ptr(), DType::kBF16});
  const auto bv = b.values(), dxv = dx.values();
  for (int64_t i = 0; i < n; i += 997) {
    ASSERT_EQ(dxv[i], mask[i] ? Bf16(std::vector<float>{bv[i] / 0.75f}).values()[0] : 0.0f) << i;
  }
}

// The elementwise kernels widen a stage at a time (Note [Staged bf16 elementwise kernels]); each
// output is still the fp32 kernel's on the widened inputs, rounded once, bit for bit, across
// parallel chunks and a ragged last stage, in place too.
TEST_F(Bf16Kernels, ElementwiseAreTheFp32KernelsOnWidenedInputsRoundedOnce) {
  const int64_t n = 3 * cpu::kParallelGrain + 1234;
  Bf16 a(random_floats(n, 521, -4.0f, 4.0f)), b(random_floats(n, 522)), y(n), dx(n);
  const auto av = a.values(), bv = b.values();
  std::vector<float> y32(n), dx32(n);
  auto same = [&](const Bf16& got, const std::vector<float>& fp32, const char* what) {
    ASSERT_EQ(got.bits, Bf16(fp32).bits) << what;
  };
  k.run(ReluForward{n, a.ptr(), y.ptr(), DType::kBF16});
  k.run(ReluForward{n, av.data(), y32.data()});
  same(y, y32, "relu");
  k.run(ReluBackward{n, a.ptr(), b.ptr(), dx.ptr(), DType::kBF16});
  k.run(ReluBackward{n, av.data(), bv.data(), dx32.data()});
  same(dx, dx32, "relu backward");
  k.run(AddForward{n, a.ptr(), b.ptr(), y.ptr(), DType::kBF16});
  k.run(AddForward{n, av.data(), bv.data(), y32.data()});
  same(y, y32, "add");
  Bf16 acc = b;
  std::vector<float> acc32 = bv;
  k.run(Accumulate{n, a.ptr(), acc.ptr(), DType::kBF16});
  k.run(Accumulate{n, av.data(), acc32.data()});
  same(acc, acc32, "accumulate");
  Bf16 scaled = a;
  std::vector<float> scaled32 = av;
  k.run(Scale{n, 0.3f, scaled.ptr(), DType::kBF16});
  k.run(Scale{n, 0.3f, scaled32.data()});
  same(scaled, scaled32, "scale");
  std::vector<uint8_t> mask(n), mask32(n);
  k.run(DropoutForward{n, 0.3f, 5, 1000, a.ptr(), y.ptr(), mask.data(), DType::kBF16});
  k.run(DropoutForward{n, 0.3f, 5, 1000, av.data(), y32.data(), mask32.data()});
  ASSERT_EQ(mask, mask32);
  same(y, y32, "dropout");
  k.run(DropoutBackward{n, 0.3f, b.ptr(), mask.data(), dx.ptr(), DType::kBF16});
  k.run(DropoutBackward{n, 0.3f, bv.data(), mask.data(), dx32.data()});
  same(dx, dx32, "dropout backward");
  k.run(GeluForward{n, a.ptr(), y.ptr(), DType::kBF16});
  k.run(GeluForward{n, av.data(), y32.data()});
  same(y, y32, "gelu");
  k.run(GeluBackward{n, a.ptr(), b.ptr(), dx.ptr(), DType::kBF16});
  k.run(GeluBackward{n, av.data(), bv.data(), dx32.data()});
  same(dx, dx32, "gelu backward");
  Bf16 inplace = b;
  k.run(GeluBackward{n, a.ptr(), inplace.ptr(), inplace.ptr(), DType::kBF16});
  EXPECT_EQ(inplace.bits, dx.bits);
}

TEST_F(Bf16Kernels, SoftmaxCrossEntropyKeepsAnFp32Loss) {
  const int64_t n = 6, classes = 1000;
  Bf16 logits(random_floats(n * classes, 601, -4.0f, 4.0f)), probs(n * classes);
  Bf16 dlogits(n * classes);
  const std::vector<int32_t> labels = {0, 17, 999, 3, -1, 512};
  float loss = NAN;
  int32_t correct = -1;
  k.run(SoftmaxCrossEntropyForward{n, classes, logits.ptr(), labels.data(), &loss, probs.ptr(),
                                   &correct, 0.0f, DType::kBF16});
  std::vector<int32_t> kept_labels;
  ref::Vec kept;
  for (int64_t i = 0; i < n; ++i) {
    if (labels[i] < 0) continue;
    kept_labels.push_back(labels[i]);
    const ref::Vec l64 = logits.f64();
    kept.insert(kept.end(), l64.begin() + i * classes, l64.begin() + (i + 1) * classes);
  }
  const auto r =
      ref::softmax_ce(static_cast<int64_t>(kept_labels.size()), classes, kept, kept_labels);
  // The loss is fp32 math on the bf16 logits, divided by the 6 rows (divisor 0).
  EXPECT_NEAR(loss, r.loss * 5.0 / 6.0, 1e-5 * std::fabs(r.loss));
  k.run(SoftmaxCrossEntropyBackward{n, classes, 1.0f, probs.ptr(), labels.data(), dlogits.ptr(),
                                    0.0f, DType::kBF16});
  const auto pv = probs.values(), dv = dlogits.values();
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t j = 0; j < classes; ++j) {
      const double expect =
          labels[i] < 0 ? 0.0 : (pv[i * classes + j] - (j == labels[i] ? 1.0 : 0.0)) / n;
      ASSERT_NEAR(dv[i * classes + j], expect, 4e-3 * std::fabs(expect) + 1e-9) << i << "," << j;
    }
  }
}

// The bf16 loss reads and writes bf16 directly (Note [Exponentials of bf16 logits]); its bits are
// still the fp32 kernel's on the widened logits, its probabilities and gradients rounded once.
// Rows wide enough to repeat bit patterns (the cache's hits), one without a label, one whose
// logits are all equal, and a second call (the cache's entries of the first must not leak).
TEST_F(Bf16Kernels, SoftmaxCrossEntropyIsTheFp32KernelOnWidenedLogitsRoundedOnce) {
  const int64_t n = 7, classes = 5003;
  auto raw = random_floats(n * classes, 611, -6.0f, 6.0f);
  for (int64_t j = 0; j < classes; ++j) raw[3 * classes + j] = 1.5f;  // a flat row
  const std::vector<int32_t> labels = {0, 4999, -1, 3, 5002, 17, 2500};
  for (float scale : {1.0f, 0.25f}) {
    std::vector<float> scaled(raw);
    for (float& v : scaled) v *= scale;
    Bf16 logits(scaled), probs(n * classes), dlogits(n * classes);
    float loss = NAN;
    int32_t correct = -1;
    k.run(SoftmaxCrossEntropyForward{n, classes, logits.ptr(), labels.data(), &loss, probs.ptr(),
                                     &correct, 0.0f, DType::kBF16});
    const auto wide = logits.values();
    std::vector<float> probs32(n * classes), dlogits32(n * classes);
    float loss32 = NAN;
    int32_t correct32 = -1;
    k.run(SoftmaxCrossEntropyForward{n, classes, wide.data(), labels.data(), &loss32,
                                     probs32.data(), &correct32, 0.0f});
    EXPECT_EQ(std::bit_cast<uint32_t>(loss), std::bit_cast<uint32_t>(loss32)) << scale;
    EXPECT_EQ(correct, correct32);
    ASSERT_EQ(probs.bits, Bf16(probs32).bits) << scale;
    k.run(SoftmaxCrossEntropyBackward{n, classes, 0.5f, probs.ptr(), labels.data(), dlogits.ptr(),
                                      4.0f, DType::kBF16});
    const auto pw = probs.values();
    k.run(SoftmaxCrossEntropyBackward{n, classes, 0.5f, pw.data(), labels.data(), dlogits32.data(),
                                      4.0f});
    ASSERT_EQ(dlogits.bits, Bf16(dlogits32).bits) << scale;
  }
}

TEST_F(Bf16Kernels, EmbeddingAndLayerNormMatchReference) {
  const int64_t n = 2, t = 9, c = 24, vocab = 50, context = 16;
  std::vector<int32_t> tokens(n * t);
  for (int64_t i = 0; i < n * t; ++i) tokens[i] = static_cast<int32_t>((i * 7) % vocab);
  const auto wte = random_floats(vocab * c, 701), wpe = random_floats(context * c, 702);
  Bf16 y(n * t * c), dy(random_floats(n * t * c, 703));
  k.run(EmbeddingForward{n, t, c, vocab, tokens.data(), wte.data(), wpe.data(), y.ptr(), nullptr,
                         DType::kBF16});
  EXPECT_TRUE(all_close(
      y.values(), ref::embedding_forward(n, t, c, tokens, to_f64(wte), to_f64(wpe)), kRel, kAbs));
  std::vector<float> dwte(vocab * c, NAN), dwpe(context * c, NAN);
  k.run(EmbeddingBackward{n, t, c, vocab, context, tokens.data(), dy.ptr(), dwte.data(),
                          dwpe.data(), false, nullptr, DType::kBF16});
  const auto eg = ref::embedding_backward(n, t, c, vocab, context, tokens, dy.f64());
  EXPECT_TRUE(all_close(dwte, eg.dwte, 1e-6, 1e-6));
  EXPECT_TRUE(all_close(dwpe, eg.dwpe, 1e-6, 1e-6));

  const LayerNormGeom g{.rows = 37, .c = 100};
  Bf16 x(random_floats(g.rows * g.c, 711, -2.0f, 2.0f)), ly(g.rows * g.c);
  Bf16 ldy(random_floats(g.rows * g.c, 712)), ldx(g.rows * g.c);
  const auto gamma = random_floats(g.c, 713, 0.5f, 1.5f), beta = random_floats(g.c, 714);
  std::vector<float> mean(g.rows), rstd(g.rows), dgamma(g.c), dbeta(g.c);
  k.run(LayerNormForward{g, x.ptr(), gamma.data(), beta.data(), ly.ptr(), mean.data(), rstd.data(),
                         DType::kBF16});
  const auto lr = ref::layer_norm_forward(g, x.f64(), to_f64(gamma), to_f64(beta));
  EXPECT_TRUE(all_close(ly.values(), lr.y, kRel, 1e-3));
  EXPECT_TRUE(all_close(rstd, lr.rstd, 1e-5, 1e-6));
  k.run(LayerNormBackward{g, x.ptr(), ldy.ptr(), gamma.data(), mean.data(), rstd.data(), ldx.ptr(),
                          dgamma.data(), dbeta.data(), DType::kBF16});
  const auto lg = ref::layer_norm_backward(g, x.f64(), ldy.f64(), to_f64(gamma));
  EXPECT_TRUE(all_close(ldx.values(), lg.dx, kRel, 1e-3));
  EXPECT_TRUE(all_close(dgamma, lg.dgamma, 1e-4, 1e-4));
  EXPECT_TRUE(all_close(dbeta, lg.dbeta, 1e-5, 1e-5));
  // In place (dx = dy) gives the same bits.
  Bf16 inplace = ldy;
  k.run(LayerNormBackward{g, x.ptr(), inplace.ptr(), gamma.data(), mean.data(), rstd.data(),
                          inplace.ptr(), dgamma.data(), dbeta.data(), DType::kBF16});
  EXPECT_EQ(inplace.bits, ldx.bits);
}

TEST_F(Bf16Kernels, AttentionMatchesReference) {
  const AttentionGeom g{.n = 2, .t = 70, .heads = 3, .c = 48};
  Bf16 qkv(random_floats(g.n * g.t * 3 * g.c, 801)), y(g.n * g.t * g.c);
  Bf16 probs(g.n * g.heads * g.t * g.t), dy(random_floats(g.n * g.t * g.c, 802));
  Bf16 dqkv(g.n * g.t * 3 * g.c);
  k.run(AttentionForward{
      .g = g, .qkv = qkv.ptr(), .y = y.ptr(), .probs = probs.ptr(), .dtype = DType::kBF16});
  const auto r = ref::attention_forward(g, qkv.f64(), nullptr);
  EXPECT_TRUE(all_close(y.values(), r.y, kRel, 1e-3));
  EXPECT_TRUE(all_close(probs.values(), r.probs, kRel, 1e-6));
  k.run(AttentionBackward{.g = g,
                          .qkv = qkv.ptr(),
                          .probs = probs.ptr(),
                          .dy = dy.ptr(),
                          .dqkv = dqkv.ptr(),
                          .dtype = DType::kBF16});
  // The backward reads the probabilities as bf16 stored them (2^-9 each): a little looser.
  EXPECT_TRUE(all_close(dqkv.values(), ref::attention_backward(g, qkv.f64(), dy.f64(), nullptr),
                        2e-2, 2e-3));
}

// Prints (never asserts) bf16 against fp32 kernel times; run with
// --gtest_also_run_disabled_tests.
TEST_F(Bf16Kernels, DISABLED_PrintTimes) {
  auto time = [&](auto args) {
    k.run(args);
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < 5; ++i) k.run(args);
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / 5;
  };
  const ConvGeom g{
      .n = 64, .c = 64, .h = 32, .w = 32, .k = 64, .r = 3, .s = 3, .pad_h = 1, .pad_w = 1};
  const auto x = random_floats(g.n * g.c * g.h * g.w, 1), w = random_floats(64 * 64 * 9, 2);
  std::vector<float> y(g.n * g.k * g.h * g.w);
  Bf16 xb(x), wb(w), yb(y.size());
  const double cf = time(ConvForward{.g = g, .x = x.data(), .w = w.data(), .y = y.data()});
  const double cb =
      time(ConvForward{.g = g, .x = xb.ptr(), .w = wb.ptr(), .y = yb.ptr(), .dtype = DType::kBF16});
  const LinearGeom lg{2048, 384, 1536, true};
  const auto lx = random_floats(lg.m * lg.k, 3), lw = random_floats(lg.k * lg.n, 4);
  std::vector<float> ly(lg.m * lg.n);
  Bf16 lxb(lx), lwb(lw), lyb(ly.size());
  const double lf = time(LinearForward{.g = lg, .x = lx.data(), .w = lw.data(), .y = ly.data()});
  const double lb = time(LinearForward{
      .g = lg, .x = lxb.ptr(), .w = lwb.ptr(), .y = lyb.ptr(), .dtype = DType::kBF16});
  std::printf(
      "conv 64x64x32x32 3x3 fwd: fp32 %.2f ms, bf16 %.2f ms; linear 2048x384->1536 fwd: "
      "fp32 %.2f ms, bf16 %.2f ms (%d threads)\n",
      cf * 1e3, cb * 1e3, lf * 1e3, lb * 1e3, kThreads);
}

}  // namespace
}  // namespace ferry
