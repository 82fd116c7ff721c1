// The transformer ops: token + position embedding, layer norm, GELU and the causal attention
// core (GPT-2's blocks; the linear layers and dropout are the shared ops). Activations are
// (rows = N * T, width) matrices, so every linear layer is one GEMM.
#include <fmt/format.h>

#include "trainer/model/ops/ops.h"

namespace ferry {
namespace {

float* f(void* p) { return static_cast<float*>(p); }
const float* cf(void* p) { return static_cast<const float*>(p); }
// Packed documents' segment starts, the embedding's and attention's optional second input
// (Note [Segments of a packed row] in device/kernels.h); null without them.
const int32_t* segments_of(const OpIo& io) {
  return io.inputs.size() > 1 ? static_cast<const int32_t*>(io.inputs[1]) : nullptr;
}

class EmbeddingOp : public Op {
 public:
  EmbeddingOp(const EmbeddingForward& shape, int64_t context, bool tied)
      : shape_(shape), context_(context), tied_(tied) {}
  std::string_view kind() const override { return "embedding"; }
  std::string describe() const override {
    return fmt::format("{} tokens + {} positions -> {}{}", shape_.vocab, context_, shape_.c,
                       tied_ ? ", tied head" : "");
  }
  // The tokens and, for packed documents, their segment starts (inputs[1]).
  SavedSet saved() const override { return {.inputs = 0b11}; }
  OpCost cost() const override {
    const double n = static_cast<double>(shape_.n) * shape_.t * shape_.c;
    return {n, 2 * n};
  }
  bool recomputable() const override { return true; }
  void forward(Kernels& k, Stream& s, const OpIo& io) const override {
    EmbeddingForward a = shape_;
    a.tokens = static_cast<const int32_t*>(io.inputs[0]);
    a.segments = segments_of(io);
    a.wte = cf(io.params[0]);
    a.wpe = cf(io.params[1]);
    a.y = f(io.outputs[0]);
    a.dtype = io.dtype;
    k.launch(a, s);
  }
  // With a tied head, the head's backward (earlier in the backward pass) wrote wte's gradient
  // first: the embedding adds to it.
  void backward(Kernels& k, Stream& s, const OpIo& io) const override {
    k.launch(EmbeddingBackward{shape_.n, shape_.t, shape_.c, shape_.vocab, context_,
                               static_cast<const int32_t*>(io.inputs[0]), cf(io.grad_outputs[0]),
                               f(io.grad_params[0]), f(io.grad_params[1]), tied_, segments_of(io),
                               io.dtype},
             s);
  }

 private:
  EmbeddingForward shape_;
  int64_t context_;
  bool tied_;
};

class LayerNormOp : public Op {
 public:
  explicit LayerNormOp(const LayerNormGeom& g) : g_(g) {}
  std::string_view kind() const override { return "layernorm"; }
  std::string describe() const override { return fmt::format("{}", g_.c); }
  SavedSet saved() const override { return {.inputs = 1, .aux = true}; }
  OpCost cost() const override {
    const double n = static_cast<double>(g_.rows) * g_.c;
    return {8 * n, 12 * n};
  }
  bool recomputable() const override { return true; }
  // dx over dy.
  std::vector<std::pair<int, int>> inplace(Pass pass) const override {
    if (pass == Pass::kBackward) return {{0, 0}};
    return {};
  }
  // A recompute leaves the saved statistics alone: it writes scratch copies, (2, rows) floats.
  uint64_t workspace_bytes(Kernels&, Pass pass, bool, DType) const override {
    return pass == Pass::kForward ? 2 * g_.rows * sizeof(float) : 0;
  }
  void forward(Kernels& k, Stream& s, const OpIo& io) const override {
    float* mean = f(io.ws.ptr);
    float* rstd = mean + g_.rows;
    if (!io.aux.empty()) {
      mean = f(io.aux[0]);
      rstd = f(io.aux[1]);
    }
    k.launch(LayerNormForward{g_, cf(io.inputs[0]), cf(io.params[0]), cf(io.params[1]),
                              f(io.outputs[0]), mean, rstd, io.dtype},
             s);
  }
  void backward(Kernels& k, Stream& s, const OpIo& io) const override {
    k.launch(LayerNormBackward{g_, cf(io.inputs[0]), cf(io.grad_outputs[0]), cf(io.params[0]),
                               cf(io.aux[0]), cf(io.aux[1]), f(io.grad_inputs[0]),
                               f(io.grad_params[0]), f(io.grad_params[1]), io.dtype},
             s);
  }

 private:
  LayerNormGeom g_;
};

class GeluOp : public Op {
 public:
  explicit GeluOp(int64_t n) : n_(n) {}
  std::string_view kind() const override { return "gelu"; }
  SavedSet saved() const override { return {.inputs = 1}; }
  OpCost cost() const override { return {10.0 * n_, 14.0 * n_}; }
  bool recomputable() const override { return true; }
  // dx over dy (the forward keeps x, which its backward reads).
  std::vector<std::pair<int, int>> inplace(Pass pass) const override {
    if (pass == Pass::kBackward) return {{0, 0}};
    return {};
  }
  void forward(Kernels& k, Stream& s, const OpIo& io) const override {
    k.launch(GeluForward{n_, cf(io.inputs[0]), f(io.outputs[0]), io.dtype}, s);
  }
  void backward(Kernels& k, Stream& s, const OpIo& io) const override {
    k.launch(
        GeluBackward{n_, cf(io.inputs[0]), cf(io.grad_outputs[0]), f(io.grad_inputs[0]), io.dtype},
        s);
  }

 private:
  int64_t n_;
};

// Note [Attention's saved probabilities]
// The naive core saves its softmax probabilities (N, heads, T, T), the largest tensor of a block
// at long sequences, next to qkv. They are its second output, so the planner can keep them, move
// them to the host, or (without dropout) drop them and run the core again from qkv to rebuild
// them, as FlashAttention recomputes its scores; a recompute rebuilds the probabilities only
// (the result alone would need them: rebuilt_outputs), passing a null result. With dropout the
// mask is aux state (kept or moved, never rebuilt), and the core is not recomputed.
// The fused core (model.attention=fused, Note [Fused attention] in device/kernels.h) saves y and
// its log-sum-exp (N, heads, T) instead: O(T) per head. Its backward recomputes the scores (one
// more q k^T per tile, in its FLOPs) and its dropout mask from the seed, so it is recomputable
// with dropout too, rebuilding either output.
class AttentionOp : public Op {
 public:
  AttentionOp(const AttentionGeom& g, bool fused) : g_(g), fused_(fused) {}
  std::string_view kind() const override { return "attention"; }
  std::string describe() const override {
    return fmt::format("{} heads x {}, causal{}{}", g_.heads, g_.head_dim(),
                       g_.dropout > 0 ? fmt::format(", dropout {}", g_.dropout) : "",
                       fused_ ? ", fused" : "");
  }
  // qkv and, for packed documents, the segment starts (inputs[1]); naive: the probabilities
  // (and the dropout mask); fused: y and the log-sum-exp.
  SavedSet saved() const override {
    if (fused_) return {.inputs = 0b11, .outputs = 0b11};
    return {.inputs = 0b11, .outputs = 2, .aux = true};
  }
  bool recomputable() const override { return fused_ || g_.dropout == 0; }
  uint32_t rebuilt_outputs() const override { return fused_ ? ~0u : 2; }
  // The fused core's log-sum-exp.
  uint32_t statistic_outputs() const override { return fused_ ? 2 : 0; }
  OpCost cost() const override {
    // Two (T x D) by (D x T) products per head forward, four backward; softmax per score. The
    // fused backward recomputes q k^T and the exponentials first.
    const double scores = static_cast<double>(g_.n) * g_.heads * g_.t * g_.t;
    const double d = static_cast<double>(g_.head_dim());
    const double backward = 8 * scores * d + 4 * scores;
    return {4 * scores * d + 5 * scores,
            fused_ ? backward + 2 * scores * d + 5 * scores : backward};
  }
  uint64_t workspace_bytes(Kernels& k, Pass pass, bool training, DType dtype) const override {
    if (fused_) return 0;  // the tiles are the kernels' own
    if (pass == Pass::kForward)
      return k.workspace_bytes(AttentionForward{.g = g_, .training = training, .dtype = dtype});
    return k.workspace_bytes(AttentionBackward{.g = g_, .dtype = dtype});
  }
  void forward(Kernels& k, Stream& s, const OpIo& io) const override {
    if (fused_) {
      k.launch(FlashAttentionForward{g_, io.training, io.seed, cf(io.inputs[0]), f(io.outputs[0]),
                                     f(io.outputs[1]), segments_of(io), io.dtype},
               s);
      return;
    }
    k.launch(AttentionForward{g_, io.training, io.seed, cf(io.inputs[0]), f(io.outputs[0]),
                              f(io.outputs[1]),
                              io.aux.empty() ? nullptr : static_cast<uint8_t*>(io.aux[0]), io.ws,
                              segments_of(io), io.dtype},
             s);
  }
  void backward(Kernels& k, Stream& s, const OpIo& io) const override {
    if (fused_) {
      k.launch(FlashAttentionBackward{g_, io.seed, cf(io.inputs[0]), cf(io.outputs[0]),
                                      cf(io.outputs[1]), cf(io.grad_outputs[0]),
                                      f(io.grad_inputs[0]), segments_of(io), io.dtype},
               s);
      return;
    }
    k.launch(AttentionBackward{g_, cf(io.inputs[0]), cf(io.outputs[1]),
                               io.aux.empty() ? nullptr : static_cast<const uint8_t*>(io.aux[0]),
                               cf(io.grad_outputs[0]), f(io.grad_inputs[0]), io.ws, segments_of(io),
                               io.dtype},
             s);
  }

 private:
  AttentionGeom g_;
  bool fused_;
};

}  // namespace

std::unique_ptr<Op> make_embedding(const EmbeddingForward& shape, int64_t context, bool tied) {
  return std::make_unique<EmbeddingOp>(shape, context, tied);
}
std::unique_ptr<Op> make_layer_norm(const LayerNormGeom& g) {
  return std::make_unique<LayerNormOp>(g);
}
std::unique_ptr<Op> make_gelu(int64_t n) { return std::make_unique<GeluOp>(n); }
std::unique_ptr<Op> make_attention(const AttentionGeom& g, bool fused) {
  return std::make_unique<AttentionOp>(g, fused);
}

}  // namespace ferry
