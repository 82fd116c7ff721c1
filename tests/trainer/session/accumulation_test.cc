// Gradient accumulation's folds (Note [Accumulating micro-batches] in
// trainer/session/accumulation.h): the gradient block holds the sum of the update's micro-batches
// when the reduction hears a parameter, the reduction hears only the last micro-batch, a
// parameter some micro-batch does not write sums only the ones that did, and adjacent parameters
// fold in one launch.
#include "trainer/session/accumulation.h"

#include <cstring>
#include <set>
#include <vector>

#include <gtest/gtest.h>

#include "device/device.h"
#include "trainer/exec/parameter_store.h"
#include "trainer/model/zoo/zoo.h"

namespace ferry {
namespace {

// Records what the reduction (the gradient buckets' listener) hears, and the gradient block as
// it is when it hears it.
class Recorder : public GradientListener {
 public:
  void on_gradients(std::span<const size_t> params) override {
    heard.insert(heard.end(), params.begin(), params.end());
  }
  std::vector<size_t> heard;
};

class Accumulation : public ::testing::Test {
 protected:
  void SetUp() override {
    DeviceOptions options;
    options.memory = uint64_t{64} << 20;
    device_ = create_device(options);
    graph_ = build_model("lenet5", Shape{1, 3, 32, 32}, 10);
    store_ =
        std::make_unique<ParameterStore>(*device_, graph_, 0, StoreLayout{}, /*accumulation=*/true);
    store_->initialize(graph_, 1);
  }

  size_t floats() const { return static_cast<size_t>(store_->param_floats()); }

  // Backward of micro-batch `k`: every float of the gradient block gets a value of its own.
  std::vector<float> write_grads(int k) {
    std::vector<float> g(floats());
    for (size_t i = 0; i < g.size(); ++i)
      g[i] = 0.001f * static_cast<float>((i * 7 + k * 13) % 97) - 0.03f * k;
    device_->copy_async(store_->grad_block(), g.data(), g.size() * sizeof(float),
                        device_->stream(StreamKind::kCompute));
    return g;
  }

  std::vector<float> grads() {
    std::vector<float> out(floats());
    device_->copy_async(out.data(), store_->grad_block(), out.size() * sizeof(float),
                        device_->stream(StreamKind::kCompute));
    device_->synchronize();
    return out;
  }

  std::unique_ptr<Device> device_;
  Graph graph_;
  std::unique_ptr<ParameterStore> store_;
};

TEST_F(Accumulation, TheReductionHearsTheSumOfTheMicroBatchesOnTheLastOnly) {
  const size_t n = store_->params().size();
  ASSERT_GE(n, 6u);
  Recorder reduce;
  GradientAccumulation acc(*device_, *store_, reduce);
  // Parameter 2 is not written by micro-batch 0, parameter 4 not by the last one (2).
  const size_t late = 2, early = 4;
  std::vector<std::vector<float>> g;
  for (int k = 0; k < 3; ++k) {
    GradientListener* listener = acc.begin(MicroBatch{k, 3});
    g.push_back(write_grads(k));
    std::vector<size_t> written;
    for (size_t p = n; p-- > 0;) {  // backward writes in reverse
      if ((k == 0 && p == late) || (k == 2 && p == early)) continue;
      written.push_back(p);
    }
    // One listener call per backward step, as the executor makes them: two parameters each.
    for (size_t i = 0; i < written.size(); i += 2) {
      listener->on_gradients(
          std::span(written).subspan(i, std::min<size_t>(2, written.size() - i)));
    }
    if (k < 2) {
      EXPECT_TRUE(reduce.heard.empty()) << "micro-batch " << k << " must not reduce";
    }
    if (k == 0) {
      // Runs of adjacent parameters with the same fold: the copies around parameter 2, per call.
      EXPECT_LT(acc.launches(), n) << "adjacent parameters fold together";
    }
  }
  EXPECT_EQ(reduce.heard.size(), n - 1) << "the last micro-batch's parameters, once each";
  EXPECT_EQ(std::set<size_t>(reduce.heard.begin(), reduce.heard.end()).count(early), 0u);
  acc.fold_rest();
  const std::vector<float> got = grads();
  for (size_t p = 0; p < n; ++p) {
    const ParameterStore::Entry& e = store_->params()[p];
    const size_t begin = e.offset / sizeof(float);
    for (size_t i = begin; i < begin + static_cast<size_t>(e.desc.shape.numel()); ++i) {
      float want;
      if (p == late) {
        want = g[1][i] + g[2][i];
      } else if (p == early) {
        want = g[0][i] + g[1][i];
      } else {
        want = (g[0][i] + g[1][i]) + g[2][i];
      }
      ASSERT_EQ(got[i], want) << "parameter " << e.name << " float " << i - begin;
    }
  }
}

TEST_F(Accumulation, ANewUpdateStartsFromItsOwnFirstMicroBatch) {
  const size_t n = store_->params().size();
  Recorder reduce;
  GradientAccumulation acc(*device_, *store_, reduce);
  std::vector<size_t> all(n);
  for (size_t p = 0; p < n; ++p) all[p] = p;
  std::vector<float> last;
  for (int update = 0; update < 2; ++update) {
    std::vector<std::vector<float>> g;
    for (int k = 0; k < 2; ++k) {
      GradientListener* listener = acc.begin(MicroBatch{k, 2});
      g.push_back(write_grads(k + 3 * update));
      listener->on_gradients(all);
    }
    acc.fold_rest();
    const std::vector<float> got = grads();
    const ParameterStore::Entry& e = store_->params()[0];
    for (size_t i = 0; i < static_cast<size_t>(e.desc.shape.numel()); ++i) {
      ASSERT_EQ(got[i], g[0][i] + g[1][i]) << "update " << update << ": only its own micro-batches";
    }
  }
}

TEST(MicroBatchSeeds, OneStepIsItselfAndMicroBatchesAreDistinctAndInOrder) {
  EXPECT_EQ(MicroBatch{}.seed_step(7), 7u);
  EXPECT_TRUE(MicroBatch{}.last());
  std::set<uint64_t> seen;
  for (int64_t step = 1; step <= 3; ++step) {
    for (int64_t k = 0; k < 4; ++k) seen.insert(MicroBatch{k, 4}.seed_step(step));
  }
  EXPECT_EQ(seen.size(), 12u);
  EXPECT_EQ(*seen.begin(), 1u);
  EXPECT_EQ(*seen.rbegin(), 12u);
  EXPECT_FALSE((MicroBatch{2, 4}.last()));
  EXPECT_TRUE((MicroBatch{3, 4}.last()));
}

TEST(ParameterStoreBytes, TheAccumulationBlockIsPlannedAsGradients) {
  const Graph g = build_model("lenet5", Shape{1, 3, 32, 32}, 10);
  const PersistentBytes one = ParameterStore::plan_bytes(g, 1);
  const PersistentBytes two = ParameterStore::plan_bytes(g, 1, /*accumulation=*/true);
  EXPECT_EQ(two.gradients, 2 * one.gradients);
  EXPECT_EQ(two.weights, one.weights);
  EXPECT_EQ(two.total(), one.total() + one.gradients);
  DeviceOptions options;
  options.memory = uint64_t{64} << 20;
  auto device = create_device(options);
  const ParameterStore store(*device, g, 1, StoreLayout{}, /*accumulation=*/true);
  EXPECT_EQ(store.bytes().gradients, two.gradients) << "allocated as planned";
  EXPECT_NE(store.accumulation_block(), nullptr);
  EXPECT_EQ(ParameterStore(*device, g, 1).accumulation_block(), nullptr);
}

}  // namespace
}  // namespace ferry
