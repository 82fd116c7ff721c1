// GraphBuilder's Llama layers (graph.h): shapes checked as layers are added, user errors as one
// ConfigError naming the model key. The ops are in ops/llama.cc.
#include <fmt/format.h>

#include "common/error.h"
#include "trainer/model/graph.h"
#include "trainer/model/ops/ops.h"

namespace ferry {

TensorId GraphBuilder::token_embedding(const std::string& name, const std::string& wte,
                                       int64_t vocab, int64_t width, const ParamInit& init,
                                       bool tied, TensorId* wte_id) {
  FERRY_ASSERT(tokens(), "an embedding needs a token input");
  const Shape in = shape(graph_.input_);
  const TensorId table = add_param(wte, Shape{vocab, width}, init);
  if (wte_id) *wte_id = table;
  const EmbeddingForward shape_of{.n = in[0], .t = in[1], .c = width, .vocab = vocab};
  return add_node(name, make_token_embedding(shape_of, tied), {graph_.input_},
                  {Shape{in[0] * in[1], width}}, {table});
}

TensorId GraphBuilder::projection(TensorId x, const std::string& name, int64_t out_features,
                                  const ParamInit& weight) {
  expect_rank(x, 2, name);
  const Shape in = shape(x);
  const LinearGeom g{in[0], in[1], out_features};
  std::vector<TensorId> params{add_param(name + ".weight", Shape{out_features, in[1]}, weight)};
  return add_node(name, make_linear(g, false), {x}, {Shape{in[0], out_features}},
                  std::move(params));
}

TensorId GraphBuilder::rms_norm(TensorId x, const std::string& name, float eps) {
  expect_rank(x, 2, name);
  const Shape in = shape(x);
  std::vector<TensorId> params{
      add_param(name + ".weight", Shape{in[1]}, ParamInit::resolve(InitRule::kOnes, 0, 0))};
  const RmsNormGeom g{in[0], in[1], eps};
  return add_node(name, make_rms_norm(g), {x}, {in}, std::move(params), {},
                  {TensorDesc{Shape{in[0]}, DType::kF32}});
}

TensorId GraphBuilder::rope_qkv(TensorId q, TensorId k, TensorId v, const std::string& name,
                                int64_t heads, int64_t kv_heads, float theta) {
  FERRY_ASSERT(tokens(), "rotary embeddings need a token input");
  const Shape batch = shape(graph_.input_);
  const Shape qs = shape(q);
  if (kv_heads < 1 || heads % kv_heads != 0) {
    throw ConfigError(
        fmt::format("model.kv_heads ({}) must divide model.heads ({})", kv_heads, heads),
        "set model.kv_heads to a divisor of model.heads (equal to it: no grouped-query attention)");
  }
  if (qs.rank() != 2 || qs[0] != batch[0] * batch[1] || qs[1] % heads != 0) {
    throw ConfigError(fmt::format("rope '{}' expects q (N*T, heads*D) = ({}, {}*D), got {}", name,
                                  batch[0] * batch[1], heads, qs.str()));
  }
  const int64_t d = qs[1] / heads;
  if (d % 2 != 0) {
    throw ConfigError(
        fmt::format("rotary embeddings need an even head width; model.width / model.heads = {}", d),
        "pick model.width and model.heads so that their quotient is even");
  }
  const Shape kv{qs[0], kv_heads * d};
  if (shape(k) != kv || shape(v) != kv) {
    throw ConfigError(fmt::format("rope '{}' expects k and v {}, got {} and {}", name, kv.str(),
                                  shape(k).str(), shape(v).str()));
  }
  const RopeGeom g{batch[0], batch[1], heads, kv_heads, d, theta};
  std::vector<TensorId> inputs{q, k, v};
  if (graph_.segments_ != kNoTensor) inputs.push_back(graph_.segments_);
  return add_node(name, make_rope_qkv(g), std::move(inputs), {Shape{qs[0], 3 * qs[1]}});
}

TensorId GraphBuilder::swiglu(TensorId gate, TensorId up, const std::string& name) {
  const Shape in = shape(gate);
  if (shape(up) != in) {
    throw ConfigError(
        fmt::format("swiglu '{}': gate {} and up {} differ", name, in.str(), shape(up).str()));
  }
  return add_node(name, make_swiglu(in.numel()), {gate, up}, {in});
}

}  // namespace ferry
