// A model graph for one input shape: a DAG of nodes (ResNet's skips included) over a tensor
// table, built by the model zoo through GraphBuilder. Invariants: nodes are in a topological
// order; every activation has exactly one producer; every parameter belongs to one node, except
// a tied weight (GPT-2's token embedding, also its LM head), whose gradient the later node in
// forward order accumulates (Note [Tied weights] in graph.cc).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "device/precision.h"
#include "trainer/model/init.h"
#include "trainer/model/op.h"
#include "trainer/model/tensor.h"

namespace ferry {

struct Node {
  std::string name;  // the torchvision module path when there is one ("layer1.0.conv1")
  std::unique_ptr<Op> op;
  std::vector<TensorId> inputs;
  std::vector<TensorId> outputs;
  std::vector<TensorId> params;
  std::vector<TensorId> buffers;
  std::vector<TensorId> aux;
};

class Graph {
 public:
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const TensorInfo& tensor(TensorId id) const { return tensors_[static_cast<size_t>(id)]; }
  const std::vector<Node>& nodes() const { return nodes_; }
  // Parameters and buffers in state_dict order, with their initialisers.
  const std::vector<TensorId>& params() const { return params_; }
  const std::vector<TensorId>& buffers() const { return buffers_; }
  const ParamInit& init(TensorId param) const;
  TensorId input() const { return input_; }
  TensorId labels() const { return labels_; }
  // Packed documents' segment starts (N, T) int32, uploaded with the batch (Note [Segments of a
  // packed row] in device/kernels.h); kNoTensor for any other graph.
  TensorId segments() const { return segments_; }
  TensorId logits() const { return logits_; }
  TensorId loss() const { return loss_; }
  TensorId correct() const { return correct_; }
  int64_t batch() const { return tensor(input_).desc.shape[0]; }
  // Number of trained parameters (elements), as torchvision counts them.
  int64_t parameter_count() const;
  // The tensors a node's backward reads, from its op's SavedSet.
  std::vector<TensorId> saved_by(const Node& node) const;

 private:
  friend class GraphBuilder;
  friend void apply_precision(Graph& graph, Precision precision);  // trainer/model/precision.h
  std::vector<TensorInfo> tensors_;
  std::vector<Node> nodes_;
  std::vector<TensorId> params_;
  std::vector<TensorId> buffers_;
  std::vector<ParamInit> inits_;  // parallel to tensors_ (meaningful for params and buffers)
  TensorId input_ = kNoTensor, labels_ = kNoTensor, segments_ = kNoTensor, logits_ = kNoTensor,
           loss_ = kNoTensor, correct_ = kNoTensor;
};

// Builds a Graph layer by layer with PyTorch's layer semantics and default initialisers.
// Shapes are checked as layers are added; a mismatch is a ConfigError naming the layer.
class GraphBuilder {
 public:
  // input: images (N, C, H, W), float, with labels (N); or tokens (N, T), int32, with one label
  // (the next token) per position, (N, T), and with `segments` (packed documents: data.pack) a
  // third input of segment starts (N, T) int32 that the embedding and attention read. classes:
  // the width of the logits the loss expects.
  GraphBuilder(const Shape& input, int64_t classes, bool segments = false);
  bool tokens() const { return shape(graph_.input_).rank() == 2; }

  TensorId input() const { return graph_.input_; }
  const Shape& shape(TensorId t) const { return graph_.tensor(t).desc.shape; }
  int64_t classes() const { return classes_; }

  // Initialisers used for layers added from now on (torchvision models set their own).
  void set_conv_init(InitRule weight, InitRule bias) {
    conv_w_ = weight;
    conv_b_ = bias;
  }
  void set_linear_init(InitRule weight, InitRule bias) {
    lin_w_ = weight;
    lin_b_ = bias;
  }

  TensorId conv2d(TensorId x, const std::string& name, int64_t out_channels, int64_t kernel,
                  int64_t stride = 1, int64_t padding = 0, int64_t groups = 1, bool bias = true);
  TensorId batch_norm(TensorId x, const std::string& name, float eps = 1e-5f,
                      float momentum = 0.1f);
  TensorId linear(TensorId x, const std::string& name, int64_t out_features, bool bias = true);
  TensorId relu(TensorId x, const std::string& name = {});
  TensorId max_pool(TensorId x, int64_t kernel, int64_t stride, int64_t padding = 0,
                    bool ceil_mode = false, const std::string& name = {});
  TensorId avg_pool(TensorId x, int64_t kernel, int64_t stride, int64_t padding = 0,
                    bool ceil_mode = false, bool count_include_pad = true,
                    const std::string& name = {});
  TensorId adaptive_avg_pool(TensorId x, int64_t out_h, int64_t out_w,
                             const std::string& name = {});
  TensorId flatten(TensorId x, const std::string& name = {});
  TensorId dropout(TensorId x, float p, const std::string& name = {});
  TensorId add(TensorId a, TensorId b, const std::string& name = {});

  // Transformer layers (Hugging Face's GPT-2 semantics). Activations are (N*T, width).
  // Token + position embedding of the token input: params `wte` (vocab, width) and `wpe`
  // (context, width) drawn from `init`; returns (N*T, width) and the token table's id in *wte
  // (for a tied head). tied: a later tied_linear shares wte.
  TensorId embedding(const std::string& name, const std::string& wte, const std::string& wpe,
                     int64_t vocab, int64_t context, int64_t width, const ParamInit& init,
                     bool tied, TensorId* wte_id);
  TensorId layer_norm(TensorId x, const std::string& name, float eps = 1e-5f);
  TensorId gelu(TensorId x, const std::string& name = {});
  // Hugging Face's Conv1D: a linear layer whose weight is stored (in, out); bias zeros.
  TensorId conv1d(TensorId x, const std::string& name, int64_t out_features,
                  const ParamInit& weight);
  // qkv (N*T, 3C) -> (N*T, C): causal multi-head attention over the token input's (N, T).
  TensorId attention(TensorId qkv, const std::string& name, int64_t heads, float dropout);
  // A bias-free linear layer over an existing (out, in) parameter (a tied LM head).
  TensorId tied_linear(TensorId x, const std::string& name, TensorId weight);

  // Softmax cross-entropy of `logits` (rows, classes) against the labels (one per row); ends
  // the graph.
  void loss(TensorId logits);

  Graph finish();

 private:
  TensorId add_tensor(std::string name, TensorDesc desc, TensorRole role);
  TensorId add_param(const std::string& name, Shape shape, ParamInit init);
  TensorId add_buffer(const std::string& name, Shape shape, DType dtype, ParamInit init);
  TensorId add_node(std::string name, std::unique_ptr<Op> op, std::vector<TensorId> inputs,
                    std::vector<Shape> outputs, std::vector<TensorId> params = {},
                    std::vector<TensorId> buffers = {}, std::vector<TensorDesc> aux = {});
  std::string auto_name(std::string_view kind);
  void expect_rank(TensorId x, size_t rank, const std::string& layer) const;

  Graph graph_;
  int64_t classes_;
  int unnamed_ = 0;
  InitRule conv_w_ = InitRule::kTorchDefault;
  InitRule conv_b_ = InitRule::kTorchDefault;
  InitRule lin_w_ = InitRule::kTorchDefault;
  InitRule lin_b_ = InitRule::kTorchDefault;
};

}  // namespace ferry
