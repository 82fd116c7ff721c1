// Softmax cross-entropy against the float64 reference and finite differences: loss, saved
// probabilities, the first-argmax accuracy count, large logits, and bad labels.
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

TEST(SoftmaxCrossEntropyKernel, LabelOutsideTheClassesIsADataError) {
  test::KernelRunner k;
  const std::vector<float> logits(6, 0.0f);
  float loss;
  std::vector<float> probs(6);
  for (int32_t bad : {-1, 3}) {
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
