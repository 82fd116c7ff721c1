// The CUDA backend as the registry sees it, and its kernel table: device count, the errors for
// a missing GPU, and which kernels it claims. These run on machines without a GPU.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <string>
#include <variant>

#include "common/error.h"
#include "device/cuda/cuda_device.h"
#include "device/cuda/cuda_kernels.h"
#include "device/device.h"

namespace ferry {
namespace {

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

DeviceOptions cuda_options(int ordinal) {
  DeviceOptions options;
  options.backend = Backend::kCuda;
  options.memory = 64ull << 20;
  options.ordinal = ordinal;
  return options;
}

TEST(CudaRegistry, DeviceCountMatchesTheRuntime) {
  const int count = cuda::device_count();
  int runtime = 0;
  const cudaError_t status = cudaGetDeviceCount(&runtime);
  // Without a driver or a GPU the query fails, and that means none present.
  EXPECT_EQ(count, status == cudaSuccess ? runtime : 0) << cudaGetErrorName(status);
  EXPECT_EQ(cuda::device_count(), count);  // asking again changes nothing
  EXPECT_EQ(cuda_device_count(), count);   // the registry asks this backend
  EXPECT_TRUE(backend_built(Backend::kCuda));
}

TEST(CudaRegistry, NoGpuIsUnsupportedWithAHint) {
  if (cuda::device_count() > 0) {
    GTEST_SKIP() << "a CUDA device is present; this checks the message for a machine without one";
  }
  try {
    create_device(cuda_options(0));
    FAIL() << "create_device made a CUDA device without a GPU";
  } catch (const UnsupportedError& e) {
    EXPECT_TRUE(contains(e.what(), "0 CUDA device(s) are present")) << e.what();
    EXPECT_TRUE(contains(e.hint(), "device.backend=cpu")) << e.hint();
  }
}

TEST(CudaRegistry, OrdinalOutsideTheDeviceCountIsUnsupported) {
  const int count = cuda::device_count();
  try {
    create_device(cuda_options(count));
    FAIL() << "create_device accepted ordinal " << count;
  } catch (const UnsupportedError& e) {
    EXPECT_TRUE(contains(e.what(), "wanted ordinal " + std::to_string(count))) << e.what();
  }
  try {
    create_device(cuda_options(-1));
    FAIL() << "create_device accepted ordinal -1";
  } catch (const UnsupportedError& e) {
    EXPECT_TRUE(contains(e.what(), "CUDA device -1 is not present")) << e.what();
  }
}

// A stream no kernel may touch: refused kernels must throw before using it.
class UntouchableStream : public Stream {
 public:
  StreamKind kind() const override { return StreamKind::kCompute; }
  void record(Event&) override { ADD_FAILURE() << "record"; }
  void wait(Event&) override { ADD_FAILURE() << "wait"; }
  void synchronize() override { ADD_FAILURE() << "synchronize"; }
};

// Convolution and linear (cuDNN / cuBLAS) are not wired yet; every other kernel runs.
bool is_conv_or_linear(KernelKind kind) {
  return kind == kernel_kind<ConvForward>() || kind == kernel_kind<ConvBackwardData>() ||
         kind == kernel_kind<ConvBackwardWeights>() || kind == kernel_kind<LinearForward>() ||
         kind == kernel_kind<LinearBackwardData>() || kind == kernel_kind<LinearBackwardWeights>();
}

TEST(CudaKernels, SupportsEveryKernelButConvAndLinearOnFloat32Only) {
  cuda::CudaKernels kernels(0);
  for (KernelKind kind = 0; kind < std::variant_size_v<KernelArgs>; ++kind) {
    EXPECT_EQ(kernels.supports(kind, DType::kF32), !is_conv_or_linear(kind)) << kernel_name(kind);
    EXPECT_FALSE(kernels.supports(kind, DType::kF64)) << kernel_name(kind);
  }
  EXPECT_TRUE(kernels.supports(kernel_kind<Fill>(), DType::kF32));
  EXPECT_TRUE(kernels.supports(kernel_kind<SgdUpdate>(), DType::kF32));
  EXPECT_TRUE(kernels.supports(kernel_kind<BatchNormBackward>(), DType::kF32));
  EXPECT_FALSE(kernels.supports(kernel_kind<ConvForward>(), DType::kF32));
  EXPECT_FALSE(kernels.supports(std::variant_size_v<KernelArgs>, DType::kF32));
}

TEST(CudaKernels, UnsupportedKernelIsRefusedByName) {
  cuda::CudaKernels kernels(0);
  UntouchableStream stream;
  try {
    kernels.launch(ConvForward{}, stream);
    FAIL() << "launch accepted conv_forward";
  } catch (const UnsupportedError& e) {
    EXPECT_STREQ(e.what(), "the CUDA backend has no conv_forward kernel yet");
    EXPECT_TRUE(contains(e.hint(), "device.backend=cpu")) << e.hint();
  }
  try {
    kernels.launch(LinearBackwardWeights{}, stream);
    FAIL() << "launch accepted linear_backward_weights";
  } catch (const UnsupportedError& e) {
    EXPECT_STREQ(e.what(), "the CUDA backend has no linear_backward_weights kernel yet");
  }
  EXPECT_THROW(kernels.workspace_bytes(LinearForward{}), UnsupportedError);
  EXPECT_EQ(kernels.workspace_bytes(Fill{}), 0u);
  EXPECT_EQ(kernels.workspace_bytes(Scale{}), 0u);
  EXPECT_EQ(kernels.workspace_bytes(BatchNormForwardTraining{}), 0u);
  EXPECT_EQ(kernels.workspace_bytes(SoftmaxCrossEntropyForward{}), 0u);
}

}  // namespace
}  // namespace ferry
