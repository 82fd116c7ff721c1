// `trainer plan` as a user meets it (issue 27): --json reports the input one sample reads (tokens
// per row for a token model, not an image's [C, H, W]); planning many shapes says so on stderr
// and shows progress instead of printing nothing for minutes.
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

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

}  // namespace
}  // namespace ferry::testing
