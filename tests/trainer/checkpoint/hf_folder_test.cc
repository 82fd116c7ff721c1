// Model folders, the file side: a folder's weights from model.safetensors or the shards its index
// names (a missing shard or a misplaced tensor named), and a folder exported from a checkpoint
// (config.json from the recorded sizes, the tensors without optimizer state, format "pt").
#include "trainer/checkpoint/hf_folder.h"

#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "common/error.h"
#include "tests/support/temp_dir.h"

namespace ferry {
namespace {

void write_shard(const std::string& path, const std::string& name, float value) {
  const std::vector<float> data(6, value);
  write_safetensors(path, {{name, DType::kF32, Shape{2, 3}, data.data()}}, {{"format", "pt"}});
}

std::string data_error(const std::string& dir) {
  try {
    read_folder_weights(dir);
  } catch (const DataError& e) {
    return e.what();
  }
  return "(accepted)";
}

TEST(HfFolder, ReadsEveryShardTheIndexNames) {
  testing::TempDir dir;
  write_shard(dir.file("model-00001-of-00002.safetensors"), "a.weight", 1.0f);
  write_shard(dir.file("model-00002-of-00002.safetensors"), "b.weight", 2.0f);
  dir.write("model.safetensors.index.json",
            R"({"metadata": {}, "weight_map": {"a.weight": "model-00001-of-00002.safetensors",
                "b.weight": "model-00002-of-00002.safetensors"}})");
  const std::vector<SafetensorsFile> files = read_folder_weights(dir.str());
  ASSERT_EQ(files.size(), 2u);
  EXPECT_NE(files[0].find("a.weight"), nullptr);
  EXPECT_NE(files[1].find("b.weight"), nullptr);

  dir.write("model.safetensors.index.json",
            R"({"weight_map": {"a.weight": "model-00001-of-00002.safetensors",
                "c.weight": "model-00002-of-00002.safetensors"}})");
  EXPECT_NE(data_error(dir.str()).find("has no tensor 'c.weight'"), std::string::npos);
  dir.write("model.safetensors.index.json",
            R"({"weight_map": {"a.weight": "model-00001-of-00003.safetensors"}})");
  EXPECT_NE(data_error(dir.str()).find("shard 'model-00001-of-00003.safetensors' named by "
                                       "model.safetensors.index.json is missing"),
            std::string::npos)
      << data_error(dir.str());
  testing::TempDir none;
  EXPECT_NE(data_error(none.str()).find("has neither model.safetensors nor"), std::string::npos);
  // A single file wins over an index.
  write_shard(dir.file("model.safetensors"), "z.weight", 3.0f);
  ASSERT_EQ(read_folder_weights(dir.str()).size(), 1u);
}

TEST(HfFolder, ExportWritesAConfigTransformersReadsAndNoOptimizerState) {
  testing::TempDir dir;
  const std::vector<float> w(6, 0.5f);
  write_safetensors(dir.file("step_3.safetensors"),
                    {{"model.norm.weight", DType::kF32, Shape{2, 3}, w.data()},
                     {"optimizer.exp_avg.model.norm.weight", DType::kF32, Shape{2, 3}, w.data()}},
                    {{"format", "ferry-checkpoint-1"},
                     {"model.name", "llama"},
                     {"model.layers", "2"},
                     {"model.heads", "6"},
                     {"model.kv_heads", "2"},
                     {"model.width", "48"},
                     {"model.ffn", "80"},
                     {"model.vocab", "96"},
                     {"model.context", "32"},
                     {"model.rope_theta", "500"},
                     {"model.norm_eps", "1e-05"},
                     {"model.tie_embeddings", "false"}});
  const auto written = export_model_folder(dir.file("step_3.safetensors"), dir.file("out"));
  ASSERT_EQ(written.size(), 2u);
  const nlohmann::json c = nlohmann::json::parse(std::ifstream(dir.file("out/config.json")));
  EXPECT_EQ(c["architectures"][0], "LlamaForCausalLM");
  EXPECT_EQ(c["num_key_value_heads"], 2);
  EXPECT_EQ(c["intermediate_size"], 80);
  EXPECT_EQ(c["rope_theta"], 500.0);
  EXPECT_EQ(c["tie_word_embeddings"], false);
  const SafetensorsFile out = read_safetensors(dir.file("out/model.safetensors"));
  ASSERT_EQ(out.entries().size(), 1u);
  EXPECT_EQ(out.entries()[0].name, "model.norm.weight");
  EXPECT_EQ(out.metadata().at("format"), "pt");
  // An image model's checkpoint is not a Hugging Face model.
  write_safetensors(dir.file("cnn.safetensors"),
                    {{"fc.weight", DType::kF32, Shape{2, 3}, w.data()}},
                    {{"format", "ferry-checkpoint-1"}, {"model.name", "resnet18_cifar"}});
  EXPECT_THROW(export_model_folder(dir.file("cnn.safetensors"), dir.file("cnn")), ConfigError);
  EXPECT_THROW(export_model_folder(dir.file("step_3.safetensors"), dir.file("out2"), dir.str()),
               ConfigError);  // --tokenizer naming a folder without tokenizer files
}

}  // namespace
}  // namespace ferry
