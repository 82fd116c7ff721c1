// DataLoader: order determinism, rank slicing, file order, normalisation, seek/resume, partial
// batches, error propagation, buffers from a PinnedAllocator, and shutdown without hangs.
#include "trainer/data/loader.h"

#include <atomic>
#include <chrono>
#include <set>
#include <thread>

#include <gtest/gtest.h>

#include "common/error.h"

namespace ferry {
namespace {

using Clock = std::chrono::steady_clock;

// Sample i: pixel 0 holds i (exact in float), pixel k > 0 holds k / 64 + channel; label i % 5.
// Throws DataError at `fail_at`; sleeps `delay` per sample.
class IndexDataset : public Dataset {
 public:
  explicit IndexDataset(int64_t n, Shape chw = Shape{2, 2, 2}, int64_t fail_at = -1,
                        std::chrono::milliseconds delay = {}, int32_t bad_label_at = -1)
      : n_(n), chw_(chw), fail_at_(fail_at), delay_(delay), bad_label_at_(bad_label_at) {}
  int64_t size() const override { return n_; }
  Shape image_shape() const override { return chw_; }
  int64_t classes() const override { return 5; }
  std::string describe() const override { return "index dataset"; }
  int32_t get(int64_t index, float* pixels) const override {
    calls_.fetch_add(1);
    if (delay_.count() > 0) std::this_thread::sleep_for(delay_);
    if (index == fail_at_) throw DataError("sample " + std::to_string(index) + " is broken");
    const int64_t plane = chw_[1] * chw_[2];
    for (int64_t k = 0; k < chw_.numel(); ++k) pixels[k] = k / 64.0f + float(k / plane);
    pixels[0] = static_cast<float>(index);
    return index == bad_label_at_ ? 5 : static_cast<int32_t>(index % 5);
  }
  int64_t calls() const { return calls_.load(); }

 private:
  int64_t n_;
  Shape chw_;
  int64_t fail_at_;
  std::chrono::milliseconds delay_;
  int32_t bad_label_at_;
  mutable std::atomic<int64_t> calls_{0};
};

LoaderOptions options(int64_t batch, uint64_t seed = 1) {
  LoaderOptions o;
  o.batch_size = batch;
  o.seed = seed;
  return o;
}

// The dataset indices in `batch` (from pixel 0 of each row).
std::vector<int64_t> indices_of(const Batch& batch, int64_t sample_floats) {
  std::vector<int64_t> out;
  for (int64_t i = 0; i < batch.size(); ++i) {
    out.push_back(static_cast<int64_t>(batch.images()[i * sample_floats]));
  }
  return out;
}

// The indices of the next `count` batches of `loader`.
std::vector<std::vector<int64_t>> take(DataLoader& loader, int count) {
  const int64_t sample = loader.dataset().image_shape().numel();
  std::vector<std::vector<int64_t>> out;
  for (int i = 0; i < count; ++i) out.push_back(indices_of(loader.next(), sample));
  return out;
}

std::shared_ptr<const Dataset> dataset(int64_t n) { return std::make_shared<IndexDataset>(n); }

TEST(DataLoader, SameSeedSameBatchesWhateverThePrefetch) {
  LoaderOptions o = options(4, 11);
  o.prefetch = 1;
  DataLoader a(dataset(30), o);
  o.prefetch = 5;
  DataLoader b(dataset(30), o);
  const auto ta = take(a, 20);  // 7 batches per epoch: crosses two epoch boundaries
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_EQ(ta, take(b, 20));
  o.seed = 12;
  DataLoader c(dataset(30), o);
  EXPECT_NE(ta, take(c, 20));
}

TEST(DataLoader, EachEpochVisitsEverySampleOnce) {
  DataLoader loader(dataset(24), options(6));
  EXPECT_EQ(loader.batches_per_epoch(), 4);
  std::vector<int64_t> epoch0, epoch1;
  for (int b = 0; b < 8; ++b) {
    Batch batch = loader.next();
    EXPECT_EQ(batch.epoch(), b / 4);
    EXPECT_EQ(batch.index_in_epoch(), b % 4);
    for (int64_t i : indices_of(batch, 8)) (b < 4 ? epoch0 : epoch1).push_back(i);
  }
  EXPECT_NE(epoch0, epoch1);
  std::sort(epoch0.begin(), epoch0.end());
  std::sort(epoch1.begin(), epoch1.end());
  EXPECT_EQ(epoch0, epoch_order(24, false, 0, 0));
  EXPECT_EQ(epoch1, epoch0);
}

TEST(DataLoader, NextMatchesIndicesAndLabels) {
  DataLoader loader(dataset(50), options(8));
  for (int b = 0; b < 9; ++b) {
    const LoaderPosition p = loader.position();
    Batch batch = loader.next();
    EXPECT_EQ(batch.position(), p);
    const std::vector<int64_t> idx = loader.indices(p);
    EXPECT_EQ(indices_of(batch, 8), idx);
    for (int64_t i = 0; i < batch.size(); ++i) EXPECT_EQ(batch.labels()[i], idx[i] % 5);
  }
}

TEST(DataLoader, ShuffleOffKeepsFileOrder) {
  LoaderOptions o = options(4);
  o.shuffle = false;
  DataLoader loader(dataset(12), o);
  EXPECT_EQ(take(loader, 4), (std::vector<std::vector<int64_t>>{
                                 {0, 1, 2, 3}, {4, 5, 6, 7}, {8, 9, 10, 11}, {0, 1, 2, 3}}));
}

// Two ranks at batch B see exactly the two halves of what one rank at 2B sees, including a
// partial last batch; and three ranks likewise.
TEST(DataLoader, RankSlicesConcatenateToTheSingleRankBatch) {
  for (int world : {2, 3}) {
    for (bool drop_last : {true, false}) {
      LoaderOptions single = options(4 * world, 9);
      single.drop_last = drop_last;
      DataLoader one(dataset(50), single);
      std::vector<std::unique_ptr<DataLoader>> ranks;
      for (int r = 0; r < world; ++r) {
        LoaderOptions o = options(4, 9);
        o.drop_last = drop_last;
        o.world_size = world;
        o.rank = r;
        ranks.push_back(std::make_unique<DataLoader>(dataset(50), o));
        EXPECT_EQ(ranks.back()->batches_per_epoch(), one.batches_per_epoch());
      }
      const int batches = static_cast<int>(one.batches_per_epoch()) * 2 + 1;
      const auto whole = take(one, batches);
      std::vector<std::vector<std::vector<int64_t>>> parts;
      for (auto& r : ranks) parts.push_back(take(*r, batches));
      for (int b = 0; b < batches; ++b) {
        std::vector<int64_t> joined;
        for (int r = 0; r < world; ++r) {
          EXPECT_LE(parts[r][b].size(), 4u);
          joined.insert(joined.end(), parts[r][b].begin(), parts[r][b].end());
        }
        EXPECT_EQ(joined, whole[b])
            << "world " << world << " drop_last " << drop_last << " b " << b;
      }
    }
  }
}

TEST(DataLoader, PartialGlobalBatchSplitEvenly) {
  // 50 samples, 3 ranks x 4: 4 full global batches of 12, then 2 samples: ranks get 1, 1, 0.
  std::vector<int64_t> sizes;
  for (int r = 0; r < 3; ++r) {
    LoaderOptions o = options(4);
    o.drop_last = false;
    o.world_size = 3;
    o.rank = r;
    DataLoader loader(dataset(50), o);
    EXPECT_EQ(loader.batches_per_epoch(), 5);
    EXPECT_EQ(loader.indices({0, 4}).size(), r < 2 ? 1u : 0u);
    for (int b = 0; b < 5; ++b) sizes.push_back(loader.next().size());
  }
  EXPECT_EQ(sizes, (std::vector<int64_t>{4, 4, 4, 4, 1, 4, 4, 4, 4, 1, 4, 4, 4, 4, 0}));
}

TEST(DataLoader, DropLastAndKeepLast) {
  LoaderOptions o = options(4);
  o.shuffle = false;
  DataLoader drop(dataset(10), o);
  EXPECT_EQ(drop.batches_per_epoch(), 2);
  EXPECT_EQ(take(drop, 3),
            (std::vector<std::vector<int64_t>>{{0, 1, 2, 3}, {4, 5, 6, 7}, {0, 1, 2, 3}}));
  o.drop_last = false;
  DataLoader keep(dataset(10), o);
  EXPECT_EQ(keep.batches_per_epoch(), 3);
  EXPECT_EQ(take(keep, 4),
            (std::vector<std::vector<int64_t>>{{0, 1, 2, 3}, {4, 5, 6, 7}, {8, 9}, {0, 1, 2, 3}}));
}

TEST(DataLoader, FinitePassEndsAndStaysEnded) {
  LoaderOptions o = options(4);
  o.drop_last = false;
  o.epochs = 1;
  DataLoader loader(dataset(10), o);
  int64_t seen = 0;
  int batches = 0;
  while (Batch b = loader.next()) {
    seen += b.size();
    ++batches;
  }
  EXPECT_EQ(seen, 10);
  EXPECT_EQ(batches, 3);
  EXPECT_FALSE(loader.next());
  EXPECT_EQ(loader.position(), (LoaderPosition{1, 0}));
}

TEST(DataLoader, Normalisation) {
  LoaderOptions o = options(2);
  o.mean = {0.5f, 0.25f};
  o.stddev = {0.5f, 2.0f};
  auto ds = std::make_shared<IndexDataset>(4, Shape{2, 3, 3});
  DataLoader loader(ds, o);
  Batch b = loader.next();
  std::vector<float> raw(18);
  for (int64_t row = 0; row < 2; ++row) {
    ds->get(static_cast<int64_t>((b.images()[row * 18] * 0.5f) + 0.5f), raw.data());
    for (int64_t k = 0; k < 18; ++k) {
      const int c = static_cast<int>(k / 9);
      EXPECT_EQ(b.images()[row * 18 + k], (raw[k] - o.mean[c]) / o.stddev[c]) << row << " " << k;
    }
  }
  // Channel 1, pixel 4 of any sample: (4/64 + 9/64 + 1 - 0.25) / 2, hand-computed.
  EXPECT_FLOAT_EQ(b.images()[9 + 4], (13.0f / 64 + 1.0f - 0.25f) / 2.0f);
}

TEST(DataLoader, BadOptionsAreConfigErrors) {
  LoaderOptions o = options(2);
  o.mean = {0.5f};
  o.stddev = {0.5f};
  EXPECT_THROW(DataLoader(dataset(8), o), ConfigError);  // 1 value for 2 channels
  o.mean = {0.5f, 0.5f};
  o.stddev = {0.5f, 0.0f};
  EXPECT_THROW(DataLoader(dataset(8), o), ConfigError);
  EXPECT_THROW(DataLoader(dataset(8), options(0)), ConfigError);
  LoaderOptions r = options(2);
  r.world_size = 2;
  r.rank = 2;
  EXPECT_THROW(DataLoader(dataset(8), r), ConfigError);
  // Fewer samples than one global batch, with drop_last.
  LoaderOptions big = options(4);
  big.world_size = 2;
  EXPECT_THROW(DataLoader(dataset(7), big), ConfigError);
  big.drop_last = false;
  EXPECT_EQ(DataLoader(dataset(7), big).batches_per_epoch(), 1);
}

TEST(DataLoader, SeekAndResumeContinueWithTheNextBatch) {
  DataLoader straight(dataset(30), options(4, 3));
  const int64_t sample = 8;
  std::vector<std::vector<int64_t>> all;
  std::vector<std::vector<int32_t>> labels;
  for (int i = 0; i < 12; ++i) {
    Batch b = straight.next();
    all.push_back(indices_of(b, sample));
    labels.emplace_back(b.labels(), b.labels() + b.size());
  }
  // Stop after 5 batches, "restart" with start = the saved position.
  DataLoader first(dataset(30), options(4, 3));
  take(first, 5);
  const LoaderPosition saved = first.position();
  EXPECT_EQ(saved, (LoaderPosition{0, 5}));
  EXPECT_EQ(first.position_after(5), saved);
  LoaderOptions resumed = options(4, 3);
  resumed.start = saved;
  DataLoader second(dataset(30), resumed);
  for (int i = 5; i < 12; ++i) {
    Batch b = second.next();
    EXPECT_EQ(indices_of(b, sample), all[i]) << i;
    EXPECT_EQ(std::vector<int32_t>(b.labels(), b.labels() + b.size()), labels[i]) << i;
  }
  // seek() back and forth on a running loader, across the epoch boundary (7 per epoch).
  second.seek({1, 2});
  EXPECT_EQ(take(second, 2), (std::vector<std::vector<int64_t>>{all[9], all[10]}));
  second.seek({0, 0});
  EXPECT_EQ(take(second, 3), (std::vector<std::vector<int64_t>>{all[0], all[1], all[2]}));
  EXPECT_EQ(second.position(), (LoaderPosition{0, 3}));
  EXPECT_THROW(second.seek({0, 7}), ConfigError);
  EXPECT_THROW(second.seek({-1, 0}), ConfigError);
}

TEST(DataLoader, ErrorReachesNextAtItsBatchAndStays) {
  LoaderOptions o = options(4);
  o.shuffle = false;
  DataLoader loader(std::make_shared<IndexDataset>(40, Shape{2, 2, 2}, /*fail_at=*/13), o);
  for (int b = 0; b < 3; ++b) EXPECT_EQ(loader.next().size(), 4);  // samples 0..11
  try {
    loader.next();
    FAIL() << "expected DataError";
  } catch (const DataError& e) {
    EXPECT_STREQ(e.what(), "sample 13 is broken");
  }
  EXPECT_THROW(loader.next(), DataError);
  // A label outside [0, classes) is caught by the loader.
  DataLoader bad(
      std::make_shared<IndexDataset>(40, Shape{2, 2, 2}, -1, std::chrono::milliseconds(0), 2), o);
  EXPECT_THROW(bad.next(), DataError);
}

TEST(DataLoader, HoldingTooManyLeasesThrowsInsteadOfHanging) {
  LoaderOptions o = options(2);
  o.prefetch = 1;
  o.max_leases = 1;
  DataLoader loader(dataset(20), o);
  Batch a = loader.next();
  Batch b = loader.next();  // one beyond max_leases still fits the two buffers
  EXPECT_THROW(loader.next(), ConfigError);
  b.release();
  EXPECT_FALSE(b);
  EXPECT_TRUE(loader.next());
}

TEST(DataLoader, ReleasedBuffersAreReusedAndLeasesOutliveTheLoader) {
  LoaderOptions o = options(2);
  o.shuffle = false;
  auto loader = std::make_unique<DataLoader>(dataset(20), o);
  std::set<float*> buffers;
  for (int i = 0; i < 20; ++i) buffers.insert(loader->next().images());
  EXPECT_EQ(buffers.size(), 4u);  // prefetch 2 + max_leases 2
  Batch kept = loader->next();
  const LoaderPosition where = kept.position();
  loader.reset();  // the thread was waiting for a free buffer
  ASSERT_TRUE(kept);
  EXPECT_EQ(kept.position(), where);
  EXPECT_EQ(kept.images()[0], static_cast<float>(where.batch * 2));
  kept.release();
}

class CountingAllocator : public PinnedAllocator {
 public:
  void* allocate(uint64_t bytes) override {
    ++allocations;
    last_bytes = bytes;
    live += bytes;
    return std::aligned_alloc(4096, (bytes + 4095) / 4096 * 4096);
  }
  void deallocate(void* ptr, uint64_t bytes) override {
    live -= bytes;
    std::free(ptr);
  }
  int allocations = 0;
  uint64_t last_bytes = 0;
  uint64_t live = 0;
};

TEST(DataLoader, BuffersComeFromThePinnedAllocator) {
  CountingAllocator alloc;
  {
    LoaderOptions o = options(3);
    o.allocator = &alloc;
    o.prefetch = 3;
    DataLoader loader(std::make_shared<IndexDataset>(30, Shape{3, 5, 5}), o);
    EXPECT_EQ(loader.batch_shape(), (Shape{3, 3, 5, 5}));
    EXPECT_EQ(alloc.allocations, 5);  // prefetch 3 + max_leases 2
    // 3 * 75 floats = 900 bytes -> 960 (64-aligned), + 3 labels * 4 -> 1024.
    EXPECT_EQ(alloc.last_bytes, 1024u);
    Batch b = loader.next();
    EXPECT_EQ(reinterpret_cast<uintptr_t>(b.images()) % 4096, 0u);
    EXPECT_EQ(reinterpret_cast<char*>(b.labels()) - reinterpret_cast<char*>(b.images()), 960);
  }
  EXPECT_EQ(alloc.live, 0u);
}

TEST(DataLoader, DestructionWhileBlockedOrBusyDoesNotHang) {
  // Blocked: the thread filled every buffer it may and waits; nobody calls next().
  {
    auto ds = std::make_shared<IndexDataset>(100);
    const auto t0 = Clock::now();
    {
      DataLoader loader(ds, options(4));
      while (ds->calls() < 8 && Clock::now() - t0 < std::chrono::seconds(1)) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      EXPECT_EQ(ds->calls(), 8);  // exactly prefetch (2) batches of 4 ahead, then it waits
    }
    EXPECT_LT(Clock::now() - t0, std::chrono::seconds(2));
  }
  // Busy: a slow dataset (20 ms a sample, 64 a batch); stopping does not wait for the batch.
  {
    auto slow =
        std::make_shared<IndexDataset>(1000, Shape{2, 2, 2}, -1, std::chrono::milliseconds(20));
    const auto t0 = Clock::now();
    {
      DataLoader loader(slow, options(64));
      std::this_thread::sleep_for(std::chrono::milliseconds(30));
    }
    EXPECT_LT(Clock::now() - t0, std::chrono::milliseconds(500));
    EXPECT_LT(slow->calls(), 10);
  }
  // The consumer stops early after one batch, holding it.
  {
    DataLoader loader(dataset(100), options(4));
    Batch b = loader.next();
    EXPECT_EQ(b.size(), 4);
  }
}

}  // namespace
}  // namespace ferry
