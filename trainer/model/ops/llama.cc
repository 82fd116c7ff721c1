// The Llama family's ops (Hugging Face's LlamaForCausalLM): a token embedding without positions,
// RMSNorm, rotary embeddings into the attention core's qkv (grouped-query heads repeated), and
// SwiGLU's gate. Activations are (rows = N * T, width) matrices, as in transformer.cc. Each op
// passes its node's storage dtype to its kernels (Note [Storage dtype of a kernel]).
#include <fmt/format.h>

#include "trainer/model/ops/ops.h"

namespace ferry {
namespace {

float* f(void* p) { return static_cast<float*>(p); }
const float* cf(void* p) { return static_cast<const float*>(p); }
const int32_t* segments_at(const OpIo& io, size_t i) {
  return io.inputs.size() > i ? static_cast<const int32_t*>(io.inputs[i]) : nullptr;
}

// The embedding kernels with no position table (EmbeddingForward's null wpe).
class TokenEmbeddingOp : public Op {
 public:
  TokenEmbeddingOp(const EmbeddingForward& shape, bool tied) : shape_(shape), tied_(tied) {}
  std::string_view kind() const override { return "embedding"; }
  std::string describe() const override {
    return fmt::format("{} tokens -> {}{}", shape_.vocab, shape_.c, tied_ ? ", tied head" : "");
  }
  SavedSet saved() const override { return {.inputs = 1}; }
  OpCost cost() const override {
    const double n = static_cast<double>(shape_.n) * shape_.t * shape_.c;
    return {n, n};
  }
  bool recomputable() const override { return true; }
  void forward(Kernels& k, Stream& s, const OpIo& io) const override {
    EmbeddingForward a = shape_;
    a.tokens = static_cast<const int32_t*>(io.inputs[0]);
    a.wte = cf(io.params[0]);
    a.y = f(io.outputs[0]);
    a.dtype = io.dtype;
    k.launch(a, s);
  }
  // Tied: the head's backward wrote wte's gradient first (Note [Tied weights] in graph.cc).
  void backward(Kernels& k, Stream& s, const OpIo& io) const override {
    k.launch(EmbeddingBackward{shape_.n, shape_.t, shape_.c, shape_.vocab, shape_.t,
                               static_cast<const int32_t*>(io.inputs[0]), cf(io.grad_outputs[0]),
                               f(io.grad_params[0]), nullptr, tied_, nullptr, io.dtype},
             s);
  }

 private:
  EmbeddingForward shape_;
  bool tied_;
};

class RmsNormOp : public Op {
 public:
  explicit RmsNormOp(const RmsNormGeom& g) : g_(g) {}
  std::string_view kind() const override { return "rmsnorm"; }
  std::string describe() const override { return fmt::format("{}, eps {}", g_.c, g_.eps); }
  SavedSet saved() const override { return {.inputs = 1, .aux = true}; }
  OpCost cost() const override {
    const double n = static_cast<double>(g_.rows) * g_.c;
    return {4 * n, 8 * n};
  }
  bool recomputable() const override { return true; }
  // dx over dy.
  std::vector<std::pair<int, int>> inplace(Pass pass) const override {
    if (pass == Pass::kBackward) return {{0, 0}};
    return {};
  }
  // A recompute leaves the saved rstd alone: it writes a scratch copy, (rows) floats.
  uint64_t workspace_bytes(Kernels&, Pass pass, bool, DType) const override {
    return pass == Pass::kForward ? g_.rows * sizeof(float) : 0;
  }
  void forward(Kernels& k, Stream& s, const OpIo& io) const override {
    float* rstd = io.aux.empty() ? f(io.ws.ptr) : f(io.aux[0]);
    k.launch(
        RmsNormForward{g_, cf(io.inputs[0]), cf(io.params[0]), f(io.outputs[0]), rstd, io.dtype},
        s);
  }
  void backward(Kernels& k, Stream& s, const OpIo& io) const override {
    k.launch(RmsNormBackward{g_, cf(io.inputs[0]), cf(io.grad_outputs[0]), cf(io.params[0]),
                             cf(io.aux[0]), f(io.grad_inputs[0]), f(io.grad_params[0]), io.dtype},
             s);
  }

 private:
  RmsNormGeom g_;
};

// Note [Rotary embeddings into the attention's qkv] in device/kernels_llama.h. The op is linear
// in q, k and v: its backward reads only the segment starts (packed documents), so it saves
// nothing else, and a recompute is a cheap pass over the three projections.
class RopeQkvOp : public Op {
 public:
  explicit RopeQkvOp(const RopeGeom& g) : g_(g) {}
  std::string_view kind() const override { return "rope_qkv"; }
  std::string describe() const override {
    return fmt::format("{} heads, {} kv heads x {}, theta {}", g_.heads, g_.kv_heads, g_.head_dim,
                       g_.theta);
  }
  SavedSet saved() const override { return {.inputs = 0b1000}; }
  OpCost cost() const override {
    const double q = static_cast<double>(g_.n) * g_.t * g_.q_width();
    return {3 * q + 3 * q, 3 * q + 3 * q};
  }
  bool recomputable() const override { return true; }
  void forward(Kernels& k, Stream& s, const OpIo& io) const override {
    k.launch(RopeQkvForward{g_, cf(io.inputs[0]), cf(io.inputs[1]), cf(io.inputs[2]),
                            f(io.outputs[0]), segments_at(io, 3), io.dtype},
             s);
  }
  void backward(Kernels& k, Stream& s, const OpIo& io) const override {
    const auto grad = [&](size_t i) {
      return i < io.grad_inputs.size() ? f(io.grad_inputs[i]) : nullptr;
    };
    k.launch(RopeQkvBackward{g_, cf(io.grad_outputs[0]), grad(0), grad(1), grad(2),
                             segments_at(io, 3), io.dtype},
             s);
  }

 private:
  RopeGeom g_;
};

class SwigluOp : public Op {
 public:
  explicit SwigluOp(int64_t n) : n_(n) {}
  std::string_view kind() const override { return "swiglu"; }
  SavedSet saved() const override { return {.inputs = 0b11}; }
  OpCost cost() const override { return {6.0 * n_, 12.0 * n_}; }
  bool recomputable() const override { return true; }
  // dgate over dy.
  std::vector<std::pair<int, int>> inplace(Pass pass) const override {
    if (pass == Pass::kBackward) return {{0, 0}};
    return {};
  }
  void forward(Kernels& k, Stream& s, const OpIo& io) const override {
    k.launch(SwigluForward{n_, cf(io.inputs[0]), cf(io.inputs[1]), f(io.outputs[0]), io.dtype}, s);
  }
  void backward(Kernels& k, Stream& s, const OpIo& io) const override {
    k.launch(SwigluBackward{n_, cf(io.inputs[0]), cf(io.inputs[1]), cf(io.grad_outputs[0]),
                            f(io.grad_inputs[0]), f(io.grad_inputs[1]), io.dtype},
             s);
  }

 private:
  int64_t n_;
};

}  // namespace

std::unique_ptr<Op> make_token_embedding(const EmbeddingForward& shape, bool tied) {
  return std::make_unique<TokenEmbeddingOp>(shape, tied);
}
std::unique_ptr<Op> make_rms_norm(const RmsNormGeom& g) { return std::make_unique<RmsNormOp>(g); }
std::unique_ptr<Op> make_rope_qkv(const RopeGeom& g) { return std::make_unique<RopeQkvOp>(g); }
std::unique_ptr<Op> make_swiglu(int64_t n) { return std::make_unique<SwigluOp>(n); }

}  // namespace ferry
