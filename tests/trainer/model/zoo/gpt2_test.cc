// The GPT-2 family in the zoo: Hugging Face's parameter counts, names and order, layouts, the
// tied head, and the size keys' errors.
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "common/error.h"
#include "trainer/model/zoo/layer_table.h"
#include "trainer/model/zoo/zoo.h"

namespace ferry {
namespace {

std::vector<std::string> param_names(const Graph& g) {
  std::vector<std::string> names;
  for (TensorId p : g.params()) names.push_back(g.tensor(p).name);
  return names;
}

TEST(Gpt2Zoo, ParameterCountsAreHuggingFaces) {
  // sum(p.numel() for p in GPT2LMHeadModel(config).parameters()): the tied head counts once.
  EXPECT_EQ(build_token_model("gpt2", 1, 8, {}).parameter_count(), 124'439'808);
  EXPECT_EQ(build_token_model("gpt2-medium", 1, 8, {}).parameter_count(), 354'823'168);
  EXPECT_TRUE(model_info("gpt2").tokens);
  EXPECT_EQ(model_info("gpt2").default_classes, 50257);
}

TEST(Gpt2Zoo, NamesShapesAndOrderFollowTheStateDict) {
  const TransformerSizes sizes{.layers = 2, .heads = 4, .width = 64, .vocab = 100, .context = 32};
  const Graph g = build_token_model("gpt2", 3, 16, sizes);
  std::vector<std::string> expected{"transformer.wte.weight", "transformer.wpe.weight"};
  for (int i = 0; i < 2; ++i) {
    for (const char* m : {"ln_1", "attn.c_attn", "attn.c_proj", "ln_2", "mlp.c_fc", "mlp.c_proj"}) {
      expected.push_back(fmt::format("transformer.h.{}.{}.weight", i, m));
      expected.push_back(fmt::format("transformer.h.{}.{}.bias", i, m));
    }
  }
  expected.push_back("transformer.ln_f.weight");
  expected.push_back("transformer.ln_f.bias");
  EXPECT_EQ(param_names(g), expected);
  // Conv1D stores (in, out); the embeddings (rows, width).
  for (TensorId p : g.params()) {
    const std::string& name = g.tensor(p).name;
    const Shape& s = g.tensor(p).desc.shape;
    if (name == "transformer.h.0.attn.c_attn.weight") EXPECT_EQ(s, (Shape{64, 192}));
    if (name == "transformer.h.0.mlp.c_proj.weight") EXPECT_EQ(s, (Shape{256, 64}));
    if (name == "transformer.wte.weight") EXPECT_EQ(s, (Shape{100, 64}));
    if (name == "transformer.wpe.weight") EXPECT_EQ(s, (Shape{32, 64}));
  }
  // Tokens in, one next-token label per position, logits over the vocabulary per position.
  EXPECT_EQ(g.tensor(g.input()).desc.dtype, DType::kI32);
  EXPECT_EQ(g.tensor(g.input()).desc.shape, (Shape{3, 16}));
  EXPECT_EQ(g.tensor(g.labels()).desc.shape, (Shape{3, 16}));
  EXPECT_EQ(g.tensor(g.logits()).desc.shape, (Shape{48, 100}));
}

TEST(Gpt2Zoo, TheHeadSharesTheTokenEmbedding) {
  const TransformerSizes sizes{.layers = 1, .heads = 2, .width = 32, .vocab = 50, .context = 8};
  const Graph g = build_token_model("gpt2", 2, 8, sizes);
  const Node* embed = nullptr;
  const Node* head = nullptr;
  for (const Node& n : g.nodes()) {
    if (n.name == "transformer.embed") embed = &n;
    if (n.name == "lm_head") head = &n;
  }
  ASSERT_TRUE(embed && head);
  ASSERT_EQ(head->params.size(), 1u);
  EXPECT_EQ(head->params[0], embed->params[0]);
  // The layer table counts the shared weight once, at the embedding.
  const nlohmann::json j = layer_table_json(g, "gpt2");
  int64_t sum = 0;
  for (const nlohmann::json& l : j["layers"]) sum += l["parameters"].get<int64_t>();
  EXPECT_EQ(sum, g.parameter_count());
}

TEST(Gpt2Zoo, DropoutAddsItsLayersAndMasks) {
  TransformerSizes sizes{.layers = 1, .heads = 2, .width = 32, .vocab = 50, .context = 8};
  sizes.fused_attention = false;  // the naive core keeps a mask; the fused one draws it again
  const size_t without = build_token_model("gpt2", 2, 8, sizes).nodes().size();
  sizes.dropout = 0.1;
  const Graph g = build_token_model("gpt2", 2, 8, sizes);
  EXPECT_EQ(g.nodes().size(), without + 3);  // embedding, attention residual, MLP residual
  for (const Node& n : g.nodes()) {
    if (n.name == "transformer.h.0.attn") {
      EXPECT_EQ(n.outputs.size(), 2u);  // the result and the probabilities
      EXPECT_EQ(n.aux.size(), 1u);      // the dropout mask
    }
  }
}

// model.attention=fused (the default): the core's second output is one log-sum-exp per query
// (N, heads, T), not the (N, heads, T, T) probabilities, and dropout adds no mask.
TEST(Gpt2Zoo, FusedAttentionSavesALogSumExpPerQuery) {
  TransformerSizes sizes{.layers = 1, .heads = 2, .width = 32, .vocab = 50, .context = 8};
  EXPECT_TRUE(sizes.fused_attention);
  sizes.dropout = 0.1;
  const Graph g = build_token_model("gpt2", 3, 8, sizes);
  bool found = false;
  for (const Node& n : g.nodes()) {
    if (n.name != "transformer.h.0.attn") continue;
    found = true;
    ASSERT_EQ(n.outputs.size(), 2u);
    EXPECT_EQ(g.tensor(n.outputs[1]).desc.shape, (Shape{3, 2, 8}));
    EXPECT_TRUE(n.aux.empty());
    EXPECT_EQ(n.op->saved().outputs, 0b11u);  // y and the log-sum-exp
    EXPECT_TRUE(n.op->recomputable());
  }
  EXPECT_TRUE(found);
}

TEST(Gpt2Zoo, BadSizesAreConfigErrorsNamingTheKey) {
  const auto message = [](const TransformerSizes& s, int64_t seq_len) {
    try {
      build_token_model("gpt2", 1, seq_len, s);
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message({.heads = 5}, 8).find("model.heads (5) must divide model.width (768)"),
            std::string::npos);
  EXPECT_NE(message({.context = 64}, 128).find("data.seq_len (128)"), std::string::npos);
  EXPECT_NE(message({.layers = -1}, 8).find("model.layers"), std::string::npos);
  EXPECT_NE(message({.dropout = 1.0}, 8).find("model.dropout"), std::string::npos);
  EXPECT_THROW(build_token_model("resnet18", 1, 8, {}), ConfigError);
  EXPECT_THROW(build_model("gpt2", Shape{1, 3, 32, 32}, 10), ConfigError);
}

}  // namespace
}  // namespace ferry
