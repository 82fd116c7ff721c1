// `trainer plan` as a user meets it (issue 27): --json reports the input one sample reads (tokens
// per row for a token model, not an image's [C, H, W]); planning many shapes says so on stderr
// and shows progress instead of printing nothing for minutes.
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "device/backend_traits.h"
#include "tests/trainer/integration/run_util.h"

namespace ferry::testing {
namespace {

// The bf16 kernels the Llama model launches that the CUDA kernel table lacks (Note [bf16 kernels
// at plan time] in trainer/plan/planning.cc).
std::vector<std::string> llama_kernels_cuda_lacks_in_bf16() {
  std::vector<std::string> lacking;
  for (const KernelKind kind : {kernel_kind<RmsNormForward>(), kernel_kind<RmsNormBackward>(),
                                kernel_kind<RopeQkvForward>(), kernel_kind<RopeQkvBackward>(),
                                kernel_kind<SwigluForward>(), kernel_kind<SwigluBackward>()}) {
    if (!cuda_kernel_runs(kind, DType::kBF16)) lacking.emplace_back(kernel_name(kind));
  }
  return lacking;
}

// `output` is the one-line refusal of a bf16 llama naming one of `lacking`, with its hint.
void expect_llama_refusal(const std::string& output, const std::vector<std::string>& lacking) {
  EXPECT_NE(output.find("error: device.precision: bf16 needs a bf16 "), std::string::npos)
      << output;
  EXPECT_NE(output.find(" kernel for model 'llama', which the cuda backend does not have yet\n"
                        "hint: set device.precision=fp32 for this model"),
            std::string::npos)
      << output;
  bool names_one = false;
  for (const std::string& k : lacking) {
    names_one |= output.find("bf16 " + k + " kernel") != std::string::npos;
  }
  EXPECT_TRUE(names_one) << output;
}

std::string plan(const std::string& args) {
  return "cd " + std::string(FERRY_SOURCE_DIR) + " && " + trainer() + " plan " + args;
}

// stderr alone (run() folds stderr into stdout after the command).
std::string plan_stderr(const std::string& args) { return "(" + plan(args) + " 2>&1 >/dev/null)"; }

TEST(CliPlan, JsonReportsTheInputOfOneSample) {
  const Exit tokens = run(plan("configs/gpt_text.yaml --json 2>/dev/null"));
  ASSERT_EQ(tokens.code, 0) << tokens.output;
  const nlohmann::json t = nlohmann::json::parse(tokens.output);
  EXPECT_EQ(t["input"].get<std::vector<int64_t>>(), std::vector<int64_t>{128})
      << "data.seq_len 0: model.context's 128 tokens per row";
  const Exit shorter = run(plan("configs/gpt_text.yaml data.seq_len=64 --json 2>/dev/null"));
  ASSERT_EQ(shorter.code, 0) << shorter.output;
  EXPECT_EQ(nlohmann::json::parse(shorter.output)["input"].get<std::vector<int64_t>>(),
            std::vector<int64_t>{64});
  const Exit images = run(plan("configs/quickstart.yaml --json 2>/dev/null"));
  ASSERT_EQ(images.code, 0) << images.output;
  EXPECT_EQ(nlohmann::json::parse(images.output)["input"].get<std::vector<int64_t>>(),
            (std::vector<int64_t>{3, 32, 32}));
}

TEST(CliPlan, PlanningManyShapesSaysSoOnStderr) {
  // data.len_bucket 1: one plan per length, 128 of them (model.context 128).
  const Exit many = run(
      plan_stderr("configs/gpt_text.yaml data.documents=true data.len_bucket=1 model.layers=1"));
  ASSERT_EQ(many.code, 0) << many.output;
  EXPECT_EQ(many.output.rfind("plan: planning 128 lengths (data.len_bucket 1), one plan each; "
                              "progress every 5 s\n",
                              0),
            0u)
      << many.output;
  // A few shapes are planned without a word; stdout is the plan alone.
  const Exit few = run(
      plan_stderr("configs/gpt_text.yaml data.documents=true data.len_bucket=32 model.layers=1"));
  ASSERT_EQ(few.code, 0) << few.output;
  EXPECT_EQ(few.output, "");
}

// The plan names its precision and the step's bytes by dtype; bf16 halves the float tensors and
// adds the weights' bf16 working copy.
TEST(CliPlan, PrintsThePrecisionAndTheBytesByDtype) {
  const Exit f = run(plan("configs/quickstart.yaml --json 2>/dev/null"));
  const Exit b = run(plan("configs/quickstart.yaml device.precision=bf16 --json 2>/dev/null"));
  ASSERT_EQ(f.code, 0) << f.output;
  ASSERT_EQ(b.code, 0) << b.output;
  const nlohmann::json jf = nlohmann::json::parse(f.output);
  const nlohmann::json jb = nlohmann::json::parse(b.output);
  EXPECT_EQ(jf["precision"], "fp32");
  EXPECT_EQ(jb["precision"], "bf16");
  EXPECT_EQ(jf["tensor_bytes"]["bf16"].get<uint64_t>(), 0u);
  EXPECT_EQ(
      jb["tensor_bytes"]["bf16"].get<uint64_t>() * 2 + jb["tensor_bytes"]["fp32"].get<uint64_t>(),
      jf["tensor_bytes"]["fp32"].get<uint64_t>());
  EXPECT_EQ(jf["policies"][0]["working_weights_bytes"].get<uint64_t>(), 0u);
  EXPECT_EQ(jb["policies"][0]["working_weights_bytes"].get<uint64_t>() * 2,
            jb["policies"][0]["weights_bytes"].get<uint64_t>());
  const Exit text = run(plan("configs/quickstart.yaml device.precision=bf16 2>/dev/null"));
  ASSERT_EQ(text.code, 0) << text.output;
  EXPECT_NE(text.output.find("\nprecision: bf16; the step's tensors: bf16 "), std::string::npos)
      << text.output;
}

// The planner sees the Llama ops (RMSNorm, rope_qkv, SwiGLU, the attention core): smollm-135m at
// 2048 tokens fits 4 GiB (fused attention) under auto only by moving and rebuilding, within the
// budget.
TEST(CliPlan, PlansALlamaFromTheZoo) {
  const std::string keys =
      "configs/llama_finetune.yaml model.name=smollm-135m data.path=/dev/null data.seq_len=2048 "
      "data.batch_size=1 device.backend=cuda device.memory=4GiB memory.policy=auto "
      "memory.recompute=true --hardware h100-pcie5 --no-measure --json 2>/dev/null";
  const Exit e = run(plan(keys));
  ASSERT_EQ(e.code, 0) << e.output;
  const nlohmann::json p = nlohmann::json::parse(e.output)["policies"][0];
  EXPECT_TRUE(p["fits"].get<bool>()) << p.dump();
  EXPECT_LE(p["peak_bytes"].get<int64_t>(), int64_t{4} << 30);
  EXPECT_GT(p["recompute_flops"].get<double>() + p["offload_bytes"].get<double>(), 0);
}

// A bf16 plan for the cuda backend asks the CUDA kernel table, with no GPU here (Note [bf16
// kernels at plan time]): the GPT with its fused attention plans; Llama, while the table lacks
// one of its kernels in bf16, is refused in one line naming it, exit 2, as `trainer train` would
// refuse it before step 1; in fp32 it plans.
TEST(CliPlan, Bf16OnCudaIsRefusedAtPlanTimeForAKernelTheCudaTableLacks) {
  if (!backend_built(Backend::kCuda)) GTEST_SKIP() << "this build has no CUDA backend (its table)";
  const std::string gpt =
      "configs/gpt_text.yaml model.layers=1 model.width=32 model.heads=2 model.context=16 "
      "data.batch_size=2 device.backend=cuda ";
  const Exit fused = run(plan(gpt + "device.precision=bf16 2>&1"));
  EXPECT_EQ(fused.code, 0) << fused.output;
  EXPECT_NE(fused.output.find("\nprecision: bf16; the step's tensors: bf16 "), std::string::npos)
      << fused.output;
  const std::string llama = gpt + "model.name=llama model.ffn=48 ";
  const Exit fp32 = run(plan(llama + "2>&1"));
  EXPECT_EQ(fp32.code, 0) << fp32.output;
  const std::vector<std::string> lacking = llama_kernels_cuda_lacks_in_bf16();
  const Exit bf16 = run(plan(llama + "device.precision=bf16 2>&1"));
  if (lacking.empty()) {
    EXPECT_EQ(bf16.code, 0) << bf16.output;
    return;
  }
  EXPECT_EQ(bf16.code, 2) << bf16.output;
  expect_llama_refusal(bf16.output, lacking);
  EXPECT_EQ(bf16.output.find("policy "), std::string::npos) << "a plan was printed";
}

}  // namespace
}  // namespace ferry::testing
