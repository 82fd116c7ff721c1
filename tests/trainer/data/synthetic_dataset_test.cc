// The synthetic task: deterministic per (seed, index), any shape, balanced labels, and the
// label really is in the pixels (the grating orientation recovered from image gradients).
#include <chrono>
#include <cmath>
#include <numbers>
#include <vector>

#include <gtest/gtest.h>

#include "common/error.h"
#include "trainer/data/dataset.h"

namespace ferry {
namespace {

std::vector<float> sample(const Dataset& ds, int64_t index, int32_t* label = nullptr) {
  std::vector<float> pixels(static_cast<size_t>(ds.image_shape().numel()));
  const int32_t l = ds.get(index, pixels.data());
  if (label) *label = l;
  return pixels;
}

TEST(SyntheticDataset, DeterministicPerSeedAndIndex) {
  auto a = make_synthetic_dataset(Shape{3, 32, 32}, 10, 1000, 7);
  auto b = make_synthetic_dataset(Shape{3, 32, 32}, 10, 1000, 7);
  auto c = make_synthetic_dataset(Shape{3, 32, 32}, 10, 1000, 8);
  int32_t la = -1, lb = -2;
  EXPECT_EQ(sample(*a, 123, &la), sample(*b, 123, &lb));
  EXPECT_EQ(la, lb);
  EXPECT_NE(sample(*a, 123), sample(*c, 123));
  EXPECT_NE(sample(*a, 123), sample(*a, 124));
  // Reading in another order, or again, gives the same bytes (no hidden state).
  const std::vector<float> first = sample(*a, 5);
  sample(*a, 999);
  EXPECT_EQ(sample(*a, 5), first);
  EXPECT_EQ(a->size(), 1000);
  EXPECT_EQ(a->classes(), 10);
  EXPECT_EQ(a->image_shape(), (Shape{3, 32, 32}));
}

TEST(SyntheticDataset, AnyShapeInUnitRange) {
  for (const Shape& chw :
       {Shape{1, 28, 28}, Shape{3, 32, 32}, Shape{2, 5, 7}, Shape{3, 224, 224}}) {
    auto ds = make_synthetic_dataset(chw, 10, 50, 1);
    double sum = 0, sum2 = 0;
    int64_t count = 0;
    for (int64_t i = 0; i < 20; ++i) {
      for (float v : sample(*ds, i)) {
        ASSERT_GE(v, 0.0f) << chw.str();
        ASSERT_LE(v, 1.0f) << chw.str();
        sum += v;
        sum2 += double(v) * v;
        ++count;
      }
    }
    const double mean = sum / count, stddev = std::sqrt(sum2 / count - mean * mean);
    EXPECT_NEAR(mean, 0.5, 0.05) << chw.str();
    EXPECT_GT(stddev, 0.15) << chw.str();  // not a flat image
    EXPECT_LT(stddev, 0.4) << chw.str();
  }
}

TEST(SyntheticDataset, LabelsBalanced) {
  auto ds = make_synthetic_dataset(Shape{1, 4, 4}, 10, 5000, 3);
  std::vector<int> counts(10, 0);
  std::vector<float> pixels(16);
  for (int64_t i = 0; i < ds->size(); ++i) {
    const int32_t label = ds->get(i, pixels.data());
    ASSERT_GE(label, 0);
    ASSERT_LT(label, 10);
    ++counts[label];
  }
  for (int c = 0; c < 10; ++c) {
    EXPECT_GT(counts[c], 400) << c;
    EXPECT_LT(counts[c], 600) << c;
  }
}

// Orientation of the dominant gradient, in [0, pi), from the structure tensor of channel 0.
double gradient_orientation(const std::vector<float>& pixels, int64_t h, int64_t w) {
  double jxx = 0, jyy = 0, jxy = 0;
  for (int64_t y = 1; y + 1 < h; ++y) {
    for (int64_t x = 1; x + 1 < w; ++x) {
      const double gx = pixels[y * w + x + 1] - pixels[y * w + x - 1];
      const double gy = pixels[(y + 1) * w + x] - pixels[(y - 1) * w + x];
      jxx += gx * gx;
      jyy += gy * gy;
      jxy += gx * gy;
    }
  }
  double theta = 0.5 * std::atan2(2 * jxy, jxx - jyy);
  if (theta < 0) theta += std::numbers::pi;
  return theta;
}

TEST(SyntheticDataset, LabelIsTheGratingOrientation) {
  // A hand-made classifier (nearest class orientation) must beat chance (10%) by far: the
  // label is in the pixels, for any seed. With random labels this would score ~10%.
  for (uint64_t seed : {1ull, 2ull}) {
    auto ds = make_synthetic_dataset(Shape{3, 32, 32}, 10, 400, seed);
    int correct = 0;
    for (int64_t i = 0; i < ds->size(); ++i) {
      int32_t label = -1;
      const std::vector<float> pixels = sample(*ds, i, &label);
      const double step = std::numbers::pi / 10;
      const int guess =
          static_cast<int>(std::lround(gradient_orientation(pixels, 32, 32) / step)) % 10;
      correct += guess == label;
    }
    EXPECT_GT(correct, 0.8 * ds->size()) << "seed " << seed;
  }
}

TEST(SyntheticDataset, LargeImagesAreCheap) {
  auto ds = make_synthetic_dataset(Shape{3, 224, 224}, 1000, 1'000'000, 1);
  std::vector<float> pixels(3 * 224 * 224);
  const auto t0 = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < 8; ++i) ds->get(i * 100'003, pixels.data());
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(ms / 8, 50.0) << "ms per 224x224 sample";  // measured ~1-3 ms
}

TEST(SyntheticDataset, BadArgumentsAreConfigErrors) {
  EXPECT_THROW(make_synthetic_dataset(Shape{32, 32}, 10, 10, 0), ConfigError);
  EXPECT_THROW(make_synthetic_dataset(Shape{3, 0, 32}, 10, 10, 0), ConfigError);
  EXPECT_THROW(make_synthetic_dataset(Shape{3, 32, 32}, 0, 10, 0), ConfigError);
  EXPECT_THROW(make_synthetic_dataset(Shape{3, 32, 32}, 10, 0, 0), ConfigError);
}

TEST(OpenDataset, PicksTheSourceAndNamesTheNearest) {
  DatasetSpec spec;
  spec.source = "synthetic";
  spec.image_shape = Shape{1, 8, 8};
  spec.classes = 4;
  spec.samples = 12;
  auto ds = open_dataset(spec);
  EXPECT_EQ(ds->size(), 12);
  EXPECT_EQ(ds->classes(), 4);
  spec.source = "cifar";
  try {
    open_dataset(spec);
    FAIL() << "expected ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("did you mean 'cifar10'"), std::string::npos) << e.what();
  }
  spec.source = "idx";
  EXPECT_THROW(open_dataset(spec), ConfigError);  // no path
}

}  // namespace
}  // namespace ferry
