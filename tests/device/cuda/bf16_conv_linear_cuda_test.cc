// cuDNN bf16 convolutions and cuBLAS bf16 linear layers (Note [Convolutions in bf16], Note
// [Linear layers in bf16]) against the CPU backend's fp32 kernels on the same bf16-valued
// inputs, which are exact in fp32: the GPU differs only by its fp32 accumulation order and the
// roundings bf16 storage adds. Outputs in bf16 must be within 2 bf16 steps of the reference
// (one rounding, plus the conv bias's second) or within one bf16 step of the largest |value|;
// the conv's fp32 dw (rounded to bf16 once) within one step relative plus one step of the
// largest |value|; the other fp32 gradients within 1e-4 (fp32 summation orders). Skips without
// a GPU, or on a GPU before compute capability 8.0.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <random>
#include <vector>

#include <fmt/format.h>

#include "common/error.h"
#include "device/bf16.h"
#include "device/cuda/cuda_check.h"
#include "device/cuda/cuda_device.h"
#include "device/cuda/cuda_stream.h"
#include "device/device.h"
#include "tests/device/cpu/kernel_test_util.h"

namespace ferry {
namespace {

constexpr uint64_t kMiB = 1ull << 20;

std::vector<float> bf16_values(size_t n, std::mt19937& rng) {
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = round_to_bf16(dist(rng));
  return v;
}

std::vector<uint16_t> bits_of(const std::vector<float>& v) {
  std::vector<uint16_t> b(v.size());
  for (size_t i = 0; i < v.size(); ++i) b[i] = float_to_bf16(v[i]).bits;
  return b;
}

// |got - want| <= rel |want| + step * max |want| everywhere; names the worst element.
::testing::AssertionResult near(const std::vector<float>& got, const std::vector<float>& want,
                                double rel, double step, const char* what) {
  if (got.size() != want.size()) return ::testing::AssertionFailure() << what << ": sizes differ";
  double scale = 0.0;
  for (float w : want) scale = std::max(scale, std::fabs(static_cast<double>(w)));
  for (size_t i = 0; i < got.size(); ++i) {
    const double err = std::fabs(static_cast<double>(got[i]) - want[i]);
    if (!(err <= rel * std::fabs(want[i]) + step * scale)) {
      return ::testing::AssertionFailure() << what << " [" << i << "]: cuda " << got[i] << " cpu "
                                           << want[i] << " (max |cpu| " << scale << ")";
    }
  }
  return ::testing::AssertionSuccess();
}

constexpr double kStep = 1.0 / 256;  // one bf16 step, relative

// A bf16 CUDA device and transfers on its compute stream.
class Bf16Gpu {
 public:
  Bf16Gpu() {
    DeviceOptions o;
    o.backend = Backend::kCuda;
    o.memory = 512 * kMiB;
    o.precision = Precision::kBf16;
    o.cuda.deterministic = true;
    o.workspace_limit = 64 * kMiB;
    device_ = create_device(o);
  }
  ~Bf16Gpu() {
    device_->synchronize();
    for (void* p : owned_) device_->memory().release(p);
  }
  cudaStream_t handle() { return cuda::as_cuda(device_->stream(StreamKind::kCompute)).handle(); }
  void* alloc(size_t bytes) {
    void* p = device_->memory().allocate(std::max<size_t>(bytes, 1), "test");
    owned_.push_back(p);
    CUDA_CHECK(cudaMemsetAsync(p, 0xff, std::max<size_t>(bytes, 1), handle()));
    return p;
  }
  template <typename T>
  float* upload(const std::vector<T>& v) {
    void* p = alloc(v.size() * sizeof(T));
    CUDA_CHECK(
        cudaMemcpyAsync(p, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice, handle()));
    device_->synchronize();
    return static_cast<float*>(p);
  }
  std::vector<float> download_bf16(const float* p, size_t n) {
    device_->synchronize();
    std::vector<uint16_t> b(n);
    CUDA_CHECK(cudaMemcpyAsync(b.data(), p, n * 2, cudaMemcpyDeviceToHost, handle()));
    device_->synchronize();
    std::vector<float> v(n);
    for (size_t i = 0; i < n; ++i) v[i] = bf16_to_float(BF16{b[i]});
    return v;
  }
  std::vector<float> download_f32(const float* p, size_t n) {
    device_->synchronize();
    std::vector<float> v(n);
    CUDA_CHECK(cudaMemcpyAsync(v.data(), p, n * 4, cudaMemcpyDeviceToHost, handle()));
    device_->synchronize();
    return v;
  }
  template <typename Args>
  void run(Args args) {
    Kernels& k = device_->kernels();
    ASSERT_TRUE(k.supports(KernelArgs(args).index(), DType::kBF16));
    const uint64_t bytes = k.workspace_bytes(args);
    void* ws = bytes > 0 ? device_->memory().allocate(bytes, "workspace") : nullptr;
    args.ws = Workspace{ws, bytes};
    k.launch(args, device_->stream(StreamKind::kCompute));
    device_->synchronize();
    if (ws != nullptr) device_->memory().release(ws);
  }

 private:
  std::unique_ptr<Device> device_;
  std::vector<void*> owned_;
};

class CudaBf16ConvLinear : public ::testing::Test {
 protected:
  void SetUp() override {
    if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device present";
    try {
      gpu_ = std::make_unique<Bf16Gpu>();
    } catch (const ConfigError& e) {
      GTEST_SKIP() << e.what();  // a GPU before sm_80
    }
  }
  std::unique_ptr<Bf16Gpu> gpu_;
};

TEST_F(CudaBf16ConvLinear, ConvolutionsMatchTheFp32Reference) {
  std::mt19937 rng(301);
  const ConvGeom cases[] = {
      {.n = 2, .c = 3, .h = 7, .w = 5, .k = 4, .r = 3, .s = 3, .pad_h = 1, .pad_w = 1},
      {.n = 3,
       .c = 6,
       .h = 9,
       .w = 11,
       .k = 9,
       .r = 3,
       .s = 3,
       .stride_h = 2,
       .stride_w = 2,
       .pad_h = 1,
       .pad_w = 1,
       .groups = 3},
      {.n = 4, .c = 64, .h = 16, .w = 16, .k = 32, .r = 3, .s = 3, .pad_h = 1, .pad_w = 1}};
  for (const ConvGeom& g : cases) {
    SCOPED_TRACE(fmt::format("N{} C{} {}x{} K{} g{}", g.n, g.c, g.h, g.w, g.k, g.groups));
    const size_t nx = g.n * g.c * g.h * g.w, ny = g.n * g.k * g.out_h() * g.out_w(),
                 nw = g.k * (g.c / g.groups) * g.r * g.s;
    const std::vector<float> x = bf16_values(nx, rng), w = bf16_values(nw, rng),
                             dy = bf16_values(ny, rng), bias = bf16_values(g.k, rng);
    std::vector<float> y(ny), dx(nx), dw(nw), db(g.k);
    test::KernelRunner cpu;
    cpu.run(ConvForward{.g = g, .x = x.data(), .w = w.data(), .bias = bias.data(), .y = y.data()});
    cpu.run(ConvBackwardData{.g = g, .dy = dy.data(), .w = w.data(), .dx = dx.data()});
    cpu.run(ConvBackwardWeights{
        .g = g, .x = x.data(), .dy = dy.data(), .dw = dw.data(), .dbias = db.data()});
    Bf16Gpu& d = *gpu_;
    const float* gx = d.upload(bits_of(x));
    const float* gw = d.upload(bits_of(w));
    const float* gdy = d.upload(bits_of(dy));
    float* gy = static_cast<float*>(d.alloc(ny * 2));
    float* gdx = static_cast<float*>(d.alloc(nx * 2));
    float* gdw = static_cast<float*>(d.alloc(nw * 4));
    float* gdb = static_cast<float*>(d.alloc(g.k * 4));
    d.run(ConvForward{
        .g = g, .x = gx, .w = gw, .bias = d.upload(bias), .y = gy, .dtype = DType::kBF16});
    d.run(ConvBackwardData{.g = g, .dy = gdy, .w = gw, .dx = gdx, .dtype = DType::kBF16});
    d.run(ConvBackwardWeights{
        .g = g, .x = gx, .dy = gdy, .dw = gdw, .dbias = gdb, .dtype = DType::kBF16});
    EXPECT_TRUE(near(d.download_bf16(gy, ny), y, 2 * kStep, kStep, "y"));
    EXPECT_TRUE(near(d.download_bf16(gdx, nx), dx, kStep, kStep, "dx"));
    EXPECT_TRUE(near(d.download_f32(gdw, nw), dw, kStep, kStep, "dw"));
    EXPECT_TRUE(near(d.download_f32(gdb, g.k), db, 1e-4, 1e-4, "dbias"));
  }
}

TEST_F(CudaBf16ConvLinear, LinearLayersMatchTheFp32Reference) {
  std::mt19937 rng(302);
  for (const bool in_out : {false, true}) {
    const LinearGeom g{.m = 37, .k = 65, .n = 29, .weight_in_out = in_out};
    SCOPED_TRACE(in_out ? "weight (K, N)" : "weight (N, K)");
    const std::vector<float> x = bf16_values(g.m * g.k, rng), w = bf16_values(g.n * g.k, rng),
                             dy = bf16_values(g.m * g.n, rng), bias = bf16_values(g.n, rng);
    std::vector<float> y(g.m * g.n), dx(g.m * g.k), dw(g.n * g.k), db(g.n);
    test::KernelRunner cpu;
    cpu.run(
        LinearForward{.g = g, .x = x.data(), .w = w.data(), .bias = bias.data(), .y = y.data()});
    cpu.run(LinearBackwardData{.g = g, .dy = dy.data(), .w = w.data(), .dx = dx.data()});
    cpu.run(LinearBackwardWeights{
        .g = g, .x = x.data(), .dy = dy.data(), .dw = dw.data(), .dbias = db.data()});
    Bf16Gpu& d = *gpu_;
    const float* gx = d.upload(bits_of(x));
    const float* gw = d.upload(bits_of(w));
    const float* gdy = d.upload(bits_of(dy));
    float* gy = static_cast<float*>(d.alloc(y.size() * 2));
    float* gdx = static_cast<float*>(d.alloc(dx.size() * 2));
    float* gdw = static_cast<float*>(d.alloc(dw.size() * 4));
    float* gdb = static_cast<float*>(d.alloc(db.size() * 4));
    d.run(LinearForward{
        .g = g, .x = gx, .w = gw, .bias = d.upload(bias), .y = gy, .dtype = DType::kBF16});
    d.run(LinearBackwardData{.g = g, .dy = gdy, .w = gw, .dx = gdx, .dtype = DType::kBF16});
    d.run(LinearBackwardWeights{
        .g = g, .x = gx, .dy = gdy, .dw = gdw, .dbias = gdb, .dtype = DType::kBF16});
    // One rounding each; dw and dbias are fp32 products of exact bf16 values.
    EXPECT_TRUE(near(d.download_bf16(gy, y.size()), y, kStep, kStep / 4, "y"));
    EXPECT_TRUE(near(d.download_bf16(gdx, dx.size()), dx, kStep, kStep / 4, "dx"));
    EXPECT_TRUE(near(d.download_f32(gdw, dw.size()), dw, 1e-4, 1e-4, "dw"));
    EXPECT_TRUE(near(d.download_f32(gdb, db.size()), db, 1e-4, 1e-4, "dbias"));
  }
}

}  // namespace
}  // namespace ferry
