// GraphBuilder: PyTorch layer semantics, shape checks and torchvision names.
#include "trainer/model/graph.h"

#include <fmt/format.h>

#include "common/error.h"
#include "trainer/model/ops/ops.h"

namespace ferry {

const ParamInit& Graph::init(TensorId param) const { return inits_[static_cast<size_t>(param)]; }

int64_t Graph::parameter_count() const {
  int64_t n = 0;
  for (TensorId p : params_) n += tensor(p).desc.shape.numel();
  return n;
}

std::vector<TensorId> Graph::saved_by(const Node& node) const {
  const SavedSet saved = node.op->saved();
  std::vector<TensorId> out;
  for (size_t i = 0; i < node.inputs.size(); ++i) {
    if (saved.inputs & (1u << i)) out.push_back(node.inputs[i]);
  }
  for (size_t i = 0; i < node.outputs.size(); ++i) {
    if (saved.outputs & (1u << i)) out.push_back(node.outputs[i]);
  }
  if (saved.aux) out.insert(out.end(), node.aux.begin(), node.aux.end());
  return out;
}

GraphBuilder::GraphBuilder(const Shape& input, int64_t classes, bool segments) : classes_(classes) {
  const bool tokens = input.rank() == 2;
  FERRY_ASSERT(tokens || !segments, "segment starts belong to a token input");
  bool positive = true;
  for (size_t i = 0; i < input.rank(); ++i) positive = positive && input[i] >= 1;
  if ((input.rank() != 4 && !tokens) || !positive) {
    throw ConfigError(fmt::format(
        "model input must be (N, C, H, W) images or (N, T) tokens with positive sizes, got {}",
        input.str()));
  }
  // Element counts of every tensor are int64: keep the batch far from overflowing them.
  constexpr int64_t kMaxElements = int64_t{1} << 48;
  int64_t elements = 1;
  for (size_t i = 0; i < input.rank(); ++i) {
    if (input[i] > kMaxElements / elements) {
      throw ConfigError(fmt::format("a batch of {} holds more than 2^48 values", input.str()),
                        "lower data.batch_size (per rank) or model.input");
    }
    elements *= input[i];
  }
  if (tokens) {
    graph_.input_ = add_tensor("input", {input, DType::kI32}, TensorRole::kInput);
    graph_.labels_ = add_tensor("labels", {input, DType::kI32}, TensorRole::kLabel);
    if (segments) {
      graph_.segments_ = add_tensor("segments", {input, DType::kI32}, TensorRole::kInput);
    }
    return;
  }
  graph_.input_ = add_tensor("input", {input, DType::kF32}, TensorRole::kInput);
  graph_.labels_ = add_tensor("labels", {Shape{input[0]}, DType::kI32}, TensorRole::kLabel);
}

TensorId GraphBuilder::add_tensor(std::string name, TensorDesc desc, TensorRole role) {
  graph_.tensors_.push_back(TensorInfo{std::move(name), std::move(desc), role, -1});
  graph_.inits_.emplace_back();
  return static_cast<TensorId>(graph_.tensors_.size() - 1);
}

TensorId GraphBuilder::add_param(const std::string& name, Shape shape, ParamInit init) {
  const TensorId id = add_tensor(name, {std::move(shape), DType::kF32}, TensorRole::kParam);
  graph_.inits_.back() = init;
  graph_.params_.push_back(id);
  return id;
}

TensorId GraphBuilder::add_buffer(const std::string& name, Shape shape, DType dtype,
                                  ParamInit init) {
  const TensorId id = add_tensor(name, {std::move(shape), dtype}, TensorRole::kBuffer);
  graph_.inits_.back() = init;
  graph_.buffers_.push_back(id);
  return id;
}

std::string GraphBuilder::auto_name(std::string_view kind) {
  return fmt::format("{}_{}", kind, unnamed_++);
}

TensorId GraphBuilder::add_node(std::string name, std::unique_ptr<Op> op,
                                std::vector<TensorId> inputs, std::vector<Shape> outputs,
                                std::vector<TensorId> params, std::vector<TensorId> buffers,
                                std::vector<TensorDesc> aux) {
  const int index = static_cast<int>(graph_.nodes_.size());
  Node node;
  node.name = name.empty() ? auto_name(op->kind()) : std::move(name);
  node.op = std::move(op);
  node.inputs = std::move(inputs);
  node.params = std::move(params);
  node.buffers = std::move(buffers);
  for (size_t i = 0; i < outputs.size(); ++i) {
    const std::string out_name =
        outputs.size() == 1 ? node.name : fmt::format("{}.{}", node.name, i);
    const TensorId t =
        add_tensor(out_name, {std::move(outputs[i]), DType::kF32}, TensorRole::kActivation);
    graph_.tensors_[static_cast<size_t>(t)].producer = index;
    node.outputs.push_back(t);
  }
  for (size_t i = 0; i < aux.size(); ++i) {
    const TensorId t =
        add_tensor(fmt::format("{}.aux{}", node.name, i), std::move(aux[i]), TensorRole::kAux);
    graph_.tensors_[static_cast<size_t>(t)].producer = index;
    node.aux.push_back(t);
  }
  graph_.nodes_.push_back(std::move(node));
  return graph_.nodes_.back().outputs.empty() ? kNoTensor : graph_.nodes_.back().outputs[0];
}

void GraphBuilder::expect_rank(TensorId x, size_t rank, const std::string& layer) const {
  if (shape(x).rank() != rank) {
    throw ConfigError(
        fmt::format("layer '{}' expects a rank-{} input, got {}", layer, rank, shape(x).str()),
        "check model.input against the model");
  }
}

TensorId GraphBuilder::conv2d(TensorId x, const std::string& name, int64_t out_channels,
                              int64_t kernel, int64_t stride, int64_t padding, int64_t groups,
                              bool bias) {
  expect_rank(x, 4, name);
  const Shape& in = shape(x);
  ConvGeom g{in[0],  in[1],  in[2],  in[3],   out_channels, kernel,
             kernel, stride, stride, padding, padding,      groups};
  if (g.c % groups != 0 || out_channels % groups != 0) {
    throw ConfigError(
        fmt::format("layer '{}': {} input and {} output channels are not divisible "
                    "by {} groups",
                    name, g.c, out_channels, groups));
  }
  if (g.out_h() < 1 || g.out_w() < 1) {
    throw ConfigError(fmt::format("layer '{}': input {} is too small for a {}x{} kernel", name,
                                  in.str(), kernel, kernel),
                      "use a larger model.input or a model made for small images (*_cifar)");
  }
  const int64_t fan_in = g.c / groups * kernel * kernel;
  const int64_t fan_out = out_channels / groups * kernel * kernel;
  std::vector<TensorId> params{add_param(name + ".weight",
                                         Shape{out_channels, g.c / groups, kernel, kernel},
                                         ParamInit::resolve(conv_w_, fan_in, fan_out))};
  if (bias) {
    params.push_back(add_param(name + ".bias", Shape{out_channels},
                               ParamInit::resolve(conv_b_, fan_in, fan_out)));
  }
  return add_node(name, make_conv2d(g, bias), {x}, {Shape{g.n, g.k, g.out_h(), g.out_w()}},
                  std::move(params));
}

TensorId GraphBuilder::batch_norm(TensorId x, const std::string& name, float eps, float momentum) {
  expect_rank(x, 4, name);
  const Shape in = shape(x);
  const int64_t c = in[1];
  std::vector<TensorId> params{
      add_param(name + ".weight", Shape{c}, ParamInit::resolve(InitRule::kOnes, 0, 0)),
      add_param(name + ".bias", Shape{c}, ParamInit::resolve(InitRule::kZeros, 0, 0))};
  std::vector<TensorId> buffers{add_buffer(name + ".running_mean", Shape{c}, DType::kF32,
                                           ParamInit::resolve(InitRule::kZeros, 0, 0)),
                                add_buffer(name + ".running_var", Shape{c}, DType::kF32,
                                           ParamInit::resolve(InitRule::kOnes, 0, 0)),
                                add_buffer(name + ".num_batches_tracked", Shape{}, DType::kI64,
                                           ParamInit::resolve(InitRule::kZeros, 0, 0))};
  const BatchNormGeom g{in[0], c, in[2] * in[3], eps};
  return add_node(name, make_batch_norm(g, momentum), {x}, {in}, std::move(params),
                  std::move(buffers),
                  {TensorDesc{Shape{c}, DType::kF32}, TensorDesc{Shape{c}, DType::kF32}});
}

TensorId GraphBuilder::linear(TensorId x, const std::string& name, int64_t out_features,
                              bool bias) {
  expect_rank(x, 2, name);
  const Shape in = shape(x);
  const LinearGeom g{in[0], in[1], out_features};
  std::vector<TensorId> params{add_param(name + ".weight", Shape{out_features, in[1]},
                                         ParamInit::resolve(lin_w_, in[1], out_features))};
  if (bias) {
    params.push_back(add_param(name + ".bias", Shape{out_features},
                               ParamInit::resolve(lin_b_, in[1], out_features)));
  }
  return add_node(name, make_linear(g, bias), {x}, {Shape{in[0], out_features}}, std::move(params));
}

TensorId GraphBuilder::relu(TensorId x, const std::string& name) {
  const Shape in = shape(x);
  return add_node(name, make_relu(in.numel()), {x}, {in});
}

TensorId GraphBuilder::max_pool(TensorId x, int64_t kernel, int64_t stride, int64_t padding,
                                bool ceil_mode, const std::string& name) {
  expect_rank(x, 4, name.empty() ? "maxpool" : name);
  const Shape in = shape(x);
  PoolGeom g{PoolKind::kMax, in[0],  in[1],   in[2],   in[3],     kernel, kernel,
             stride,         stride, padding, padding, ceil_mode, true};
  if (g.out_h() < 1 || g.out_w() < 1 || 2 * padding > kernel) {
    throw ConfigError(
        fmt::format("max pool {}x{} does not fit input {}", kernel, kernel, in.str()));
  }
  return add_node(name, make_pool(g), {x}, {Shape{in[0], in[1], g.out_h(), g.out_w()}});
}

TensorId GraphBuilder::avg_pool(TensorId x, int64_t kernel, int64_t stride, int64_t padding,
                                bool ceil_mode, bool count_include_pad, const std::string& name) {
  expect_rank(x, 4, name.empty() ? "avgpool" : name);
  const Shape in = shape(x);
  PoolGeom g{PoolKind::kAvg, in[0],  in[1],   in[2],   in[3],     kernel,           kernel,
             stride,         stride, padding, padding, ceil_mode, count_include_pad};
  if (g.out_h() < 1 || g.out_w() < 1 || 2 * padding > kernel) {
    throw ConfigError(
        fmt::format("avg pool {}x{} does not fit input {}", kernel, kernel, in.str()));
  }
  return add_node(name, make_pool(g), {x}, {Shape{in[0], in[1], g.out_h(), g.out_w()}});
}

TensorId GraphBuilder::adaptive_avg_pool(TensorId x, int64_t out_h, int64_t out_w,
                                         const std::string& name) {
  expect_rank(x, 4, name.empty() ? "adaptive_avgpool" : name);
  const Shape in = shape(x);
  AdaptiveAvgPoolForward a{in[0], in[1], in[2], in[3], out_h, out_w};
  return add_node(name, make_adaptive_avg_pool(a), {x}, {Shape{in[0], in[1], out_h, out_w}});
}

TensorId GraphBuilder::flatten(TensorId x, const std::string& name) {
  const Shape in = shape(x);
  return add_node(name, make_flatten(in.numel()), {x}, {Shape{in[0], in.numel() / in[0]}});
}

TensorId GraphBuilder::dropout(TensorId x, float p, const std::string& name) {
  const Shape in = shape(x);
  return add_node(name, make_dropout(in.numel(), p), {x}, {in}, {}, {},
                  {TensorDesc{in, DType::kU8}});
}

TensorId GraphBuilder::add(TensorId a, TensorId b, const std::string& name) {
  if (shape(a) != shape(b)) {
    throw ConfigError(
        fmt::format("add '{}': shapes {} and {} differ", name, shape(a).str(), shape(b).str()));
  }
  const Shape in = shape(a);
  return add_node(name, make_add(in.numel()), {a, b}, {in});
}

// Note [Tied weights]
// GPT-2's LM head multiplies by the token embedding's table. The table is one parameter listed
// by both nodes: the head's backward (first in the backward pass) writes its gradient, the
// embedding's adds to it, and the gradient counts as written (ready to all-reduce) only after
// the embedding's backward (Program's grads_written lists a parameter at its last writer).
TensorId GraphBuilder::embedding(const std::string& name, const std::string& wte,
                                 const std::string& wpe, int64_t vocab, int64_t context,
                                 int64_t width, const ParamInit& init, bool tied,
                                 TensorId* wte_id) {
  FERRY_ASSERT(tokens(), "an embedding needs a token input");
  const Shape in = shape(graph_.input_);
  if (in[1] > context) {
    throw ConfigError(
        fmt::format("{} tokens per row exceed the model's context of {}", in[1], context),
        "lower data.seq_len or raise model.context");
  }
  const TensorId table = add_param(wte, Shape{vocab, width}, init);
  const TensorId positions = add_param(wpe, Shape{context, width}, init);
  if (wte_id) *wte_id = table;
  EmbeddingForward shape_of{.n = in[0], .t = in[1], .c = width, .vocab = vocab};
  std::vector<TensorId> inputs{graph_.input_};
  if (graph_.segments_ != kNoTensor) inputs.push_back(graph_.segments_);
  return add_node(name, make_embedding(shape_of, context, tied), std::move(inputs),
                  {Shape{in[0] * in[1], width}}, {table, positions});
}

TensorId GraphBuilder::layer_norm(TensorId x, const std::string& name, float eps) {
  expect_rank(x, 2, name);
  const Shape in = shape(x);
  std::vector<TensorId> params{
      add_param(name + ".weight", Shape{in[1]}, ParamInit::resolve(InitRule::kOnes, 0, 0)),
      add_param(name + ".bias", Shape{in[1]}, ParamInit::resolve(InitRule::kZeros, 0, 0))};
  const LayerNormGeom g{in[0], in[1], eps};
  return add_node(name, make_layer_norm(g), {x}, {in}, std::move(params), {},
                  {TensorDesc{Shape{in[0]}, DType::kF32}, TensorDesc{Shape{in[0]}, DType::kF32}});
}

TensorId GraphBuilder::gelu(TensorId x, const std::string& name) {
  const Shape in = shape(x);
  return add_node(name, make_gelu(in.numel()), {x}, {in});
}

TensorId GraphBuilder::conv1d(TensorId x, const std::string& name, int64_t out_features,
                              const ParamInit& weight) {
  expect_rank(x, 2, name);
  const Shape in = shape(x);
  const LinearGeom g{in[0], in[1], out_features, /*weight_in_out=*/true};
  std::vector<TensorId> params{
      add_param(name + ".weight", Shape{in[1], out_features}, weight),
      add_param(name + ".bias", Shape{out_features}, ParamInit::resolve(InitRule::kZeros, 0, 0))};
  return add_node(name, make_linear(g, true), {x}, {Shape{in[0], out_features}}, std::move(params));
}

TensorId GraphBuilder::attention(TensorId qkv, const std::string& name, int64_t heads,
                                 float dropout) {
  expect_rank(qkv, 2, name);
  FERRY_ASSERT(tokens(), "attention needs a token input");
  const Shape in = shape(qkv);
  const Shape batch = shape(graph_.input_);
  const int64_t c = in[1] / 3;
  if (in[1] % 3 != 0 || in[0] != batch[0] * batch[1]) {
    throw ConfigError(fmt::format("attention '{}' expects (N*T, 3C) = ({}, 3C), got {}", name,
                                  batch[0] * batch[1], in.str()));
  }
  if (heads < 1 || c % heads != 0) {
    throw ConfigError(fmt::format("model.heads ({}) must divide model.width ({})", heads, c),
                      "pick a width that is a multiple of the head count");
  }
  const AttentionGeom g{batch[0], batch[1], heads, c, dropout};
  const Shape scores{batch[0], heads, batch[1], batch[1]};
  std::vector<TensorDesc> aux;
  if (dropout > 0 && !fused_attention_) aux.push_back(TensorDesc{scores, DType::kU8});
  std::vector<TensorId> inputs{qkv};
  if (graph_.segments_ != kNoTensor) inputs.push_back(graph_.segments_);
  // Fused: the second output is the log-sum-exp per query (N, heads, T), not the scores.
  const Shape saved = fused_attention_ ? Shape{batch[0], heads, batch[1]} : scores;
  return add_node(name, make_attention(g, fused_attention_), std::move(inputs),
                  {Shape{in[0], c}, saved}, {}, {}, std::move(aux));
}

TensorId GraphBuilder::tied_linear(TensorId x, const std::string& name, TensorId weight) {
  expect_rank(x, 2, name);
  const Shape in = shape(x);
  const Shape& w = shape(weight);
  FERRY_ASSERT(graph_.tensor(weight).role == TensorRole::kParam && w.rank() == 2 && w[1] == in[1],
               "a tied linear layer needs an (out, in) parameter");
  const LinearGeom g{in[0], in[1], w[0]};
  return add_node(name, make_linear(g, false), {x}, {Shape{in[0], w[0]}}, {weight});
}

void GraphBuilder::loss(TensorId logits) {
  const Shape in = shape(logits);
  if (in.rank() != 2 || in[1] != classes_) {
    throw ConfigError(
        fmt::format("the model's logits are {} but model.classes is {}", in.str(), classes_));
  }
  FERRY_ASSERT(in[0] == shape(graph_.labels_).numel(), "one label per row of logits");
  graph_.logits_ = logits;
  const int index = static_cast<int>(graph_.nodes_.size());
  Node node;
  node.name = "loss";
  node.op = make_softmax_cross_entropy(in[0], in[1]);
  node.inputs = {logits, graph_.labels_};
  graph_.loss_ = add_tensor("loss", {Shape{}, DType::kF32}, TensorRole::kMetric);
  graph_.correct_ = add_tensor("correct", {Shape{}, DType::kI32}, TensorRole::kMetric);
  graph_.tensors_[static_cast<size_t>(graph_.loss_)].producer = index;
  graph_.tensors_[static_cast<size_t>(graph_.correct_)].producer = index;
  node.outputs = {graph_.loss_, graph_.correct_};
  const TensorId probs = add_tensor("loss.probs", {in, DType::kF32}, TensorRole::kAux);
  graph_.tensors_[static_cast<size_t>(probs)].producer = index;
  node.aux = {probs};
  graph_.nodes_.push_back(std::move(node));
}

Graph GraphBuilder::finish() {
  FERRY_ASSERT(graph_.loss_ != kNoTensor, "a graph must end with loss()");
  return std::move(graph_);
}

}  // namespace ferry
