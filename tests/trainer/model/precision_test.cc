// trainer/model/precision.h: Note [Which tensors are bf16] applied to a CNN with batch norm and
// a GPT with dropout and a Llama, tensor by tensor; fp32 leaves the graph as built.
#include "trainer/model/precision.h"

#include <gtest/gtest.h>

#include "trainer/model/zoo/zoo.h"

namespace ferry {
namespace {

// The dtype the Note gives `t`, written out independently of apply_precision.
DType expected(const Graph& g, const TensorInfo& t, DType built) {
  if (built != DType::kF32 || is_persistent(t.role)) return built;
  if (t.role == TensorRole::kAux) {
    const std::string_view op = g.nodes()[static_cast<size_t>(t.producer)].op->kind();
    if (op == "batchnorm2d" || op == "layernorm" || op == "rmsnorm") return DType::kF32;
  }
  return DType::kBF16;
}

void expect_rule(const Graph& built, Graph narrowed) {
  ASSERT_EQ(built.tensors().size(), narrowed.tensors().size());
  int bf16 = 0, stats = 0;
  for (size_t i = 0; i < built.tensors().size(); ++i) {
    const TensorInfo& b = built.tensors()[i];
    const TensorInfo& n = narrowed.tensors()[i];
    EXPECT_EQ(n.desc.shape, b.desc.shape) << b.name;
    EXPECT_EQ(n.role, b.role) << b.name;
    EXPECT_EQ(n.desc.dtype, expected(built, b, b.desc.dtype)) << b.name;
    bf16 += n.desc.dtype == DType::kBF16;
    stats += n.role == TensorRole::kAux && n.desc.dtype == DType::kF32;
  }
  EXPECT_GT(bf16, 10);
  EXPECT_GT(stats, 2);  // norm statistics stayed fp32
  // Parameters (the master weights), buffers and the loss are fp32.
  for (TensorId p : narrowed.params()) EXPECT_EQ(narrowed.tensor(p).desc.dtype, DType::kF32);
  EXPECT_EQ(narrowed.tensor(narrowed.loss()).desc.dtype, DType::kF32);
  EXPECT_EQ(narrowed.tensor(narrowed.logits()).desc.dtype, DType::kBF16);
  EXPECT_EQ(activation_bytes(narrowed, DType::kF32) + activation_bytes(narrowed, DType::kBF16) * 2,
            activation_bytes(built, DType::kF32));
}

TEST(Precision, CnnWithBatchNorm) {
  const Graph built = build_model("resnet18_cifar", Shape{4, 3, 32, 32}, 10);
  Graph g = build_model("resnet18_cifar", Shape{4, 3, 32, 32}, 10);
  apply_precision(g, Precision::kBf16);
  expect_rule(built, std::move(g));
  // The image input is bf16 (converted on upload); the labels stay int32.
  Graph n = build_model("resnet18_cifar", Shape{4, 3, 32, 32}, 10);
  apply_precision(n, Precision::kBf16);
  EXPECT_EQ(n.tensor(n.input()).desc.dtype, DType::kBF16);
  EXPECT_EQ(n.tensor(n.labels()).desc.dtype, DType::kI32);
}

TEST(Precision, GptWithDropout) {
  TransformerSizes sizes;
  sizes.layers = 2;
  sizes.heads = 2;
  sizes.width = 32;
  sizes.vocab = 64;
  sizes.context = 16;
  sizes.dropout = 0.1;
  sizes.fused_attention = false;  // the naive core saves the (N, H, T, T) probabilities
  const Graph built = build_token_model("gpt2", 2, 16, sizes);
  Graph g = build_token_model("gpt2", 2, 16, sizes);
  apply_precision(g, Precision::kBf16);
  // Dropout masks stay bytes, tokens int32; attention's probabilities are bf16.
  int masks = 0, probs = 0;
  for (const TensorInfo& t : g.tensors()) {
    masks += t.desc.dtype == DType::kU8;
    probs += t.desc.shape.rank() == 4 && t.desc.dtype == DType::kBF16;
  }
  EXPECT_GT(masks, 0);
  EXPECT_EQ(probs, 2);  // one (N, H, T, T) per layer
  EXPECT_EQ(g.tensor(g.input()).desc.dtype, DType::kI32);
  expect_rule(built, std::move(g));
}

// RMSNorm's saved inverse rms is a statistic (fp32); rotary qkv's and SwiGLU's outputs are bf16.
TEST(Precision, LlamaKeepsRmsNormStatisticsFp32) {
  TransformerSizes sizes;
  sizes.layers = 2;
  sizes.heads = 4;
  sizes.kv_heads = 2;
  sizes.width = 32;
  sizes.ffn = 48;
  sizes.vocab = 64;
  sizes.context = 16;
  sizes.fused_attention = false;  // expected() does not know the fused core's fp32 lse
  const Graph built = build_token_model("llama", 2, 16, sizes);
  Graph g = build_token_model("llama", 2, 16, sizes);
  apply_precision(g, Precision::kBf16);
  int rstd = 0, rope = 0, swiglu = 0;
  for (const TensorInfo& t : g.tensors()) {
    if (t.producer < 0) continue;
    const std::string_view op = g.nodes()[static_cast<size_t>(t.producer)].op->kind();
    if (op == "rmsnorm" && t.role == TensorRole::kAux) rstd += t.desc.dtype == DType::kF32;
    if (op == "rope_qkv") rope += t.desc.dtype == DType::kBF16;
    if (op == "swiglu") swiglu += t.desc.dtype == DType::kBF16;
  }
  EXPECT_EQ(rstd, 5);  // two per layer and the final norm
  EXPECT_EQ(rope, 2);
  EXPECT_EQ(swiglu, 2);
  expect_rule(built, std::move(g));
}

TEST(Precision, Fp32LeavesTheGraphAsBuilt) {
  const Graph built = build_model("resnet18_cifar", Shape{4, 3, 32, 32}, 10);
  Graph g = build_model("resnet18_cifar", Shape{4, 3, 32, 32}, 10);
  apply_precision(g, Precision::kFp32);
  for (size_t i = 0; i < built.tensors().size(); ++i)
    EXPECT_EQ(g.tensors()[i].desc, built.tensors()[i].desc) << built.tensors()[i].name;
}

}  // namespace
}  // namespace ferry
