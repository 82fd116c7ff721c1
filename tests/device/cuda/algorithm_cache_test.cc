// The process-wide cache of convolution algorithm choices (issue 16, defect 1): a key's first
// choice is every later one's, a failed choice is not kept, and the key holds exactly the options
// that may change a choice. Runs without a GPU (the cache is pure C++); that CudnnConv takes its
// algorithms from it is shown only on a GPU (CudaTraining's bitwise policy comparisons).
#include <gtest/gtest.h>

#include <stdexcept>

#include "device/cuda/algorithm_cache.h"
#include "device/device.h"

namespace ferry::cuda {
namespace {

ConvGeom geometry() {
  return {.n = 4, .c = 16, .h = 8, .w = 8, .k = 32, .r = 3, .s = 3, .pad_h = 1, .pad_w = 1};
}

DeviceOptions options() {
  DeviceOptions o;
  o.backend = Backend::kCuda;
  o.deterministic = true;
  o.conv_tf32 = false;
  return o;
}

TEST(ConvAlgorithmCache, TheFirstChoiceOfAKeyIsEveryLaterOne) {
  ConvAlgorithmCache cache;
  const ConvAlgorithmKey key = conv_algorithm_key(options(), 0, geometry());
  int calls = 0;
  const ConvAlgorithm first = cache.get(key, [&] {
    ++calls;
    return ConvAlgorithm{.algo = 1, .math_type = 2, .workspace = 4096, .timed = true};
  });
  // A second timing could rank another algorithm first (they time within noise): never asked.
  const ConvAlgorithm second = cache.get(key, [&] {
    ++calls;
    return ConvAlgorithm{.algo = 6, .math_type = 2, .workspace = 0, .timed = true};
  });
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(second, first);
  EXPECT_EQ(second.algo, 1);
  EXPECT_EQ(cache.size(), 1u);
}

TEST(ConvAlgorithmCache, AFailedChoiceIsNotKept) {
  ConvAlgorithmCache cache;
  const ConvAlgorithmKey key = conv_algorithm_key(options(), 1, geometry());
  EXPECT_THROW(cache.get(key, []() -> ConvAlgorithm { throw std::runtime_error("no room"); }),
               std::runtime_error);
  EXPECT_EQ(cache.size(), 0u);
  EXPECT_EQ(cache.get(key, [] { return ConvAlgorithm{.algo = 3}; }).algo, 3);
}

TEST(ConvAlgorithmCache, TheKeyHoldsWhatMayChangeAChoiceAndNothingElse) {
  const ConvAlgorithmKey base = conv_algorithm_key(options(), 0, geometry());
  // Options the kernels' numerics or the search depend on: another key.
  DeviceOptions o = options();
  o.conv_tf32 = true;
  EXPECT_NE(conv_algorithm_key(o, 0, geometry()), base);
  o = options();
  o.deterministic = false;
  EXPECT_NE(conv_algorithm_key(o, 0, geometry()), base);
  o = options();
  o.algorithms = AlgorithmSearch::kHeuristic;
  EXPECT_NE(conv_algorithm_key(o, 0, geometry()), base);
  o = options();
  o.workspace_limit /= 2;
  EXPECT_NE(conv_algorithm_key(o, 0, geometry()), base);
  o = options();
  o.ordinal = 1;
  EXPECT_NE(conv_algorithm_key(o, 0, geometry()), base);
  EXPECT_NE(conv_algorithm_key(options(), 2, geometry()), base);
  ConvGeom g = geometry();
  g.groups = 2;
  EXPECT_NE(conv_algorithm_key(options(), 0, g), base);
  g = geometry();
  g.stride_w = 2;
  EXPECT_NE(conv_algorithm_key(options(), 0, g), base);
  // Options that do not reach a convolution (capacity, the matmul's TF32, copies): the same key,
  // so two sessions of different device.memory share their choices.
  o = options();
  o.memory = uint64_t{3} << 30;
  o.matmul_tf32 = true;
  o.copy_gbps = 5;
  o.threads = 3;
  EXPECT_EQ(conv_algorithm_key(o, 0, geometry()), base);
}

TEST(ConvAlgorithmCache, TheProcessHasOneCache) {
  EXPECT_EQ(&process_conv_algorithms(), &process_conv_algorithms());
}

}  // namespace
}  // namespace ferry::cuda
