// DataLoader with data.scales (Note [Per-batch sides] in trainer/data/loader.h): the side of
// each global batch is a pure function of (seed, epoch, batch) whatever the worker count, rank or
// prefetch; a batch holds the dataset's draw at its side and says its shape; sources that cannot
// resize, and sides out of range, are refused naming the key.
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <vector>

#include <gtest/gtest.h>

#include "common/error.h"
#include "device/host_pool.h"
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

// The synthetic dataset, counting the rows drawn at each side.
class CountingDataset : public Dataset {
 public:
  explicit CountingDataset(std::shared_ptr<const Dataset> inner) : inner_(std::move(inner)) {}
  int64_t size() const override { return inner_->size(); }
  Shape image_shape() const override { return inner_->image_shape(); }
  int64_t classes() const override { return inner_->classes(); }
  std::string describe() const override { return "counting " + inner_->describe(); }
  int32_t get(int64_t index, float* pixels) const override { return inner_->get(index, pixels); }
  int64_t max_side() const override { return inner_->max_side(); }
  void read_at(int64_t index, int64_t epoch, int64_t side, float* pixels,
               int32_t* label) const override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      ++rows_[side];
    }
    inner_->read_at(index, epoch, side, pixels, label);
  }
  std::map<int64_t, int64_t> rows() const {
    std::lock_guard<std::mutex> lock(mu_);
    return rows_;
  }

 private:
  std::shared_ptr<const Dataset> inner_;
  mutable std::mutex mu_;
  mutable std::map<int64_t, int64_t> rows_;
};

// Aligned host memory, recording the size of every block asked for.
class RecordingAllocator : public PinnedAllocator {
 public:
  void* allocate(uint64_t bytes) override {
    sizes.push_back(bytes);
    return std::aligned_alloc(64, std::max<uint64_t>(bytes, 64));
  }
  void deallocate(void* ptr, uint64_t) override { std::free(ptr); }
  std::vector<uint64_t> sizes;
};

// Note [Batches too large to train]: sides whose batch input exceeds max_input_bytes get no
// buffer space and are never drawn; their batches come out with shape and size only, in the
// order drawn. A shape the consumer skips is not drawn from the next batch prepared on.
TEST(LoaderScales, BatchesOverTheInputLimitAreNeitherAllocatedNorGenerated) {
  auto counting = std::make_shared<CountingDataset>(synthetic());
  RecordingAllocator allocator;
  LoaderOptions o = scaled(8);
  o.max_input_bytes = 8 * 3 * 12 * 12 * sizeof(float);  // sides 8 and 12 fit, 16 and 20 do not
  o.allocator = &allocator;
  {
    DataLoader l(counting, o);
    DataLoader reference(synthetic(), scaled(8));
    EXPECT_EQ(l.batch_shape(), (Shape{8, 3, 12, 12}));
    ASSERT_FALSE(allocator.sizes.empty());
    for (uint64_t bytes : allocator.sizes) EXPECT_LT(bytes, 8u * 3 * 16 * 16 * sizeof(float));
    int over = 0;
    for (int step = 0; step < 16; ++step) {
      const LoaderPosition p = l.position();
      Batch b = l.next();
      Batch want = reference.next();
      const int64_t side = l.side(p);
      EXPECT_EQ(b.shape(), want.shape()) << "step " << step;
      EXPECT_EQ(b.size(), 8);
      EXPECT_EQ(b.generated(), side <= 12) << "step " << step << " side " << side;
      if (b.generated()) {
        EXPECT_EQ(std::memcmp(b.images(), want.images(), b.shape().numel() * sizeof(float)), 0);
      }
      over += side > 12;
    }
    EXPECT_GT(over, 0) << "the draw reaches sides 16 and 20";
    EXPECT_EQ(counting->rows().count(16), 0u);
    EXPECT_EQ(counting->rows().count(20), 0u);
    EXPECT_GT(counting->rows().at(8), 0);

    // Skipped by the consumer: side 8 is no longer drawn (from a fresh prefetch on).
    l.skip_shape(Shape{8, 3, 8, 8});
    l.seek(l.position());
    const int64_t drawn = counting->rows().at(8);
    for (int step = 0; step < 16; ++step) {
      const LoaderPosition p = l.position();
      Batch b = l.next();
      EXPECT_EQ(b.generated(), l.side(p) == 12) << "step " << step;
    }
    EXPECT_EQ(counting->rows().at(8), drawn);
  }
  // Skipped from the start (LoaderOptions::skip_shapes): not in the buffers either.
  auto fresh = std::make_shared<CountingDataset>(synthetic());
  o.skip_shapes = {Shape{8, 3, 12, 12}};
  allocator.sizes.clear();
  DataLoader l(fresh, o);
  EXPECT_EQ(l.batch_shape(), (Shape{8, 3, 8, 8}));
  for (uint64_t bytes : allocator.sizes) EXPECT_LT(bytes, 8u * 3 * 12 * 12 * sizeof(float));
  for (int step = 0; step < 16; ++step) {
    const LoaderPosition p = l.position();
    EXPECT_EQ(l.next().generated(), l.side(p) == 8) << "step " << step;
  }
  EXPECT_EQ(fresh->rows().count(12), 0u);
}

}  // namespace
}  // namespace ferry
