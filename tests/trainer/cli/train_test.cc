// `trainer train`'s first screen (issue 27 item 14): a few lines about the config (where the
// resolved config is, the keys that differ from the defaults) instead of ~120 lines of YAML;
// `trainer config` still prints the whole resolved config.
#include <cmath>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tests/support/temp_dir.h"
#include "tests/trainer/integration/run_util.h"

namespace ferry::testing {
namespace {

std::string quickstart() { return std::string(FERRY_SOURCE_DIR) + "/configs/quickstart.yaml"; }

TEST(CliTrain, TheFirstScreenNamesTheConfigFileAndWhatDiffersFromTheDefaults) {
  TempDir dir;
  const Exit e = run(trainer() + " train " + quickstart() + " run.steps=2 run.log_every=1 " +
                     "checkpoint.every=0 optim.lr=0.05 run.dir=" + dir.str());
  ASSERT_EQ(e.code, 0) << e.output;
  const std::string config_line = "config   " + dir.str() + "/config.yaml (resolved; ";
  EXPECT_EQ(e.output.rfind(config_line, 0), 0u) << e.output;
  EXPECT_NE(e.output.find("optim.lr=0.05"), std::string::npos) << e.output;
  EXPECT_NE(e.output.find("model.name=lenet5"), std::string::npos) << e.output;
  EXPECT_EQ(e.output.find("optim.momentum=0.9,"), std::string::npos) << "a default: " << e.output;
  // The YAML is not on the console: a few lines come before the banner's first line (~120 did).
  const size_t banner = e.output.find("\nranks    ");
  ASSERT_NE(banner, std::string::npos) << e.output;
  EXPECT_LE(count(e.output.substr(0, banner), "\n"), 8u) << e.output;
  EXPECT_EQ(e.output.find("\nmodel:\n"), std::string::npos) << e.output;
  // The whole resolved config is in the file and from `trainer config`.
  std::ifstream in(dir.str() + "/config.yaml");
  std::stringstream file;
  file << in.rdbuf();
  EXPECT_NE(file.str().find("  lr: 0.05"), std::string::npos) << file.str();
  const Exit printed =
      run(trainer() + " config " + quickstart() + " optim.lr=0.05 run.dir=" + dir.str() +
          " run.steps=2 run.log_every=1 checkpoint.every=0");
  ASSERT_EQ(printed.code, 0) << printed.output;
  EXPECT_EQ(printed.output, file.str());
}

// device.precision bf16 where oneDNN may not use avx512_bf16 (ONEDNN_MAX_CPU_ISA lowers its ISA,
// as a CPU without the instructions would): one line naming the feature, exit 2, before step 1.
TEST(CliTrain, Bf16WithoutAvx512Bf16IsRefusedBeforeTraining) {
  TempDir dir;
  const Exit e = run("ONEDNN_MAX_CPU_ISA=AVX512_CORE " + trainer() + " train " + quickstart() +
                     " run.steps=2 checkpoint.every=0 device.precision=bf16 run.dir=" + dir.str());
  EXPECT_EQ(e.code, 2) << e.output;
  EXPECT_NE(e.output.find("device.precision: bf16 on the cpu backend needs avx512_bf16, but "
                          "oneDNN may not use avx512_bf16 here"),
            std::string::npos)
      << e.output;
  EXPECT_EQ(e.output.find("step 1"), std::string::npos) << e.output;
}

// The banner names the precision, the all-reduce's dtype and the step's tensor bytes by dtype.
TEST(CliTrain, TheBannerNamesThePrecision) {
  TempDir dir;
  const Exit e = run(trainer() + " train " + quickstart() +
                     " run.steps=1 checkpoint.every=0 run.dir=" + dir.str());
  ASSERT_EQ(e.code, 0) << e.output;
  EXPECT_NE(e.output.find("\ndtypes   precision fp32, all-reduce in fp32; the step's tensors: "
                          "bf16 0 B, fp32 "),
            std::string::npos)
      << e.output;
}

// `trainer train config.yaml device.precision=bf16` trains: the loss falls as in fp32; `trainer
// eval` of its checkpoint runs in the precision asked for, bf16 near fp32 but not bitwise.
TEST(CliTrain, Bf16TrainsItsLossFallsAndEvalRunsInEitherPrecision) {
  TempDir dir;
  const Exit e = run(trainer() + " train " + quickstart() +
                     " run.steps=80 run.log_every=10 checkpoint.every=80 memory.measure=false "
                     "device.precision=bf16 run.dir=" +
                     dir.str());
  ASSERT_EQ(e.code, 0) << e.output;
  EXPECT_NE(e.output.find("\ndtypes   precision bf16, all-reduce in fp32"), std::string::npos)
      << e.output;
  std::ifstream metrics(dir.str() + "/metrics.jsonl");
  std::vector<double> losses;
  for (std::string line; std::getline(metrics, line);)
    losses.push_back(nlohmann::json::parse(line)["loss"].get<double>());
  ASSERT_EQ(losses.size(), 8u);
  for (double l : losses) ASSERT_TRUE(std::isfinite(l));
  EXPECT_LT(losses.back(), 0.5 * losses.front()) << e.output;

  const auto eval = [&](const std::string& precision) {
    const Exit x =
        run(trainer() + " eval " + quickstart() + " run.dir=" + dir.str() +
            " data.seed=1 data.samples=512 memory.measure=false device.precision=" + precision);
    EXPECT_EQ(x.code, 0) << x.output;
    std::ifstream in(dir.str() + "/eval.json");
    return nlohmann::json::parse(in);
  };
  const nlohmann::json b = eval("bf16"), f = eval("fp32");
  const double lb = b["loss"].get<double>(), lf = f["loss"].get<double>();
  EXPECT_NE(lb, lf) << "eval in bf16 computed in fp32";
  EXPECT_NEAR(lb, lf, 0.05 * lf);
  EXPECT_NEAR(b["accuracy"].get<double>(), f["accuracy"].get<double>(), 0.05);
}

// A Llama (RMSNorm, rotary qkv, SwiGLU) trains in bf16 from the command line: every step finds
// its kernels in bf16 storage (the refusal of a model without them is gone for the CPU backend),
// and its loss falls.
TEST(CliTrain, ALlamaTrainsInBf16) {
  TempDir dir;
  std::string file(256 * sizeof(int32_t), '\0');
  const int32_t header[3] = {20240520, 1, 1024};
  std::memcpy(file.data(), header, sizeof(header));
  for (int i = 0; i < 1024; ++i) {
    const auto token = static_cast<uint16_t>(i % 200);
    file.append(reinterpret_cast<const char*>(&token), sizeof(token));
  }
  const std::string tokens = dir.write("train.bin", file);
  const Exit e = run(trainer() + " train " + std::string(FERRY_SOURCE_DIR) +
                     "/configs/gpt_text.yaml model.name=llama model.layers=1 model.width=32 "
                     "model.heads=2 model.ffn=48 model.context=16 data.batch_size=2 "
                     "data.val_path= memory.measure=false run.steps=30 run.log_every=10 "
                     "checkpoint.every=0 device.precision=bf16 data.path=" +
                     tokens + " run.dir=" + dir.str() + "/run");
  ASSERT_EQ(e.code, 0) << e.output;
  EXPECT_NE(e.output.find("\ndtypes   precision bf16"), std::string::npos) << e.output;
  std::ifstream metrics(dir.str() + "/run/metrics.jsonl");
  std::vector<double> losses;
  for (std::string line; std::getline(metrics, line);)
    losses.push_back(nlohmann::json::parse(line)["loss"].get<double>());
  ASSERT_EQ(losses.size(), 3u) << e.output;
  for (double l : losses) ASSERT_TRUE(std::isfinite(l));
  EXPECT_LT(losses.back(), losses.front()) << e.output;
}

TEST(CliTrain, CommDtypeBf16NeedsBf16Precision) {
  TempDir dir;
  const Exit e = run(trainer() + " train " + quickstart() +
                     " run.steps=2 comm.dtype=bf16 run.dir=" + dir.str());
  EXPECT_EQ(e.code, 2) << e.output;
  EXPECT_NE(e.output.find("comm.dtype: bf16 needs device.precision bf16, got fp32"),
            std::string::npos)
      << e.output;
}

}  // namespace
}  // namespace ferry::testing
