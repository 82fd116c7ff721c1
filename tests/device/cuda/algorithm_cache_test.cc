// The process-wide cache of convolution algorithm choices (issue 16, defect 1): a key's first
// choice is every later one's, a failed choice is not kept, the key holds exactly the options
// that may change a choice, and timed choices written to a file are the choices of a later
// process that loads it (a resumed run). Runs without a GPU (the cache is pure C++); that CudnnConv
// takes its algorithms from it is shown only on a GPU (CudaTraining's bitwise policy comparisons).
#include <gtest/gtest.h>

#include <fstream>
#include <stdexcept>
#include <string>

#include "device/cuda/algorithm_cache.h"
#include "device/device.h"
#include "tests/support/temp_dir.h"

namespace ferry::cuda {
namespace {

ConvGeom geometry() {
  return {.n = 4, .c = 16, .h = 8, .w = 8, .k = 32, .r = 3, .s = 3, .pad_h = 1, .pad_w = 1};
}

DeviceOptions options() {
  DeviceOptions o;
  o.backend = Backend::kCuda;
  o.cuda.deterministic = true;
  o.cuda.conv_tf32 = false;
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
  o.cuda.conv_tf32 = true;
  EXPECT_NE(conv_algorithm_key(o, 0, geometry()), base);
  o = options();
  o.cuda.deterministic = false;
  EXPECT_NE(conv_algorithm_key(o, 0, geometry()), base);
  o = options();
  o.cuda.algorithms = AlgorithmSearch::kHeuristic;
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
  o.cuda.matmul_tf32 = true;
  o.cpu.link_gbps = 5;
  o.cpu.threads = 3;
  EXPECT_EQ(conv_algorithm_key(o, 0, geometry()), base);
}

TEST(ConvAlgorithmCache, AChoiceLineReadsBackAsItWasWritten) {
  ConvGeom g = geometry();
  g.groups = 4;
  g.stride_h = 2;
  DeviceOptions o = options();
  o.cuda.algorithms = AlgorithmSearch::kHeuristic;
  o.ordinal = 3;
  const ConvAlgorithmKey key = conv_algorithm_key(o, 2, g);
  const ConvAlgorithm choice{.algo = 5, .math_type = 2, .workspace = 123456789, .timed = true};
  const auto back = parse_choice_line(format_choice_line(key, choice));
  ASSERT_TRUE(back.has_value()) << format_choice_line(key, choice);
  EXPECT_EQ(back->first, key);
  EXPECT_EQ(back->second, choice);
  EXPECT_FALSE(parse_choice_line("").has_value());
  EXPECT_FALSE(parse_choice_line("conv 0 1 2").has_value());
  EXPECT_FALSE(parse_choice_line(format_choice_line(key, choice) + " 7").has_value());
}

// Note [Timed choices across processes]: a second cache (a new process, the resumed run) that
// loads the file takes the first one's choices without choosing; another GPU or cuDNN (another
// header) takes none.
TEST(ConvAlgorithmCache, AResumedProcessTakesTheChoicesOfTheFile) {
  // In a folder that does not exist yet.
  const testing::TempDir dir;
  const std::string file = dir.file("algorithms/rank0.txt");
  const std::string header = "# ferry conv algorithms v1: cuDNN 90300, NVIDIA H100";
  const ConvAlgorithmKey key = conv_algorithm_key(options(), 0, geometry());
  const ConvAlgorithmKey other = conv_algorithm_key(options(), 1, geometry());
  {
    ConvAlgorithmCache first;
    EXPECT_EQ(first
                  .get(
                      key, [] { return ConvAlgorithm{.algo = 1, .timed = true}; }, file, header)
                  .algo,
              1);
    first.get(
        other, [] { return ConvAlgorithm{.algo = 4, .workspace = 64, .timed = true}; }, file,
        header);
  }
  ConvAlgorithmCache resumed;
  EXPECT_EQ(resumed.load(file, header), 2u);
  int calls = 0;
  const auto timing_again = [&] {
    ++calls;
    return ConvAlgorithm{.algo = 7, .timed = true};  // a second timing ranks another first
  };
  EXPECT_EQ(resumed.get(key, timing_again, file, header).algo, 1);
  EXPECT_EQ(resumed.get(other, timing_again, file, header).workspace, 64u);
  EXPECT_EQ(calls, 0);
  EXPECT_EQ(resumed.load(file, header), 0u) << "loading again adds nothing";

  ConvAlgorithmCache elsewhere;
  EXPECT_EQ(elsewhere.load(file, "# ferry conv algorithms v1: cuDNN 90100, NVIDIA A100"), 0u);
  EXPECT_EQ(elsewhere.load(file + ".absent", header), 0u);
}

TEST(ConvAlgorithmCache, TheProcessHasOneCache) {
  EXPECT_EQ(&process_conv_algorithms(), &process_conv_algorithms());
}

}  // namespace
}  // namespace ferry::cuda
