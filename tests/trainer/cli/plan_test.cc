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
// kernels at plan time]): the GPT with its fused attention and Llama with its RMSNorm, rotary
// and SwiGLU kernels plan in bf16 (the planner would refuse, exit 2, a kernel the table lacked:
// CheckBf16Kernels.* tests that line).
TEST(CliPlan, Bf16OnCudaPlansTheZoosTransformersFromTheCudaKernelTable) {
  if (!backend_built(Backend::kCuda)) GTEST_SKIP() << "this build has no CUDA backend (its table)";
  const std::string gpt =
      "configs/gpt_text.yaml model.layers=1 model.width=32 model.heads=2 model.context=16 "
      "data.batch_size=2 device.backend=cuda ";
  const Exit fused = run(plan(gpt + "device.precision=bf16 2>&1"));
  EXPECT_EQ(fused.code, 0) << fused.output;
  EXPECT_NE(fused.output.find("\nprecision: bf16; the step's tensors: bf16 "), std::string::npos)
      << fused.output;
  const Exit llama = run(plan(gpt + "model.name=llama model.ffn=48 device.precision=bf16 2>&1"));
  EXPECT_EQ(llama.code, 0) << llama.output;
  EXPECT_NE(llama.output.find("\nprecision: bf16; the step's tensors: bf16 "), std::string::npos)
      << llama.output;
}

}  // namespace
}  // namespace ferry::testing
