// Softmax cross-entropy against the float64 reference and finite differences: loss, saved
// probabilities, the first-argmax accuracy count, large logits, padding rows, and bad labels.
#include <gtest/gtest.h>

#include <random>

#include "common/error.h"
#include "tests/device/cpu/kernel_test_util.h"

namespace ferry {
namespace {

using namespace test;  // kernel_test_util.h: all_close, random_floats, to_f64, ...

constexpr double kRel = 1e-5;
constexpr double kAbs = 1e-6;

std::vector<int32_t> random_labels(int64_t n, int64_t k, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> labels(n);
  for (auto& l : labels) l = std::uniform_int_distribution<int32_t>(0, k - 1)(rng);
  return labels;
}

TEST(SoftmaxCrossEntropyKernel, ForwardAndBackwardMatchReference) {
  test::KernelRunner k;
  struct Shape {
    int64_t n, k;
  };
  uint32_t seed = 1;
  for (const Shape s : {Shape{1, 1}, Shape{1, 10}, Shape{3, 7}, Shape{64, 10}, Shape{33, 100}}) {
    SCOPED_TRACE(fmt::format("N={} K={}", s.n, s.k));
    const auto logits = random_floats(s.n * s.k, seed++, -4.0f, 4.0f);
    const auto labels = random_labels(s.n, s.k, seed++);
    float loss = NAN;
    int32_t correct = -1;
    std::vector<float> probs(s.n * s.k, NAN);
    k.run(SoftmaxCrossEntropyForward{s.n, s.k, logits.data(), labels.data(), &loss, probs.data(),
                                     &correct});
    const auto r = ref::softmax_ce(s.n, s.k, to_f64(logits), labels);
    EXPECT_NEAR(loss, r.loss, kAbs + kRel * r.loss);
    EXPECT_TRUE(all_close(probs, r.probs, kRel, kAbs));
    EXPECT_EQ(correct, r.correct);

    const float scale = 0.5f;
    std::vector<float> dlogits(s.n * s.k, NAN);
    k.run(
        SoftmaxCrossEntropyBackward{s.n, s.k, scale, probs.data(), labels.data(), dlogits.data()});
    ref::Vec expect = r.probs;
    for (int64_t i = 0; i < s.n; ++i) expect[i * s.k + labels[i]] -= 1.0;
    for (auto& v : expect) v *= scale / static_cast<double>(s.n);
    EXPECT_TRUE(all_close(dlogits, expect, kRel, kAbs));

    // The gradient of the mean loss by central differences (scale 1 is the plain gradient).
    ref::Vec z = to_f64(logits);
    auto f = [&](const ref::Vec& v) { return ref::softmax_ce(s.n, s.k, v, labels).loss; };
    for (size_t i : test::sample_indices(z.size(), 8, seed)) {
      EXPECT_NEAR(dlogits[i] / scale, test::numeric_partial(f, z, i), 1e-5) << i;
    }
  }
}

TEST(SoftmaxCrossEntropyKernel, AccuracyCountsTheFirstArgmaxAndLargeLogitsStayFinite) {
  test::KernelRunner k;
  // Row 0: tie between classes 1 and 2, label 2: not correct (the first argmax is 1).
  // Row 1: tie, label 1: correct. Row 2: logits of 1000 (exp overflows without the max
  // shift), label 0: correct.
  const std::vector<float> logits = {0, 5, 5, 1, 3, 3, 1000, 999, -1000};
  const std::vector<int32_t> labels = {2, 1, 0};
  float loss = NAN;
  int32_t correct = -1;
  std::vector<float> probs(9);
  k.run(SoftmaxCrossEntropyForward{3, 3, logits.data(), labels.data(), &loss, probs.data(),
                                   &correct});
  EXPECT_EQ(correct, 2);  // rows 1 and 2
  const auto r = ref::softmax_ce(3, 3, to_f64(logits), labels);
  EXPECT_TRUE(std::isfinite(loss));
  EXPECT_NEAR(loss, r.loss, 1e-5);
  EXPECT_TRUE(all_close(probs, r.probs, kRel, kAbs));
  // correct may be null.
  k.run(
      SoftmaxCrossEntropyForward{3, 3, logits.data(), labels.data(), &loss, probs.data(), nullptr});
}

// Padding (Note [Documents as rows] in trainer/data/documents.h): rows labelled -1 add exactly
// nothing, and the total is divided by the given divisor (the labelled rows of a global batch
// over its ranks), so a padded batch gives the loss and gradients of its labelled rows alone.
TEST(SoftmaxCrossEntropyKernel, NegativeLabelsAddNothingAndTheDivisorDividesTheSum) {
  test::KernelRunner k;
  const int64_t n = 9, classes = 13;
  const auto logits = random_floats(n * classes, 41, -3.0f, 3.0f);
  std::vector<int32_t> labels = random_labels(n, classes, 42);
  for (int64_t i : {1, 4, 5, 8}) labels[i] = -1;
  // The labelled rows alone, as a batch of their own.
  std::vector<float> kept_logits;
  std::vector<int32_t> kept_labels;
  for (int64_t i = 0; i < n; ++i) {
    if (labels[i] < 0) continue;
    kept_logits.insert(kept_logits.end(), logits.begin() + i * classes,
                       logits.begin() + (i + 1) * classes);
    kept_labels.push_back(labels[i]);
  }
  const int64_t kept = static_cast<int64_t>(kept_labels.size());
  const auto r = ref::softmax_ce(kept, classes, to_f64(kept_logits), kept_labels);
  for (const float divisor : {static_cast<float>(kept), 2.5f}) {
    SCOPED_TRACE(fmt::format("divisor {}", divisor));
    float loss = NAN;
    int32_t correct = -1;
    std::vector<float> probs(n * classes, NAN), dlogits(n * classes, NAN);
    k.run(SoftmaxCrossEntropyForward{n, classes, logits.data(), labels.data(), &loss, probs.data(),
                                     &correct, divisor});
    const double want = r.loss * static_cast<double>(kept) / divisor;
    EXPECT_NEAR(loss, want, kAbs + kRel * want);
    EXPECT_EQ(correct, r.correct);
    k.run(SoftmaxCrossEntropyBackward{n, classes, 1.0f, probs.data(), labels.data(), dlogits.data(),
                                      divisor});
    int64_t row = 0;
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t j = 0; j < classes; ++j) {
        const float d = dlogits[i * classes + j];
        if (labels[i] < 0) {
          ASSERT_EQ(d, 0.0f) << "padding row " << i;  // exactly, not merely small
          continue;
        }
        const double p = r.probs[row * classes + j] - (j == labels[i] ? 1.0 : 0.0);
        EXPECT_NEAR(d, p / divisor, kAbs) << i << " " << j;
      }
      if (labels[i] >= 0) ++row;
    }
  }
  // Divisor 0 is the row count: the unpadded batch's own mean, bit for bit.
  float loss0 = NAN, loss_rows = NAN;
  std::vector<float> probs(n * classes);
  const auto all = random_labels(n, classes, 43);
  k.run(SoftmaxCrossEntropyForward{n, classes, logits.data(), all.data(), &loss0, probs.data(),
                                   nullptr, 0.0f});
  k.run(SoftmaxCrossEntropyForward{n, classes, logits.data(), all.data(), &loss_rows, probs.data(),
                                   nullptr, static_cast<float>(n)});
  EXPECT_EQ(loss0, loss_rows);
  EXPECT_THROW(k.run(SoftmaxCrossEntropyForward{n, classes, logits.data(), all.data(), &loss0,
                                                probs.data(), nullptr, -1.0f}),
               ConfigError);
}

TEST(SoftmaxCrossEntropyKernel, LabelOutsideTheClassesIsADataError) {
  test::KernelRunner k;
  const std::vector<float> logits(6, 0.0f);
  float loss;
  std::vector<float> probs(6);
  for (int32_t bad : {3, 4}) {
    const std::vector<int32_t> labels = {0, bad};
    try {
      k.run(SoftmaxCrossEntropyForward{2, 3, logits.data(), labels.data(), &loss, probs.data(),
                                       nullptr});
      ADD_FAILURE() << "label " << bad << " accepted";
    } catch (const DataError& e) {
      EXPECT_NE(std::string(e.what()).find("row 1"), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace ferry
