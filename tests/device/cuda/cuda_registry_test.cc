// The CUDA backend as the registry sees it, and its kernel table: device count, the errors for
// a missing GPU, and which kernels it claims. These run on machines without a GPU.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "common/error.h"
#include "device/cpu/cpu_kernels.h"
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

// Every kernel of KernelArgs runs on the CUDA backend (a kernel added to the interface without a
// CUDA implementation fails here), on float32 only; stateless kernels need no workspace.
TEST(CudaKernels, SupportsEveryKernelOnFloat32Only) {
  cuda::CudaKernels kernels(0);
  for (KernelKind kind = 0; kind < std::variant_size_v<KernelArgs>; ++kind) {
    EXPECT_TRUE(kernels.supports(kind, DType::kF32)) << kernel_name(kind);
    EXPECT_FALSE(kernels.supports(kind, DType::kF64)) << kernel_name(kind);
  }
  EXPECT_FALSE(kernels.supports(std::variant_size_v<KernelArgs>, DType::kF32));
  EXPECT_EQ(kernels.workspace_bytes(Fill{}), 0u);
  EXPECT_EQ(kernels.workspace_bytes(Scale{}), 0u);
  EXPECT_EQ(kernels.workspace_bytes(BatchNormForwardTraining{}), 0u);
  EXPECT_EQ(kernels.workspace_bytes(SoftmaxCrossEntropyForward{}), 0u);
}

// bf16 storage (Note [bf16 storage in the CUDA kernels]): every kernel with a dtype field (Note
// [Storage dtype of a kernel]) runs in bf16, the fused attention core included (Note [Fused
// attention in bf16 on CUDA]); the kernels without the field (the optimizers, copies, gradient
// clipping, the Llama kernels) are fp32 only.
template <size_t I>
constexpr bool has_dtype_field() {
  return requires(std::variant_alternative_t<I, KernelArgs> a) { a.dtype; };
}

TEST(CudaKernels, SupportsBf16StorageForTheKernelsWithADtype) {
  cuda::CudaKernels kernels(0);
  std::vector<bool> has(std::variant_size_v<KernelArgs>);
  [&]<size_t... I>(std::index_sequence<I...>) { ((has[I] = has_dtype_field<I>()), ...); }
  (std::make_index_sequence<std::variant_size_v<KernelArgs>>{});
  int bf16_kinds = 0;
  for (KernelKind kind = 0; kind < std::variant_size_v<KernelArgs>; ++kind) {
    EXPECT_EQ(kernels.supports(kind, DType::kBF16), has[kind]) << kernel_name(kind);
    bf16_kinds += kernels.supports(kind, DType::kBF16) ? 1 : 0;
  }
  // Conv and linear (3 each), pooling and adaptive pooling (2 each), batch norm (3), ReLU (2),
  // add, accumulate, fill, scale, dropout (2), the loss (2), embedding, layer norm, GELU,
  // attention, fused attention, RMSNorm, rotary qkv and SwiGLU (2 each).
  EXPECT_EQ(bf16_kinds, 39);
  EXPECT_TRUE(kernels.supports(kernel_kind<FlashAttentionForward>(), DType::kBF16));
  EXPECT_TRUE(kernels.supports(kernel_kind<FlashAttentionBackward>(), DType::kBF16));
  EXPECT_FALSE(kernels.supports(kernel_kind<AdamWUpdate>(), DType::kBF16));
  EXPECT_TRUE(kernels.supports(kernel_kind<RmsNormForward>(), DType::kBF16));
  EXPECT_FALSE(kernels.supports(kernel_kind<ReluForward>(), DType::kF64));
}

// device.precision bf16 on the cuda backend needs compute capability 8.0 (bf16 tensor cores):
// the rule create_cuda_device applies, as a pure function (no GPU here to refuse).
TEST(CudaRegistry, Bf16IsRefusedBeforeComputeCapability8) {
  EXPECT_EQ(cuda::bf16_gpu_gap(8, 0, "NVIDIA A100-SXM4-80GB"), "");
  EXPECT_EQ(cuda::bf16_gpu_gap(8, 6, "NVIDIA RTX A6000"), "");
  EXPECT_EQ(cuda::bf16_gpu_gap(9, 0, "NVIDIA H100 PCIe"), "");
  EXPECT_EQ(cuda::bf16_gpu_gap(7, 0, "Tesla V100-SXM2-16GB"),
            "device.precision: bf16 needs a GPU of compute capability 8.0 or newer (A100, H100), "
            "but Tesla V100-SXM2-16GB is 7.0");
  EXPECT_NE(cuda::bf16_gpu_gap(7, 5, "Tesla T4"), "");
  EXPECT_NE(cuda::bf16_gpu_gap(6, 0, "Tesla P100"), "");
}

// Geometry is checked before any GPU is touched, with the CPU backend's messages.
TEST(CudaKernels, InvalidGeometryIsAConfigErrorWithoutTouchingTheGpu) {
  cuda::CudaKernels kernels(0);
  ConvGeom bad;
  bad.c = 6;
  bad.k = 4;
  bad.groups = 4;  // 6 channels do not split into 4 groups
  EXPECT_THROW(kernels.workspace_bytes(ConvForward{.g = bad}), ConfigError);
  EXPECT_THROW(kernels.workspace_bytes(ConvBackwardWeights{.g = bad}), ConfigError);
  ConvGeom too_small;
  too_small.h = 2;
  too_small.r = 3;  // a 3-row kernel over 2 unpadded rows
  EXPECT_THROW(kernels.workspace_bytes(ConvBackwardData{.g = too_small}), ConfigError);
  too_small.stride_h = 2;  // (2 - 3) / 2 + 1 rounds to one output row: still too small
  EXPECT_THROW(kernels.workspace_bytes(ConvForward{.g = too_small}), ConfigError);
  EXPECT_THROW(kernels.workspace_bytes(LinearForward{.g = {.m = 0, .k = 3, .n = 2}}), ConfigError);
  EXPECT_THROW(kernels.workspace_bytes(LinearBackwardWeights{.g = {.m = 2, .k = 3, .n = -1}}),
               ConfigError);
}

// Convolution and linear geometry errors read as on the CPU backend, hint included: both run
// device/kernel_checks.h first (cuDNN's and cuBLAS's own int limits come after).
TEST(CudaKernels, GeometryErrorsReadAsOnTheCpu) {
  cuda::CudaKernels gpu(0);
  cpu::CpuKernels cpu(1);
  const auto config_error = [](Kernels& kernels, const KernelArgs& args) -> std::string {
    try {
      kernels.workspace_bytes(args);
    } catch (const ConfigError& e) {
      return std::string(e.what()) + " | " + e.hint();
    }
    ADD_FAILURE() << "no ConfigError";
    return {};
  };
  ConvGeom strided;
  strided.h = 2;
  strided.r = 3;
  strided.stride_h = 2;  // (2 - 3) / 2 + 1 rounds to one row: a 3-row kernel over 2 rows
  ConvGeom groups;
  groups.c = 6;
  groups.k = 4;
  groups.groups = 4;
  const std::vector<KernelArgs> bad = {
      ConvForward{.g = strided},          ConvBackwardData{.g = groups},
      ConvBackwardWeights{.g = strided},  LinearForward{.g = {.m = 0}},
      LinearBackwardData{.g = {.k = -1}}, LinearBackwardWeights{.g = {.n = 0}},
  };
  for (const KernelArgs& args : bad) {
    SCOPED_TRACE(kernel_name(args));
    const std::string on_cpu = config_error(cpu, args);
    EXPECT_NE(on_cpu.find(kernel_name(args)), std::string::npos) << on_cpu;
    EXPECT_EQ(config_error(gpu, args), on_cpu);
  }
}

}  // namespace
}  // namespace ferry
