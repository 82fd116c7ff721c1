// The Llama family in the zoo: Hugging Face's parameter counts, state_dict names and order, the
// tied and untied heads, grouped-query shapes, and the size keys' one-line errors.
#include <algorithm>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "common/error.h"
#include "trainer/model/zoo/zoo.h"

namespace ferry {
namespace {

std::vector<std::string> param_names(const Graph& g) {
  std::vector<std::string> names;
  for (TensorId p : g.params()) names.push_back(g.tensor(p).name);
  return names;
}

TransformerSizes small(bool tied) {
  TransformerSizes s{.layers = 2, .heads = 6, .width = 48, .vocab = 100, .context = 32};
  s.kv_heads = 2;
  s.ffn = 80;
  s.tie_embeddings = tied;
  return s;
}

TEST(LlamaZoo, ParameterCountsAreHuggingFaces) {
  // sum(p.numel() for p in LlamaForCausalLM(config).parameters()), the figures.
  EXPECT_EQ(build_token_model("smollm-135m", 1, 8, {}).parameter_count(), 134'515'008);
  EXPECT_EQ(build_token_model("tinyllama-1.1b", 1, 8, {}).parameter_count(), 1'100'048'384);
  EXPECT_TRUE(model_info("smollm-135m").llama());
  EXPECT_EQ(model_info("tinyllama-1.1b").default_classes, 32000);
}

TEST(LlamaZoo, NamesShapesAndOrderFollowTheStateDict) {
  for (bool tied : {false, true}) {
    const Graph g = build_token_model("llama", 3, 16, small(tied));
    std::vector<std::string> expected{"model.embed_tokens.weight"};
    for (int i = 0; i < 2; ++i) {
      for (const char* m : {"input_layernorm", "self_attn.q_proj", "self_attn.k_proj",
                            "self_attn.v_proj", "self_attn.o_proj", "post_attention_layernorm",
                            "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"}) {
        expected.push_back(fmt::format("model.layers.{}.{}.weight", i, m));
      }
    }
    expected.push_back("model.norm.weight");
    if (!tied) expected.push_back("lm_head.weight");
    EXPECT_EQ(param_names(g), expected);
    for (TensorId p : g.params()) {
      const std::string& name = g.tensor(p).name;
      const Shape& s = g.tensor(p).desc.shape;
      if (name == "model.layers.0.self_attn.q_proj.weight") EXPECT_EQ(s, (Shape{48, 48}));
      if (name == "model.layers.0.self_attn.k_proj.weight") EXPECT_EQ(s, (Shape{16, 48}));
      if (name == "model.layers.1.mlp.down_proj.weight") EXPECT_EQ(s, (Shape{48, 80}));
      if (name == "lm_head.weight") EXPECT_EQ(s, (Shape{100, 48}));
    }
    EXPECT_EQ(g.tensor(g.logits()).desc.shape, (Shape{48, 100}));
    // Every new op is on the graph the planner and simulator see.
    std::vector<std::string> kinds;
    for (const Node& n : g.nodes()) kinds.emplace_back(n.op->kind());
    for (const char* k : {"rmsnorm", "rope_qkv", "attention", "swiglu", "embedding"}) {
      EXPECT_NE(std::find(kinds.begin(), kinds.end(), k), kinds.end()) << k;
    }
  }
}

TEST(LlamaZoo, SizeKeysAreCheckedInOneLine) {
  TransformerSizes s = small(false);
  s.kv_heads = 4;  // does not divide 6
  try {
    build_token_model("llama", 1, 8, s);
    FAIL() << "kv_heads 4 of 6 heads was accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("model.kv_heads (4) must divide model.heads (6)"),
              std::string::npos)
        << e.what();
  }
  s = small(false);
  s.heads = 16;  // head width 3
  s.kv_heads = 16;
  try {
    build_token_model("llama", 1, 8, s);
    FAIL() << "an odd head width was accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("even head width"), std::string::npos) << e.what();
  }
  TransformerSizes g{.layers = 1, .heads = 2, .width = 32, .vocab = 50, .context = 8};
  g.kv_heads = 1;
  EXPECT_THROW(build_token_model("gpt2", 1, 8, g), ConfigError);  // a Llama-only key on GPT-2
  // model.heads alone (no model.kv_heads) means plain multi-head attention.
  TransformerSizes h{.heads = 8};
  EXPECT_EQ(resolve_sizes(model_info("smollm-135m"), h).kv_heads, 8);
}

}  // namespace
}  // namespace ferry
