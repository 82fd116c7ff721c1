// DataLoader with data.scales (Note [Per-batch sides] in trainer/data/loader.h): the side of
// each global batch is a pure function of (seed, epoch, batch) whatever the worker count, rank or
// prefetch; a batch holds the dataset's draw at its side and says its shape; sources that cannot
// resize, and sides out of range, are refused naming the key.
#include <algorithm>
#include <cstring>
#include <map>
#include <set>
#include <vector>

#include <gtest/gtest.h>

#include "common/error.h"
#include "trainer/data/loader.h"

namespace ferry {
namespace {

const std::vector<int64_t> kSides{8, 12, 16, 20};

std::shared_ptr<const Dataset> synthetic(int64_t samples = 64) {
  return make_synthetic_dataset(Shape{3, 16, 16}, 10, samples, 7);
}

LoaderOptions scaled(int64_t batch, int world = 1, int rank = 0, int workers = 1) {
  LoaderOptions o;
  o.batch_size = batch;
  o.seed = 3;
  o.world_size = world;
  o.rank = rank;
  o.workers = workers;
  o.scales = kSides;
  return o;
}

TEST(LoaderScales, SideIsTheSameForEveryRankWorkerCountAndPrefetch) {
  DataLoader one(synthetic(), scaled(8));
  LoaderOptions o = scaled(4, /*world=*/2, /*rank=*/1, /*workers=*/3);
  o.prefetch = 3;
  DataLoader other(synthetic(), o);
  std::map<int64_t, int> seen;
  for (int64_t e = 0; e < 3; ++e) {
    for (int64_t b = 0; b < one.batches_per_epoch(); ++b) {
      const LoaderPosition p{e, b};
      const int64_t side = one.side(p);
      EXPECT_EQ(other.side(p), side) << "epoch " << e << " batch " << b;
      EXPECT_TRUE(std::count(kSides.begin(), kSides.end(), side)) << side;
      ++seen[side];
      EXPECT_EQ(one.input_shape(p), (Shape{8, 3, side, side}));
      EXPECT_EQ(other.input_shape(p), (Shape{4, 3, side, side}));
    }
  }
  EXPECT_EQ(seen.size(), kSides.size()) << "every side is drawn in 24 batches";
  // next() delivers what input_shape() announced, at every position, on both loaders.
  for (int step = 0; step < 12; ++step) {
    const LoaderPosition p = one.position();
    ASSERT_EQ(other.position(), p);
    Batch a = one.next();
    Batch b = other.next();
    EXPECT_EQ(a.shape(), one.input_shape(p)) << "step " << step;
    EXPECT_EQ(b.shape(), other.input_shape(p)) << "step " << step;
    EXPECT_EQ(a.shape()[2], b.shape()[2]);
  }
}

TEST(LoaderScales, AnotherSeedDrawsAnotherSequenceAndTheSameSeedTheSame) {
  DataLoader a(synthetic(), scaled(8));
  DataLoader again(synthetic(), scaled(8));
  LoaderOptions o = scaled(8);
  o.seed = 4;
  DataLoader b(synthetic(), o);
  int differ = 0;
  for (int64_t e = 0; e < 4; ++e) {
    for (int64_t k = 0; k < a.batches_per_epoch(); ++k) {
      EXPECT_EQ(a.side({e, k}), again.side({e, k}));
      differ += a.side({e, k}) != b.side({e, k});
    }
  }
  EXPECT_GT(differ, 0);
}

TEST(LoaderScales, RowsAreTheDatasetsDrawAtTheBatchSide) {
  auto ds = synthetic();
  // Ranks' slices concatenate to the one-rank batch, at the same side.
  DataLoader one(ds, scaled(8));
  DataLoader r0(ds, scaled(4, 2, 0, 2));
  DataLoader r1(ds, scaled(4, 2, 1, 1));
  for (int step = 0; step < 6; ++step) {
    const LoaderPosition p = one.position();
    Batch b = one.next();
    Batch h0 = r0.next();
    Batch h1 = r1.next();
    const int64_t side = one.side(p);
    const int64_t row = 3 * side * side;
    const std::vector<int64_t> idx = one.indices(p);
    std::vector<float> want(static_cast<size_t>(row));
    for (size_t i = 0; i < idx.size(); ++i) {
      int32_t label = -1;
      ds->read_at(idx[i], p.epoch, side, want.data(), &label);
      EXPECT_EQ(std::memcmp(b.images() + i * row, want.data(), row * sizeof(float)), 0)
          << "step " << step << " row " << i;
      EXPECT_EQ(b.labels()[i], label);
      const Batch& half = i < 4 ? h0 : h1;
      EXPECT_EQ(std::memcmp(half.images() + (i % 4) * row, want.data(), row * sizeof(float)), 0)
          << "rank slice, step " << step << " row " << i;
    }
  }
}

TEST(LoaderScales, BuffersHoldTheLargestSideAndEverySideIsAShape) {
  DataLoader l(synthetic(), scaled(8));
  EXPECT_EQ(l.batch_shape(), (Shape{8, 3, 20, 20}));
  const std::vector<Shape> shapes = l.input_shapes();
  ASSERT_EQ(shapes.size(), kSides.size());
  for (size_t k = 0; k < kSides.size(); ++k) {
    EXPECT_EQ(shapes[k], (Shape{8, 3, kSides[k], kSides[k]}));
  }
}

TEST(LoaderScales, WithoutScalesTheShapeIsTheDatasets) {
  LoaderOptions o = scaled(8);
  o.scales.clear();
  DataLoader l(synthetic(), o);
  EXPECT_EQ(l.side({0, 0}), 0);
  Batch b = l.next();
  EXPECT_EQ(b.shape(), (Shape{8, 3, 16, 16}));
}

// A source with one fixed size (idx, cifar10 behave alike: max_side() == 0).
class FixedDataset : public Dataset {
 public:
  int64_t size() const override { return 16; }
  Shape image_shape() const override { return Shape{1, 4, 4}; }
  int64_t classes() const override { return 2; }
  std::string describe() const override { return "fixed"; }
  int32_t get(int64_t, float* pixels) const override {
    std::fill(pixels, pixels + 16, 0.5f);
    return 0;
  }
};

void expect_config_error(std::shared_ptr<const Dataset> ds, LoaderOptions o,
                         const std::string& text) {
  try {
    DataLoader l(std::move(ds), o);
    ADD_FAILURE() << "no error for " << text;
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("data.scales"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(text), std::string::npos) << e.what();
  }
}

TEST(LoaderScales, RefusesSourcesThatCannotResizeAndSidesOutOfRange) {
  expect_config_error(std::make_shared<FixedDataset>(), scaled(4), "cannot make its images");
  LoaderOptions o = scaled(4);
  o.scales = {16, 0};
  expect_config_error(synthetic(), o, "side 0");
  o.scales = {kMaxScaleSide + 1};
  expect_config_error(synthetic(), o, "side 16385");
}

}  // namespace
}  // namespace ferry
