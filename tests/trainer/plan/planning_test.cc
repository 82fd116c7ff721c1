// The offline planner (trainer plan, --max-batch, the banner): a cuda plan without a GPU models
// its workspaces with stand-ins and says so; bf16 plans (issue 28) hold at most 0.55 of fp32's
// activation bytes and offloads, and fp32 plans are unchanged by the precision machinery; a
// bf16 cuda plan asks the CUDA kernel table which kernels run in bf16.
#include "trainer/plan/planning.h"

#include <cstdio>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "common/bytes.h"
#include "common/error.h"
#include "device/backend_traits.h"
#include "device/device.h"
#include "trainer/config/config.h"

namespace ferry {
namespace {

TEST(OfflinePlanner, ACudaPlanWithoutAGpuModelsTheWorkspaces) {
  const Config cpu = parse_config_text("model: {name: lenet5}\n");
  EXPECT_FALSE(OfflinePlanner(cpu).substituted());
  const Config cuda = parse_config_text("model: {name: lenet5}\ndevice: {backend: cuda}\n");
  OfflinePlanner planner(cuda);
  EXPECT_EQ(planner.substituted(), cuda_device_count() == 0);
  EXPECT_GT(planner.plan(MemoryPolicy::kNone, 8).peak_bytes(), 0u);
}

// The issue's three models at their batch: VGG-16 and ResNet-50 on ImageNet at 256, gpt2 at
// 8 x 1024 (a cuda plan: the GPU's workspaces, modelled without one).
std::string issue_model(const std::string& name) {
  if (name == "gpt2") {
    return "model: {name: gpt2}\ndata: {source: tokens, path: x.bin, batch_size: 8}\n"
           "device: {backend: cuda, memory: 80GiB}\n";
  }
  return "model: {name: " + name +
         ", classes: 1000, input: [3, 224, 224]}\ndata: {batch_size: 256}\n"
         "device: {backend: cuda, memory: 80GiB}\n";
}

// The activation arena at its fullest step (activations, their gradients, workspaces) under
// none, and vdnn-all's bytes offloaded per step.
struct Bytes {
  uint64_t arena = 0, activations = 0, offload = 0;
};

Bytes planned(const std::string& yaml, const std::string& precision) {
  OfflinePlanner planner(parse_config_text(yaml, {"device.precision=" + precision}));
  const Config c = parse_config_text(yaml);
  const MemoryPlan none = planner.plan(MemoryPolicy::kNone, c.data.batch_size, false);
  const MemoryPlan all = planner.plan(MemoryPolicy::kVdnnAll, c.data.batch_size, false);
  return {none.peak_bytes() - none.persistent.total(), none.activation_bytes, all.offload_bytes};
}

TEST(OfflinePlanner, Bf16HalvesTheActivationArenaAndTheOffloads) {
  for (const std::string name : {"vgg16", "resnet50", "gpt2"}) {
    const Bytes f = planned(issue_model(name), "fp32");
    const Bytes b = planned(issue_model(name), "bf16");
    const double arena = static_cast<double>(b.arena) / static_cast<double>(f.arena);
    const double offload = static_cast<double>(b.offload) / static_cast<double>(f.offload);
    std::printf(
        "%-9s arena (none) fp32 %s bf16 %s (%.3f); activations %s -> %s; vdnn-all "
        "offload/step fp32 %s bf16 %s (%.3f)\n",
        name.c_str(), format_bytes(f.arena).c_str(), format_bytes(b.arena).c_str(), arena,
        format_bytes(f.activations).c_str(), format_bytes(b.activations).c_str(),
        format_bytes(f.offload).c_str(), format_bytes(b.offload).c_str(), offload);
    EXPECT_LE(arena, 0.55) << name;
    EXPECT_LE(offload, 0.55) << name;
    EXPECT_GT(arena, 0.4) << name << ": more than halved, so something fp32 went missing";
  }
}

// device.precision fp32 leaves every planned byte as it was (the persistent bytes gain only a
// zero working copy), and bf16 adds the weights' bf16 working copy.
TEST(OfflinePlanner, PersistentBytesByPrecision) {
  const std::string yaml = "model: {name: resnet18_cifar}\n";
  OfflinePlanner fp32(parse_config_text(yaml));
  OfflinePlanner bf16(parse_config_text(yaml, {"device.precision=bf16"}));
  EXPECT_EQ(fp32.persistent().working_weights, 0u);
  EXPECT_EQ(bf16.persistent().working_weights, fp32.persistent().weights / 2);
  EXPECT_EQ(bf16.persistent().weights, fp32.persistent().weights);
  EXPECT_EQ(bf16.persistent().optimizer, fp32.persistent().optimizer);
  const DTypeBytes f = tape_dtype_bytes(fp32.lowered(32).tape);
  const DTypeBytes b = tape_dtype_bytes(bf16.lowered(32).tape);
  EXPECT_EQ(f.bf16, 0u);
  EXPECT_EQ(b.bf16 / 2 + b.f32 / 4, f.f32 / 4) << "every fp32 element is still there, once";
  EXPECT_EQ(b.other, f.other);
}

// Note [bf16 kernels at plan time]: a bf16 plan for the cuda backend, with no GPU here, asks the
// CUDA kernel table. Every kernel the zoo's transformers launch is in it in bf16 (the fused
// attention core, RMSNorm, rotary qkv, SwiGLU), so both plan; a kernel the table lacked would be
// refused in one line (CheckBf16Kernels.* tests the line).
TEST(OfflinePlanner, Bf16OnCudaPlansTheZoosTransformersFromTheCudaKernelTable) {
  if (!backend_built(Backend::kCuda)) GTEST_SKIP() << "this build has no CUDA backend (its table)";
  const std::string gpt =
      "model: {name: gpt2, layers: 1, width: 32, heads: 2, context: 16}\n"
      "data: {source: tokens, path: x.bin, batch_size: 2}\ndevice: {backend: cuda}\n";
  EXPECT_TRUE(cuda_kernel_runs(kernel_kind<FlashAttentionForward>(), DType::kBF16));
  EXPECT_TRUE(cuda_kernel_runs(kernel_kind<FlashAttentionBackward>(), DType::kBF16));
  EXPECT_NO_THROW(OfflinePlanner(parse_config_text(gpt, {"device.precision=bf16"})));
  EXPECT_NO_THROW(
      OfflinePlanner(parse_config_text(gpt, {"device.precision=bf16", "model.attention=naive"})));

  const std::string llama =
      "model: {name: llama, layers: 1, width: 32, heads: 2, ffn: 48, context: 16}\n"
      "data: {source: tokens, path: x.bin, batch_size: 2}\ndevice: {backend: cuda}\n";
  for (const KernelKind kind : {kernel_kind<RmsNormForward>(), kernel_kind<RmsNormBackward>(),
                                kernel_kind<RopeQkvForward>(), kernel_kind<RopeQkvBackward>(),
                                kernel_kind<SwigluForward>(), kernel_kind<SwigluBackward>()}) {
    EXPECT_TRUE(cuda_kernel_runs(kind, DType::kBF16)) << kernel_name(kind);
  }
  EXPECT_NO_THROW(OfflinePlanner(parse_config_text(llama)));
  EXPECT_NO_THROW(OfflinePlanner(parse_config_text(llama, {"device.precision=bf16"})));
  // The cpu backend's bf16 kernels depend on the machine's instructions: planning leaves the
  // refusal to training there.
  EXPECT_NO_THROW(
      OfflinePlanner(parse_config_text(llama, {"device.precision=bf16", "device.backend=cpu"})));
}

}  // namespace
}  // namespace ferry
