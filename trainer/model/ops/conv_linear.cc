// conv2d and linear: the ops with weights and a workspace.
#include <fmt/format.h>

#include "trainer/model/ops/ops.h"

namespace ferry {
namespace {

float* f(void* p) { return static_cast<float*>(p); }
const float* cf(void* p) { return static_cast<const float*>(p); }
// The weight a product reads: the bf16 working copy in bf16 storage, else the fp32 parameter.
const float* weight(const OpIo& io) {
  return cf(io.dtype == DType::kBF16 ? io.working[0] : io.params[0]);
}

// Workspace queries ignore addresses but not whether a bias exists: a stand-in marks it.
float bias_marker;

class Conv2dOp : public Op {
 public:
  Conv2dOp(const ConvGeom& g, bool bias) : g_(g), bias_(bias) {}
  std::string_view kind() const override { return "conv2d"; }
  std::string describe() const override {
    std::string s = fmt::format("{}x{}", g_.r, g_.s);
    if (g_.stride_h != 1 || g_.stride_w != 1) s += fmt::format(" s{}", g_.stride_h);
    if (g_.pad_h || g_.pad_w) s += fmt::format(" p{}", g_.pad_h);
    if (g_.groups != 1) s += fmt::format(" g{}", g_.groups);
    return s + fmt::format(", {}->{}", g_.c, g_.k);
  }
  SavedSet saved() const override { return {.inputs = 1}; }
  // Runs again with the same geometry, hence the same algorithm and workspace (the plan keeps
  // its forward workspace for the recompute step): the same bits from the same input and weights.
  bool recomputable() const override { return true; }
  uint32_t working_params() const override { return 1u; }  // weight(): the working copy
  OpCost cost() const override {
    const double macs = static_cast<double>(g_.n) * g_.k * g_.out_h() * g_.out_w() *
                        (g_.c / g_.groups) * g_.r * g_.s;
    return {2 * macs, 4 * macs};
  }
  uint64_t workspace_bytes(Kernels& k, Pass pass, bool, DType dtype) const override {
    float* bias = bias_ ? &bias_marker : nullptr;
    if (pass == Pass::kForward)
      return k.workspace_bytes(ConvForward{.g = g_, .bias = bias, .dtype = dtype});
    return std::max(k.workspace_bytes(ConvBackwardData{.g = g_, .dtype = dtype}),
                    k.workspace_bytes(ConvBackwardWeights{.g = g_, .dbias = bias, .dtype = dtype}));
  }
  void forward(Kernels& k, Stream& s, const OpIo& io) const override {
    k.launch(ConvForward{g_, cf(io.inputs[0]), weight(io), bias_ ? cf(io.params[1]) : nullptr,
                         f(io.outputs[0]), io.ws, io.dtype},
             s);
  }
  void backward(Kernels& k, Stream& s, const OpIo& io) const override {
    if (io.grad_inputs[0]) {
      k.launch(ConvBackwardData{g_, cf(io.grad_outputs[0]), weight(io), f(io.grad_inputs[0]), io.ws,
                                io.dtype},
               s);
    }
    k.launch(ConvBackwardWeights{g_, cf(io.inputs[0]), cf(io.grad_outputs[0]), f(io.grad_params[0]),
                                 bias_ ? f(io.grad_params[1]) : nullptr, io.ws, io.dtype},
             s);
  }

 private:
  ConvGeom g_;
  bool bias_;
};

class LinearOp : public Op {
 public:
  LinearOp(const LinearGeom& g, bool bias) : g_(g), bias_(bias) {}
  std::string_view kind() const override { return "linear"; }
  std::string describe() const override { return fmt::format("{}->{}", g_.k, g_.n); }
  SavedSet saved() const override { return {.inputs = 1}; }
  bool recomputable() const override { return true; }
  uint32_t working_params() const override { return 1u; }  // weight(): the working copy
  OpCost cost() const override {
    const double macs = static_cast<double>(g_.m) * g_.n * g_.k;
    return {2 * macs, 4 * macs};
  }
  uint64_t workspace_bytes(Kernels& k, Pass pass, bool, DType dtype) const override {
    float* bias = bias_ ? &bias_marker : nullptr;
    if (pass == Pass::kForward)
      return k.workspace_bytes(LinearForward{.g = g_, .bias = bias, .dtype = dtype});
    return std::max(
        k.workspace_bytes(LinearBackwardData{.g = g_, .dtype = dtype}),
        k.workspace_bytes(LinearBackwardWeights{.g = g_, .dbias = bias, .dtype = dtype}));
  }
  void forward(Kernels& k, Stream& s, const OpIo& io) const override {
    k.launch(LinearForward{g_, cf(io.inputs[0]), weight(io), bias_ ? cf(io.params[1]) : nullptr,
                           f(io.outputs[0]), io.ws, io.dtype},
             s);
  }
  void backward(Kernels& k, Stream& s, const OpIo& io) const override {
    if (io.grad_inputs[0]) {
      k.launch(LinearBackwardData{g_, cf(io.grad_outputs[0]), weight(io), f(io.grad_inputs[0]),
                                  io.ws, io.dtype},
               s);
    }
    k.launch(
        LinearBackwardWeights{g_, cf(io.inputs[0]), cf(io.grad_outputs[0]), f(io.grad_params[0]),
                              bias_ ? f(io.grad_params[1]) : nullptr, io.ws, io.dtype},
        s);
  }

 private:
  LinearGeom g_;
  bool bias_;
};

}  // namespace

std::unique_ptr<Op> make_conv2d(const ConvGeom& g, bool bias) {
  return std::make_unique<Conv2dOp>(g, bias);
}

std::unique_ptr<Op> make_linear(const LinearGeom& g, bool bias) {
  return std::make_unique<LinearOp>(g, bias);
}

}  // namespace ferry
