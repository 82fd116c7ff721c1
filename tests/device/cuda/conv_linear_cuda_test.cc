// The cuDNN convolutions and cuBLAS linear layers against the CPU backend's (oneDNN) on the same
// random inputs: odd sizes, groups, strides, asymmetric kernels, with and without a bias, TF32
// off, max error <= 1e-4 of the largest magnitude; deterministic mode repeats bit for bit; a
// geometry's workspace is stable and enforced. Each test skips without a GPU.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "common/error.h"
#include "device/cuda/cuda_check.h"
#include "device/cuda/cuda_device.h"
#include "device/cuda/cuda_stream.h"
#include "device/device.h"
#include "tests/device/cpu/kernel_test_util.h"

namespace ferry {
namespace {

constexpr uint64_t kMiB = 1ull << 20;
constexpr double kTolerance = 1e-4;  // FP32 (TF32 off): far below TF32's ~1e-3

// max |actual - expected| / max |expected|, as a gtest assertion naming the worst element.
::testing::AssertionResult close(const std::vector<float>& actual,
                                 const std::vector<float>& expected, const std::string& what) {
  if (actual.size() != expected.size()) {
    return ::testing::AssertionFailure()
           << what << ": size " << actual.size() << " vs " << expected.size();
  }
  double scale = 0.0, worst = 0.0;
  size_t at = 0;
  for (size_t i = 0; i < expected.size(); ++i) {
    scale = std::max(scale, std::fabs(static_cast<double>(expected[i])));
  }
  for (size_t i = 0; i < actual.size(); ++i) {
    const double err = std::fabs(static_cast<double>(actual[i]) - expected[i]);
    if (!(err <= worst)) {  // NaN counts as the worst
      worst = std::isnan(err) ? INFINITY : err;
      at = i;
    }
  }
  const double rel = scale > 0 ? worst / scale : worst;
  if (rel <= kTolerance) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << what << ": relative error " << rel << " at [" << at << "]: cuda " << actual[at]
         << " cpu " << expected[at] << " (max |cpu| " << scale << ")";
}

// A CUDA device (TF32 off) and helpers that move vectors in and out of its memory.
class Gpu {
 public:
  explicit Gpu(bool deterministic) {
    DeviceOptions o;
    o.backend = Backend::kCuda;
    o.memory = 512 * kMiB;
    o.ordinal = 0;
    o.cuda.conv_tf32 = false;
    o.cuda.matmul_tf32 = false;
    o.cuda.deterministic = deterministic;
    o.workspace_limit = 64 * kMiB;
    device_ = create_device(o);
  }
  ~Gpu() {
    device_->synchronize();
    for (void* p : owned_) device_->memory().release(p);
  }

  Kernels& kernels() { return device_->kernels(); }
  Stream& stream() { return device_->stream(StreamKind::kCompute); }
  cudaStream_t handle() { return cuda::as_cuda(stream()).handle(); }

  // Every transfer is ordered on the compute stream, the stream the kernels run on, and waited
  // for: never the legacy default stream, which ferry's non-blocking streams do not wait for.
  const float* upload(const std::vector<float>& v) {
    float* p = output(v.size());
    CUDA_CHECK(
        cudaMemcpyAsync(p, v.data(), v.size() * sizeof(float), cudaMemcpyHostToDevice, handle()));
    stream().synchronize();  // v is pageable: the copy has read it only once the stream is idle
    return p;
  }
  // Device floats filled with NaN (all bits set), so an element a kernel leaves alone shows.
  float* output(size_t n) {
    void* p = device_->memory().allocate(std::max<size_t>(n, 1) * sizeof(float), "test");
    owned_.push_back(p);
    CUDA_CHECK(cudaMemsetAsync(p, 0xff, std::max<size_t>(n, 1) * sizeof(float), handle()));
    return static_cast<float*>(p);
  }
  std::vector<float> download(const float* p, size_t n) {
    device_->synchronize();
    std::vector<float> v(n);
    CUDA_CHECK(cudaMemcpyAsync(v.data(), p, n * sizeof(float), cudaMemcpyDeviceToHost, handle()));
    stream().synchronize();
    return v;
  }
  // Launches `args` with exactly the workspace the kernels ask for, and waits.
  template <typename Args>
  void run(Args args) {
    const uint64_t bytes = kernels().workspace_bytes(args);
    EXPECT_EQ(kernels().workspace_bytes(args), bytes) << "a geometry's workspace must not change";
    void* ws = bytes > 0 ? device_->memory().allocate(bytes, "workspace") : nullptr;
    args.ws = Workspace{ws, bytes};
    kernels().launch(args, stream());
    device_->synchronize();
    if (ws != nullptr) device_->memory().release(ws);
  }

 private:
  std::unique_ptr<Device> device_;
  std::vector<void*> owned_;
};

class CudaConvLinear : public ::testing::Test {
 protected:
  void SetUp() override {
    if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device present";
  }
};

size_t count(int64_t a, int64_t b, int64_t c, int64_t d) {
  return static_cast<size_t>(a * b * c * d);
}

std::string describe(const ConvGeom& g) {
  return fmt::format("N{} C{} {}x{} K{} {}x{} s{}x{} p{}x{} g{}", g.n, g.c, g.h, g.w, g.k, g.r, g.s,
                     g.stride_h, g.stride_w, g.pad_h, g.pad_w, g.groups);
}

// Fixed cases (odd sizes, groups, depthwise, 1x1 strided, asymmetric kernels, strides and pads)
// and seeded random ones.
std::vector<ConvGeom> conv_cases() {
  // One case a line reads as a table.
  // clang-format off
  std::vector<ConvGeom> cases = {
      {.n = 2, .c = 3, .h = 7, .w = 5, .k = 4, .r = 3, .s = 3, .pad_h = 1, .pad_w = 1},
      {.n = 3, .c = 6, .h = 9, .w = 11, .k = 9, .r = 3, .s = 3, .stride_h = 2, .stride_w = 2,
       .pad_h = 1, .pad_w = 1, .groups = 3},
      {.n = 1, .c = 8, .h = 13, .w = 13, .k = 8, .r = 5, .s = 5, .pad_h = 2, .pad_w = 2,
       .groups = 8},
      {.n = 2, .c = 5, .h = 8, .w = 6, .k = 7, .r = 1, .s = 1, .stride_h = 2, .stride_w = 2},
      {.n = 2, .c = 4, .h = 10, .w = 7, .k = 6, .r = 3, .s = 5, .stride_h = 2, .stride_w = 1,
       .pad_h = 0, .pad_w = 2, .groups = 2},
      {.n = 4, .c = 64, .h = 16, .w = 16, .k = 32, .r = 3, .s = 3, .pad_h = 1, .pad_w = 1},
  };
  // clang-format on
  std::mt19937 rng(2024);
  auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  while (cases.size() < 12) {
    ConvGeom g;
    g.groups = pick(1, 3);
    g.n = pick(1, 4);
    g.c = g.groups * pick(1, 5);
    g.k = g.groups * pick(1, 5);
    g.h = pick(1, 17);
    g.w = pick(1, 17);
    g.r = pick(1, 5);
    g.s = pick(1, 5);
    g.stride_h = pick(1, 3);
    g.stride_w = pick(1, 3);
    g.pad_h = pick(0, g.r / 2);
    g.pad_w = pick(0, g.s / 2);
    if (g.h + 2 * g.pad_h >= g.r && g.w + 2 * g.pad_w >= g.s) cases.push_back(g);
  }
  return cases;
}

struct ConvData {
  ConvGeom g;
  std::vector<float> x, w, bias, dy;
  explicit ConvData(const ConvGeom& geom, uint32_t seed) : g(geom) {
    x = test::random_floats(count(g.n, g.c, g.h, g.w), seed);
    w = test::random_floats(count(g.k, g.c / g.groups, g.r, g.s), seed + 1);
    bias = test::random_floats(static_cast<size_t>(g.k), seed + 2);
    dy = test::random_floats(count(g.n, g.k, g.out_h(), g.out_w()), seed + 3);
  }
  size_t x_size() const { return x.size(); }
  size_t y_size() const { return dy.size(); }
};

// The three passes on the GPU: y (forward, with bias when `bias`), dx, dw and dbias.
struct ConvResults {
  std::vector<float> y, dx, dw, dbias;
};

ConvResults conv_on_gpu(Gpu& gpu, const ConvData& d, bool bias) {
  ConvResults r;
  const float* x = gpu.upload(d.x);
  const float* w = gpu.upload(d.w);
  const float* b = gpu.upload(d.bias);
  const float* dy = gpu.upload(d.dy);
  float* y = gpu.output(d.y_size());
  float* dx = gpu.output(d.x_size());
  float* dw = gpu.output(d.w.size());
  float* db = gpu.output(d.bias.size());
  gpu.run(ConvForward{.g = d.g, .x = x, .w = w, .bias = bias ? b : nullptr, .y = y});
  gpu.run(ConvBackwardData{.g = d.g, .dy = dy, .w = w, .dx = dx});
  gpu.run(ConvBackwardWeights{.g = d.g, .x = x, .dy = dy, .dw = dw, .dbias = bias ? db : nullptr});
  r.y = gpu.download(y, d.y_size());
  r.dx = gpu.download(dx, d.x_size());
  r.dw = gpu.download(dw, d.w.size());
  if (bias) r.dbias = gpu.download(db, d.bias.size());
  return r;
}

ConvResults conv_on_cpu(const ConvData& d, bool bias) {
  ConvResults r;
  r.y.assign(d.y_size(), NAN);
  r.dx.assign(d.x_size(), NAN);
  r.dw.assign(d.w.size(), NAN);
  if (bias) r.dbias.assign(d.bias.size(), NAN);
  test::KernelRunner cpu;
  cpu.run(ConvForward{.g = d.g,
                      .x = d.x.data(),
                      .w = d.w.data(),
                      .bias = bias ? d.bias.data() : nullptr,
                      .y = r.y.data()});
  cpu.run(ConvBackwardData{.g = d.g, .dy = d.dy.data(), .w = d.w.data(), .dx = r.dx.data()});
  cpu.run(ConvBackwardWeights{.g = d.g,
                              .x = d.x.data(),
                              .dy = d.dy.data(),
                              .dw = r.dw.data(),
                              .dbias = bias ? r.dbias.data() : nullptr});
  return r;
}

TEST_F(CudaConvLinear, ConvolutionsMatchTheCpuBackend) {
  Gpu gpu(/*deterministic=*/false);
  uint32_t seed = 1;
  for (const ConvGeom& g : conv_cases()) {
    for (bool bias : {true, false}) {
      SCOPED_TRACE(describe(g) + (bias ? " with bias" : " without bias"));
      const ConvData d(g, seed += 10);
      const ConvResults cuda = conv_on_gpu(gpu, d, bias);
      const ConvResults cpu = conv_on_cpu(d, bias);
      EXPECT_TRUE(close(cuda.y, cpu.y, "y"));
      EXPECT_TRUE(close(cuda.dx, cpu.dx, "dx"));
      EXPECT_TRUE(close(cuda.dw, cpu.dw, "dw"));
      if (bias) {
        EXPECT_TRUE(close(cuda.dbias, cpu.dbias, "dbias"));
      }
    }
  }
}

TEST_F(CudaConvLinear, DeterministicConvolutionsRepeatBitForBit) {
  Gpu gpu(/*deterministic=*/true);
  // Backward filter over a large batch is where cuDNN's non-deterministic algorithms live.
  const std::vector<ConvGeom> cases = {
      {.n = 32, .c = 32, .h = 16, .w = 16, .k = 32, .r = 3, .s = 3, .pad_h = 1, .pad_w = 1},
      {.n = 16,
       .c = 12,
       .h = 15,
       .w = 9,
       .k = 6,
       .r = 3,
       .s = 3,
       .stride_h = 2,
       .stride_w = 2,
       .pad_h = 1,
       .pad_w = 1,
       .groups = 3}};
  for (const ConvGeom& g : cases) {
    SCOPED_TRACE(describe(g));
    const ConvData d(g, 77);
    const ConvResults first = conv_on_gpu(gpu, d, true);
    for (int repeat = 0; repeat < 3; ++repeat) {
      const ConvResults again = conv_on_gpu(gpu, d, true);
      EXPECT_TRUE(test::bitwise_equal(first.y, again.y));
      EXPECT_TRUE(test::bitwise_equal(first.dx, again.dx));
      EXPECT_TRUE(test::bitwise_equal(first.dw, again.dw));
      EXPECT_TRUE(test::bitwise_equal(first.dbias, again.dbias));
    }
    const ConvResults cpu = conv_on_cpu(d, true);
    EXPECT_TRUE(close(first.dw, cpu.dw, "dw"));
  }
}

TEST_F(CudaConvLinear, AConvolutionGivenLessThanItsWorkspaceIsRefused) {
  Gpu gpu(/*deterministic=*/false);
  // Large enough that the fastest algorithm usually wants scratch; skip when it does not.
  const ConvGeom g{
      .n = 32, .c = 64, .h = 32, .w = 32, .k = 64, .r = 3, .s = 3, .pad_h = 1, .pad_w = 1};
  const ConvData d(g, 5);
  ConvBackwardWeights a{
      .g = g, .x = gpu.upload(d.x), .dy = gpu.upload(d.dy), .dw = gpu.output(d.w.size())};
  const uint64_t need = gpu.kernels().workspace_bytes(a);
  EXPECT_LE(need, 64 * kMiB) << "the workspace limit was exceeded";
  if (need == 0) GTEST_SKIP() << "cuDNN chose a zero-workspace algorithm here";
  a.ws = Workspace{nullptr, 0};
  EXPECT_THROW(gpu.kernels().launch(a, gpu.stream()), UnsupportedError);
  a.ws = Workspace{gpu.output(need / sizeof(float)), need - 1};
  EXPECT_THROW(gpu.kernels().launch(a, gpu.stream()), UnsupportedError);
}

struct LinearData {
  LinearGeom g;
  std::vector<float> x, w, bias, dy;
  LinearData(const LinearGeom& geom, uint32_t seed) : g(geom) {
    x = test::random_floats(static_cast<size_t>(g.m * g.k), seed);
    w = test::random_floats(static_cast<size_t>(g.n * g.k), seed + 1);
    bias = test::random_floats(static_cast<size_t>(g.n), seed + 2);
    dy = test::random_floats(static_cast<size_t>(g.m * g.n), seed + 3);
  }
};

struct LinearResults {
  std::vector<float> y, dx, dw, dbias;
};

LinearResults linear_on_gpu(Gpu& gpu, const LinearData& d, bool bias) {
  LinearResults r;
  const float* x = gpu.upload(d.x);
  const float* w = gpu.upload(d.w);
  const float* b = gpu.upload(d.bias);
  const float* dy = gpu.upload(d.dy);
  float* y = gpu.output(d.dy.size());
  float* dx = gpu.output(d.x.size());
  float* dw = gpu.output(d.w.size());
  float* db = gpu.output(d.bias.size());
  gpu.run(LinearForward{.g = d.g, .x = x, .w = w, .bias = bias ? b : nullptr, .y = y});
  gpu.run(LinearBackwardData{.g = d.g, .dy = dy, .w = w, .dx = dx});
  gpu.run(
      LinearBackwardWeights{.g = d.g, .x = x, .dy = dy, .dw = dw, .dbias = bias ? db : nullptr});
  r.y = gpu.download(y, d.dy.size());
  r.dx = gpu.download(dx, d.x.size());
  r.dw = gpu.download(dw, d.w.size());
  if (bias) r.dbias = gpu.download(db, d.bias.size());
  return r;
}

LinearResults linear_on_cpu(const LinearData& d, bool bias) {
  LinearResults r;
  r.y.assign(d.dy.size(), NAN);
  r.dx.assign(d.x.size(), NAN);
  r.dw.assign(d.w.size(), NAN);
  if (bias) r.dbias.assign(d.bias.size(), NAN);
  test::KernelRunner cpu;
  cpu.run(LinearForward{.g = d.g,
                        .x = d.x.data(),
                        .w = d.w.data(),
                        .bias = bias ? d.bias.data() : nullptr,
                        .y = r.y.data()});
  cpu.run(LinearBackwardData{.g = d.g, .dy = d.dy.data(), .w = d.w.data(), .dx = r.dx.data()});
  cpu.run(LinearBackwardWeights{.g = d.g,
                                .x = d.x.data(),
                                .dy = d.dy.data(),
                                .dw = r.dw.data(),
                                .dbias = bias ? r.dbias.data() : nullptr});
  return r;
}

const std::vector<LinearGeom> kLinearCases = {{.m = 1, .k = 1, .n = 1},
                                              {.m = 7, .k = 13, .n = 5},
                                              {.m = 33, .k = 65, .n = 17},
                                              {.m = 64, .k = 512, .n = 10},
                                              {.m = 3, .k = 1000, .n = 129}};

TEST_F(CudaConvLinear, LinearLayersMatchTheCpuBackend) {
  Gpu gpu(/*deterministic=*/false);
  uint32_t seed = 3;
  for (const LinearGeom& g : kLinearCases) {
    for (bool bias : {true, false}) {
      SCOPED_TRACE(fmt::format("M{} K{} N{}{}", g.m, g.k, g.n, bias ? " with bias" : ""));
      const LinearData d(g, seed += 10);
      const LinearResults cuda = linear_on_gpu(gpu, d, bias);
      const LinearResults cpu = linear_on_cpu(d, bias);
      EXPECT_TRUE(close(cuda.y, cpu.y, "y"));
      EXPECT_TRUE(close(cuda.dx, cpu.dx, "dx"));
      EXPECT_TRUE(close(cuda.dw, cpu.dw, "dw"));
      if (bias) {
        EXPECT_TRUE(close(cuda.dbias, cpu.dbias, "dbias"));
      }
    }
  }
}

// (rows, cols) row-major -> (cols, rows).
std::vector<float> transposed(const std::vector<float>& a, int64_t rows, int64_t cols) {
  std::vector<float> t(a.size());
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) t[c * rows + r] = a[r * cols + c];
  }
  return t;
}

// GPT-2's Conv1D layout: the weight stored (K, N). The same products as nn.Linear's layout with
// the weight transposed on the host (and dw transposed back), independent of the CPU backend.
TEST_F(CudaConvLinear, WeightInOutIsTheTransposedLayout) {
  Gpu gpu(/*deterministic=*/false);
  uint32_t seed = 101;
  for (const LinearGeom& g : kLinearCases) {
    SCOPED_TRACE(fmt::format("M{} K{} N{}", g.m, g.k, g.n));
    const LinearData d(g, seed += 10);
    const LinearResults out_in = linear_on_gpu(gpu, d, true);
    LinearData flipped = d;
    flipped.g.weight_in_out = true;
    flipped.w = transposed(d.w, g.n, g.k);  // (N, K) -> (K, N)
    const LinearResults in_out = linear_on_gpu(gpu, flipped, true);
    EXPECT_TRUE(close(in_out.y, out_in.y, "y"));
    EXPECT_TRUE(close(in_out.dx, out_in.dx, "dx"));
    EXPECT_TRUE(close(transposed(in_out.dw, g.k, g.n), out_in.dw, "dw"));
    EXPECT_TRUE(close(in_out.dbias, out_in.dbias, "dbias"));
  }
}

TEST_F(CudaConvLinear, DeterministicLinearLayersRepeatBitForBit) {
  Gpu gpu(/*deterministic=*/true);
  const LinearData d({.m = 256, .k = 1024, .n = 100}, 9);
  const LinearResults first = linear_on_gpu(gpu, d, true);
  for (int repeat = 0; repeat < 3; ++repeat) {
    const LinearResults again = linear_on_gpu(gpu, d, true);
    EXPECT_TRUE(test::bitwise_equal(first.y, again.y));
    EXPECT_TRUE(test::bitwise_equal(first.dx, again.dx));
    EXPECT_TRUE(test::bitwise_equal(first.dw, again.dw));
    EXPECT_TRUE(test::bitwise_equal(first.dbias, again.dbias));
  }
}

TEST_F(CudaConvLinear, ALinearLayerNeedsItsWorkspace) {
  Gpu gpu(/*deterministic=*/false);
  const LinearData d({.m = 8, .k = 16, .n = 4}, 1);
  LinearForward a{.g = d.g,
                  .x = gpu.upload(d.x),
                  .w = gpu.upload(d.w),
                  .bias = gpu.upload(d.bias),
                  .y = gpu.output(d.dy.size())};
  const uint64_t with_bias = gpu.kernels().workspace_bytes(a);
  a.bias = nullptr;
  const uint64_t without = gpu.kernels().workspace_bytes(a);
  EXPECT_GT(without, 0u) << "cuBLAS runs on a workspace the plan owns";
  EXPECT_GE(with_bias, without + 8 * sizeof(float)) << "the bias needs a vector of M ones";
  a.ws = Workspace{nullptr, 0};
  EXPECT_THROW(gpu.kernels().launch(a, gpu.stream()), UnsupportedError);
  a.bias = gpu.upload(d.bias);
  a.ws = Workspace{gpu.output(with_bias / sizeof(float)), without};
  EXPECT_THROW(gpu.kernels().launch(a, gpu.stream()), UnsupportedError);
}

}  // namespace
}  // namespace ferry
