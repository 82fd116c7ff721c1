// `trainer simulate` over a shape schedule (Note [Simulating a shape schedule] in
// trainer/simulate/simulation.h): data.scales gives each side the weight the loader draws it
// with, every shape is planned exactly (its entry is the step of simulating that input alone),
// the report is the weighted mean; --shapes gives the same schedule as text, token lengths too;
// memory.per_shape false gives every shape the largest one's decisions, never predicted faster.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tests/trainer/integration/run_util.h"

namespace ferry::testing {
namespace {

// ResNet-50 at batch 256 on one V100 of the DGX-1-like server under 12 GiB: side 224 rebuilds.
std::string resnet50(const std::string& args) {
  return "cd " + std::string(FERRY_SOURCE_DIR) + " && " + trainer() +
         " simulate configs/simulate/resnet50-dgx1.yaml --hardware v100-pcie3 --gpus 1 --json " +
         args;
}

nlohmann::json simulate(const std::string& command) {
  const Exit e = run(command);
  EXPECT_EQ(e.code, 0) << e.output;
  return e.code == 0 ? nlohmann::json::parse(e.output) : nlohmann::json::object();
}

TEST(SimulateShapes, TheScheduleIsTheWeightedMeanOfItsShapesEachPlannedExactly) {
  const nlohmann::json j = simulate(resnet50("'data.scales=[160, 224, 224]'"));
  ASSERT_EQ(j["shapes"].size(), 2u) << j.dump(2);
  const nlohmann::json& s160 = j["shapes"][0];
  const nlohmann::json& s224 = j["shapes"][1];
  EXPECT_EQ(s160["input"].get<std::vector<int64_t>>(), (std::vector<int64_t>{256, 3, 160, 160}));
  EXPECT_DOUBLE_EQ(s160["weight"].get<double>(), 1.0 / 3);
  EXPECT_DOUBLE_EQ(s224["weight"].get<double>(), 2.0 / 3);
  const double mean = s160["weight"].get<double>() * s160["step_s"].get<double>() +
                      s224["weight"].get<double>() * s224["step_s"].get<double>();
  EXPECT_NEAR(j["step_s"].get<double>(), mean, 1e-12);
  EXPECT_NEAR(j["samples_per_s"].get<double>(), 256 / mean, 1e-6);
  EXPECT_EQ(j["peak_bytes"].get<uint64_t>(),
            std::max(s160["peak_bytes"].get<uint64_t>(), s224["peak_bytes"].get<uint64_t>()));
  EXPECT_LT(s160["step_s"].get<double>(), s224["step_s"].get<double>());
  EXPECT_GT(s224["recompute_flops"].get<double>() + s224["offload_bytes"].get<double>(), 0)
      << "12 GiB does not hold side 224 at batch 256";
  // Each entry is that input simulated alone.
  for (const nlohmann::json& shape : {s160, s224}) {
    const int64_t side = shape["size"].get<int64_t>();
    const nlohmann::json alone = simulate(
        resnet50("'model.input=[3, " + std::to_string(side) + ", " + std::to_string(side) + "]'"));
    ASSERT_EQ(alone["shapes"].size(), 1u);
    EXPECT_EQ(alone["step_s"], shape["step_s"]) << side;
    EXPECT_EQ(alone["peak_bytes"], shape["peak_bytes"]) << side;
    EXPECT_EQ(alone["recompute_flops"], shape["recompute_flops"]) << side;
  }
  // The same schedule as text.
  nlohmann::json text = simulate(resnet50("--shapes 160,224:2"));
  EXPECT_EQ(text["shapes"], j["shapes"]);
  EXPECT_EQ(text["step_s"], j["step_s"]);
}

TEST(SimulateShapes, OneStaticPlanTakesTheLargestShapesDecisionsAndIsNeverFaster) {
  const nlohmann::json own = simulate(resnet50("'data.scales=[160, 224]'"));
  const nlohmann::json fixed =
      simulate(resnet50("'data.scales=[160, 224]' memory.per_shape=false"));
  ASSERT_EQ(fixed["shapes"].size(), 2u);
  EXPECT_EQ(own["per_shape"], true);
  EXPECT_EQ(fixed["per_shape"], false);
  // The largest shape's plan is its own either way.
  EXPECT_EQ(fixed["shapes"][1]["step_s"], own["shapes"][1]["step_s"]);
  EXPECT_EQ(fixed["shapes"][1]["recompute_flops"], own["shapes"][1]["recompute_flops"]);
  // Side 160 fits 12 GiB with everything resident; the static plan rebuilds there as well.
  EXPECT_EQ(own["shapes"][0]["recompute_flops"].get<double>(), 0.0);
  EXPECT_EQ(own["shapes"][0]["offload_bytes"].get<uint64_t>(), 0u);
  EXPECT_GT(fixed["shapes"][0]["recompute_flops"].get<double>() +
                fixed["shapes"][0]["offload_bytes"].get<double>(),
            0);
  EXPECT_LE(fixed["shapes"][0]["peak_bytes"].get<uint64_t>(), 12ull << 30);
  EXPECT_GT(fixed["shapes"][0]["step_s"].get<double>(), own["shapes"][0]["step_s"].get<double>());
  EXPECT_GT(fixed["step_s"].get<double>(), own["step_s"].get<double>());
}

TEST(SimulateShapes, TokenLengthsAsAScheduleAndBadSchedulesExit2) {
  const std::string gpt = "cd " + std::string(FERRY_SOURCE_DIR) + " && " + trainer() +
                          " simulate configs/simulate/gpt2-medium-dgx1.yaml --hardware "
                          "h100-pcie5 --gpus 1 ";
  const nlohmann::json j = simulate(gpt + "--json --shapes 256:3,1024:1");
  ASSERT_EQ(j["shapes"].size(), 2u);
  EXPECT_EQ(j["shapes"][0]["input"].get<std::vector<int64_t>>(), (std::vector<int64_t>{8, 256}));
  EXPECT_DOUBLE_EQ(j["shapes"][0]["weight"].get<double>(), 0.75);
  EXPECT_LT(j["shapes"][0]["step_s"].get<double>(), j["shapes"][1]["step_s"].get<double>());
  // The text report has the table.
  const Exit text = run(gpt + "--shapes 256:3,1024:1");
  ASSERT_EQ(text.code, 0) << text.output;
  EXPECT_NE(text.output.find("shapes: --shapes 256:3,1024:1; a plan per shape"), std::string::npos)
      << text.output;
  EXPECT_NE(text.output.find("\n(8, 1024) "), std::string::npos) << text.output;
  EXPECT_NE(text.output.find("mean over the shapes: step "), std::string::npos) << text.output;
  // Weights each finite but summing to infinity (issue 27 item 6: exit 0 with step_s 0.0).
  const Exit huge = run(gpt + "--shapes 256:1e308,512:1e308");
  EXPECT_EQ(huge.code, 2) << huge.output;
  EXPECT_NE(huge.output.find("error: --shapes: the weights in"), std::string::npos) << huge.output;
  EXPECT_EQ(huge.output.find("step_s"), std::string::npos) << huge.output;
  for (const char* bad : {"--shapes 2048", "--shapes 256:0", "--shapes x"}) {
    const Exit e = run(gpt + bad);
    EXPECT_EQ(e.code, 2) << bad << "\n" << e.output;
    EXPECT_NE(e.output.find("error: --shapes: "), std::string::npos) << e.output;
    EXPECT_NE(e.output.find("hint: give SIZE[:WEIGHT] entries"), std::string::npos) << e.output;
  }
}

}  // namespace
}  // namespace ferry::testing
