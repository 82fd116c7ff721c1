// A Hugging Face config.json as model.* keys: the architecture names the model, its fields the
// sizes; a key the user gave that disagrees, an architecture ferry does not train, a missing
// field and a feature ferry's model lacks are each one ConfigError naming what is wrong.
#include <string>

#include <gtest/gtest.h>

#include "common/error.h"
#include "tests/support/temp_dir.h"
#include "trainer/config/config.h"
#include "trainer/config/model_folder.h"

namespace ferry {
namespace {

constexpr const char* kLlama = R"({"architectures": ["LlamaForCausalLM"], "hidden_size": 576,
  "intermediate_size": 1536, "num_hidden_layers": 30, "num_attention_heads": 9,
  "num_key_value_heads": 3, "vocab_size": 49152, "max_position_embeddings": 2048,
  "rope_theta": 10000.0, "rms_norm_eps": 1e-05, "tie_word_embeddings": true,
  "hidden_act": "silu", "rope_scaling": null})";

Config load(const testing::TempDir& dir, std::vector<std::string> overrides = {}) {
  overrides.push_back("model.init_from=" + dir.str());
  return parse_config_text("", overrides, "x.yaml");
}

std::string error_of(const testing::TempDir& dir, std::vector<std::string> overrides = {}) {
  try {
    load(dir, std::move(overrides));
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "(accepted)";
}

TEST(ModelFolder, ALlamaConfigSetsTheNameAndEverySize) {
  testing::TempDir dir;
  dir.write("config.json", kLlama);
  EXPECT_TRUE(is_model_folder(dir.str()));
  EXPECT_FALSE(is_model_folder(dir.file("config.json")));
  const Config c = load(dir, {"model.layers=30"});  // a key that agrees is fine
  EXPECT_EQ(c.model.name, "llama");
  EXPECT_EQ(c.model.layers, 30);
  EXPECT_EQ(c.model.heads, 9);
  EXPECT_EQ(c.model.kv_heads, 3);
  EXPECT_EQ(c.model.width, 576);
  EXPECT_EQ(c.model.ffn, 1536);
  EXPECT_EQ(c.model.vocab, 49152);
  EXPECT_EQ(c.model.context, 2048);
  EXPECT_DOUBLE_EQ(c.model.rope_theta, 10000.0);
  EXPECT_DOUBLE_EQ(c.model.norm_eps, 1e-5);
  EXPECT_EQ(c.model.tie_embeddings, TieEmbeddings::kTrue);
}

TEST(ModelFolder, AGpt2ConfigSetsGpt2) {
  testing::TempDir dir;
  dir.write("config.json", R"({"architectures": ["GPT2LMHeadModel"], "n_layer": 2, "n_head": 4,
    "n_embd": 64, "vocab_size": 96, "n_positions": 32, "activation_function": "gelu_new"})");
  const Config c = load(dir);
  EXPECT_EQ(c.model.name, "gpt2");
  EXPECT_EQ(c.model.width, 64);
  EXPECT_EQ(c.model.context, 32);
}

TEST(ModelFolder, EachMistakeIsOneErrorNamingIt) {
  testing::TempDir dir;
  dir.write("config.json", kLlama);
  EXPECT_NE(error_of(dir, {"model.heads=8"})
                .find("model.heads is 8 (override 'model.heads=8') but the folder's"),
            std::string::npos)
      << error_of(dir, {"model.heads=8"});
  EXPECT_NE(error_of(dir, {"model.heads=8"}).find("\"num_attention_heads\": 9"), std::string::npos);
  EXPECT_NE(error_of(dir, {"model.name=gpt2"}).find("model.name is 'gpt2'"), std::string::npos);
  EXPECT_NE(error_of(dir, {"model.tie_embeddings=false"}).find("model.tie_embeddings"),
            std::string::npos);

  testing::TempDir other;
  other.write("config.json", R"({"architectures": ["MistralForCausalLM"]})");
  EXPECT_NE(error_of(other).find("MistralForCausalLM, which ferry does not train (supported: "
                                 "LlamaForCausalLM, GPT2LMHeadModel)"),
            std::string::npos)
      << error_of(other);

  testing::TempDir missing;
  std::string text = kLlama;
  text.replace(text.find("\"intermediate_size\": 1536,"), 26, "");
  missing.write("config.json", text);
  EXPECT_NE(error_of(missing).find("has no \"intermediate_size\" (ferry's model.ffn)"),
            std::string::npos)
      << error_of(missing);

  testing::TempDir scaled;
  text = kLlama;
  text.replace(text.find("\"rope_scaling\": null"), 20, R"("rope_scaling": {"type": "linear"})");
  scaled.write("config.json", text);
  EXPECT_NE(error_of(scaled).find("rope_scaling"), std::string::npos) << error_of(scaled);

  testing::TempDir empty;
  EXPECT_NE(error_of(empty).find("is a folder without config.json"), std::string::npos);
  testing::TempDir bad;
  bad.write("config.json", "{not json");
  EXPECT_NE(error_of(bad).find("is not valid JSON"), std::string::npos);
}

}  // namespace
}  // namespace ferry
