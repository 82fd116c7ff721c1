// missing_bf16_kernel (trainer/exec/step_kernels.h), the check behind device.precision bf16's
// refusal of a model whose steps lack a bf16 kernel: a tiny Llama in bf16 finds every kernel on
// the CPU backend, and a backend that lacks one is named by its first missing kernel;
// check_bf16_kernels turns that into the one-line refusal.
#include "trainer/exec/step_kernels.h"

#include <gtest/gtest.h>

#include "common/error.h"
#include "device/cpu/cpu_kernels.h"
#include "trainer/exec/lower.h"
#include "trainer/model/precision.h"
#include "trainer/model/zoo/zoo.h"

namespace ferry {
namespace {

// The CPU backend's kernels, but `lacking` is not run in bf16 storage.
class KernelsWithout : public Kernels {
 public:
  KernelsWithout(Kernels& inner, KernelKind lacking) : inner_(inner), lacking_(lacking) {}
  bool supports(KernelKind kind, DType dtype) const override {
    if (kind == lacking_ && dtype == DType::kBF16) return false;
    return inner_.supports(kind, dtype);
  }
  uint64_t workspace_bytes(const KernelArgs& args) override { return inner_.workspace_bytes(args); }
  void launch(const KernelArgs& args, Stream& stream) override { inner_.launch(args, stream); }

 private:
  Kernels& inner_;
  KernelKind lacking_;
};

Graph tiny_llama(Precision precision) {
  TransformerSizes sizes;
  sizes.layers = 1;
  sizes.heads = 2;
  sizes.kv_heads = 1;
  sizes.width = 16;
  sizes.ffn = 24;
  sizes.vocab = 32;
  sizes.context = 8;
  Graph g = build_token_model("llama", 2, 8, sizes);
  apply_precision(g, precision);
  return g;
}

TEST(MissingBf16Kernel, ALlamaFindsEveryKernelOnTheCpuBackend) {
  cpu::CpuKernels kernels(1);
  if (!kernels.supports(kernel_kind<ConvForward>(), DType::kBF16))
    GTEST_SKIP() << "this CPU has no avx512_bf16: no bf16 kernels to look for";
  const Graph g = tiny_llama(Precision::kBf16);
  const Lowered lowered = lower_graph(g, kernels, true);
  EXPECT_EQ(missing_bf16_kernel(g, lowered, kernels), "");
}

TEST(MissingBf16Kernel, NamesTheFirstKernelABackendLacks) {
  cpu::CpuKernels cpu_kernels(1);
  if (!cpu_kernels.supports(kernel_kind<ConvForward>(), DType::kBF16))
    GTEST_SKIP() << "this CPU has no avx512_bf16: no bf16 kernels to look for";
  KernelsWithout kernels(cpu_kernels, kernel_kind<SwigluBackward>());
  const Graph g = tiny_llama(Precision::kBf16);
  const Lowered lowered = lower_graph(g, kernels, true);
  EXPECT_EQ(missing_bf16_kernel(g, lowered, kernels), "swiglu_backward");
  // In fp32 no step asks for bf16 storage.
  const Graph wide = tiny_llama(Precision::kFp32);
  EXPECT_EQ(missing_bf16_kernel(wide, lower_graph(wide, kernels, true), kernels), "");
}

// What train, plan and simulate say: one line naming the kernel, the model and the backend.
TEST(CheckBf16Kernels, RefusesInOneLineNamingTheKernelTheModelAndTheBackend) {
  cpu::CpuKernels cpu_kernels(1);
  if (!cpu_kernels.supports(kernel_kind<ConvForward>(), DType::kBF16))
    GTEST_SKIP() << "this CPU has no avx512_bf16: no bf16 kernels to look for";
  KernelsWithout kernels(cpu_kernels, kernel_kind<RmsNormForward>());
  const Graph g = tiny_llama(Precision::kBf16);
  const Lowered lowered = lower_graph(g, kernels, true);
  try {
    check_bf16_kernels(g, lowered, kernels, "llama", Backend::kCuda);
    ADD_FAILURE() << "a lacking bf16 kernel was not refused";
  } catch (const ConfigError& e) {
    EXPECT_STREQ(e.what(),
                 "device.precision: bf16 needs a bf16 rms_norm_forward kernel for model 'llama', "
                 "which the cuda backend does not have yet");
  }
  EXPECT_NO_THROW(check_bf16_kernels(g, lower_graph(g, cpu_kernels, true), cpu_kernels, "llama",
                                     Backend::kCuda));
}

}  // namespace
}  // namespace ferry
