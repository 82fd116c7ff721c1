// What the layers above device/ ask of a backend (device/backend_traits.h): its copy protocol,
// whether its devices are GPUs, the FLOP model's default rates, whether it keeps timed algorithm
// choices in a file, the granule a sharing device holds memory in, and the kernels planning sizes
// workspaces with, here or without a GPU.
#include <gtest/gtest.h>

#include <string>
#include <variant>

#include "device/backend_traits.h"

namespace ferry {
namespace {

TEST(BackendTraits, CpuCopiesArePacedAndCudaCopiesAreGated) {
  EXPECT_EQ(backend_traits(Backend::kCpu).arbitration, CopyArbitration::kPaced);
  EXPECT_FALSE(backend_traits(Backend::kCpu).real_gpus);
  EXPECT_EQ(backend_traits(Backend::kCuda).arbitration, CopyArbitration::kGated);
  EXPECT_TRUE(backend_traits(Backend::kCuda).real_gpus);
  EXPECT_EQ(copy_arbitration_name(CopyArbitration::kPaced), "paced");
  EXPECT_EQ(copy_arbitration_name(CopyArbitration::kGated), "gated");
}

TEST(BackendTraits, ASharingDeviceHoldsWholeGranulesOfTwoMiB) {
  EXPECT_EQ(backend_traits(Backend::kCuda).shared_granule, uint64_t{2} << 20);
  EXPECT_EQ(backend_traits(Backend::kCpu).shared_granule, uint64_t{2} << 20);  // as a GPU would
}

TEST(BackendTraits, DefaultRatesFollowTheBackendAndTheEmulatedLink) {
  DeviceOptions cpu;
  cpu.cpu.threads = 4;
  DeviceRates r = default_device_rates(cpu);
  EXPECT_EQ(r.compute_flops, 2e11);  // 50 GFLOP/s per thread
  EXPECT_EQ(r.memory_gbps, 10);
  EXPECT_EQ(r.link_gbps, 8);
  cpu.cpu.link_gbps = 0.5;  // device.copy_gbps
  EXPECT_EQ(default_device_rates(cpu).link_gbps, 0.5);
  DeviceOptions cuda;
  cuda.backend = Backend::kCuda;
  cuda.cpu.threads = 4;  // not the GPU's business
  r = default_device_rates(cuda);
  EXPECT_EQ(r.compute_flops, 1e13);
  EXPECT_EQ(r.memory_gbps, 700);
  EXPECT_EQ(r.link_gbps, 12);
}

TEST(BackendTraits, OnlyDeterministicTimedCudaKeepsItsAlgorithmChoices) {
  DeviceOptions o;
  o.backend = Backend::kCuda;
  o.cuda.deterministic = true;
  EXPECT_TRUE(keeps_algorithm_choices(o));
  o.cuda.algorithms = AlgorithmSearch::kHeuristic;
  EXPECT_FALSE(keeps_algorithm_choices(o));
  o.cuda.algorithms = AlgorithmSearch::kTimed;
  o.cuda.deterministic = false;
  EXPECT_FALSE(keeps_algorithm_choices(o));
  o.backend = Backend::kCpu;
  o.cuda.deterministic = true;
  EXPECT_FALSE(keeps_algorithm_choices(o));
}

TEST(BackendTraits, PlanningKernelsOfTheCpuAnswerThemselves) {
  DeviceOptions o;
  o.cpu.threads = 1;
  EXPECT_TRUE(device_present(o));
  const PlanningKernels p = create_planning_kernels(o);
  ASSERT_NE(p.kernels, nullptr);
  EXPECT_TRUE(p.substitute.empty()) << p.substitute;
  EXPECT_TRUE(p.kernels->supports(kernel_kind<ConvForward>(), DType::kF32));
}

// No GPU at this ordinal on any machine: the CPU kernels stand in, cuda workspaces are zero.
TEST(BackendTraits, PlanningKernelsOfAnAbsentGpuModelZeroWorkspaces) {
  DeviceOptions o;
  o.backend = Backend::kCuda;
  o.ordinal = 1 << 20;
  o.cpu.threads = 1;
  EXPECT_FALSE(device_present(o));
  const PlanningKernels p = create_planning_kernels(o);
  ASSERT_NE(p.kernels, nullptr);
  EXPECT_NE(p.substitute.find("zero-workspace cuDNN algorithms"), std::string::npos)
      << p.substitute;
  EXPECT_TRUE(p.kernels->supports(kernel_kind<ConvForward>(), DType::kF32));
}

// With no GPU, which kernels run in which storage comes from the CUDA kernel table, not from the
// CPU stand-in (whose bf16 answer depends on this machine's avx512_bf16): Note [Workspaces
// without a GPU]. The fused attention core runs in bf16; the optimizers in fp32 only.
TEST(BackendTraits, PlanningKernelsOfAnAbsentGpuAnswerFromTheCudaKernelTable) {
  if (!backend_built(Backend::kCuda)) GTEST_SKIP() << "this build has no CUDA backend (its table)";
  DeviceOptions o;
  o.backend = Backend::kCuda;
  o.ordinal = 1 << 20;
  o.cpu.threads = 1;
  const PlanningKernels p = create_planning_kernels(o);
  ASSERT_NE(p.kernels, nullptr);
  for (KernelKind kind = 0; kind < std::variant_size_v<KernelArgs>; ++kind) {
    for (const DType dtype : {DType::kF32, DType::kBF16, DType::kF64}) {
      EXPECT_EQ(p.kernels->supports(kind, dtype), cuda_kernel_runs(kind, dtype))
          << kernel_name(kind) << " " << dtype_name(dtype);
    }
  }
  EXPECT_TRUE(cuda_kernel_runs(kernel_kind<FlashAttentionForward>(), DType::kBF16));
  EXPECT_TRUE(cuda_kernel_runs(kernel_kind<FlashAttentionBackward>(), DType::kBF16));
  EXPECT_TRUE(cuda_kernel_runs(kernel_kind<AdamWUpdate>(), DType::kF32));
  EXPECT_FALSE(cuda_kernel_runs(kernel_kind<AdamWUpdate>(), DType::kBF16));
  EXPECT_FALSE(cuda_kernel_runs(kernel_kind<ConvForward>(), DType::kF64));
}

}  // namespace
}  // namespace ferry
