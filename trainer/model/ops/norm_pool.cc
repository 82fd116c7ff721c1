// batchnorm2d, max/avg pooling and adaptive average pooling.
#include <fmt/format.h>

#include "trainer/model/ops/ops.h"

namespace ferry {
namespace {

float* f(void* p) { return static_cast<float*>(p); }
const float* cf(void* p) { return static_cast<const float*>(p); }

class BatchNormOp : public Op {
 public:
  BatchNormOp(const BatchNormGeom& g, float momentum) : g_(g), momentum_(momentum) {}
  std::string_view kind() const override { return "batchnorm2d"; }
  std::string describe() const override { return fmt::format("{}", g_.c); }
  SavedSet saved() const override { return {.inputs = 1, .aux = true}; }
  OpCost cost() const override {
    const double n = static_cast<double>(g_.n) * g_.c * g_.hw;
    return {8 * n, 12 * n};
  }
  bool recomputable() const override { return true; }
  // A recompute must leave the running statistics and the saved batch statistics alone: it
  // writes scratch copies of both, (4, C) floats.
  uint64_t workspace_bytes(Kernels&, Pass pass, bool training, DType) const override {
    return pass == Pass::kForward && training ? 4 * g_.c * sizeof(float) : 0;
  }
  void forward(Kernels& k, Stream& s, const OpIo& io) const override {
    if (!io.training) {
      k.launch(BatchNormForwardInference{g_, cf(io.inputs[0]), cf(io.params[0]), cf(io.params[1]),
                                         cf(io.buffers[0]), cf(io.buffers[1]), f(io.outputs[0]),
                                         io.dtype},
               s);
      return;
    }
    float* running_mean = f(io.buffers[0]);
    float* running_var = f(io.buffers[1]);
    float* save_mean = io.aux.empty() ? nullptr : f(io.aux[0]);
    float* save_var = io.aux.empty() ? nullptr : f(io.aux[1]);
    if (!io.update_buffers) {
      float* scratch = f(io.ws.ptr);
      running_mean = scratch;
      running_var = scratch + g_.c;
      save_mean = scratch + 2 * g_.c;
      save_var = scratch + 3 * g_.c;
    }
    k.launch(BatchNormForwardTraining{g_, momentum_, cf(io.inputs[0]), cf(io.params[0]),
                                      cf(io.params[1]), f(io.outputs[0]), running_mean, running_var,
                                      save_mean, save_var, io.dtype},
             s);
  }
  void backward(Kernels& k, Stream& s, const OpIo& io) const override {
    k.launch(BatchNormBackward{g_, cf(io.inputs[0]), cf(io.grad_outputs[0]), cf(io.params[0]),
                               cf(io.aux[0]), cf(io.aux[1]), f(io.grad_inputs[0]),
                               f(io.grad_params[0]), f(io.grad_params[1]), io.dtype},
             s);
  }

 private:
  BatchNormGeom g_;
  float momentum_;
};

class PoolOp : public Op {
 public:
  explicit PoolOp(const PoolGeom& g) : g_(g) {}
  std::string_view kind() const override {
    return g_.kind == PoolKind::kMax ? "maxpool" : "avgpool";
  }
  std::string describe() const override {
    return fmt::format("{}x{} s{} p{}{}", g_.kh, g_.kw, g_.stride_h, g_.pad_h,
                       g_.ceil_mode ? " ceil" : "");
  }
  // Max needs x and y to find each window's first maximum; avg needs neither.
  SavedSet saved() const override {
    return g_.kind == PoolKind::kMax ? SavedSet{.inputs = 1, .outputs = 1} : SavedSet{};
  }
  OpCost cost() const override {
    const double out = static_cast<double>(g_.n) * g_.c * g_.out_h() * g_.out_w();
    return {out * g_.kh * g_.kw, 2 * out * g_.kh * g_.kw};
  }
  bool recomputable() const override { return true; }
  void forward(Kernels& k, Stream& s, const OpIo& io) const override {
    k.launch(PoolForward{g_, cf(io.inputs[0]), f(io.outputs[0]), io.dtype}, s);
  }
  void backward(Kernels& k, Stream& s, const OpIo& io) const override {
    const bool max = g_.kind == PoolKind::kMax;
    k.launch(PoolBackward{g_, max ? cf(io.inputs[0]) : nullptr, max ? cf(io.outputs[0]) : nullptr,
                          cf(io.grad_outputs[0]), f(io.grad_inputs[0]), io.dtype},
             s);
  }

 private:
  PoolGeom g_;
};

class AdaptiveAvgPoolOp : public Op {
 public:
  explicit AdaptiveAvgPoolOp(const AdaptiveAvgPoolForward& shape) : a_(shape) {}
  std::string_view kind() const override { return "adaptive_avgpool"; }
  std::string describe() const override { return fmt::format("-> {}x{}", a_.oh, a_.ow); }
  SavedSet saved() const override { return {}; }
  OpCost cost() const override {
    const double in = static_cast<double>(a_.n) * a_.c * a_.h * a_.w;
    return {in, in};
  }
  bool recomputable() const override { return true; }
  void forward(Kernels& k, Stream& s, const OpIo& io) const override {
    AdaptiveAvgPoolForward args = a_;
    args.x = cf(io.inputs[0]);
    args.y = f(io.outputs[0]);
    args.dtype = io.dtype;
    k.launch(args, s);
  }
  void backward(Kernels& k, Stream& s, const OpIo& io) const override {
    k.launch(AdaptiveAvgPoolBackward{a_.n, a_.c, a_.h, a_.w, a_.oh, a_.ow, cf(io.grad_outputs[0]),
                                     f(io.grad_inputs[0]), io.dtype},
             s);
  }

 private:
  AdaptiveAvgPoolForward a_;
};

}  // namespace

std::unique_ptr<Op> make_batch_norm(const BatchNormGeom& g, float momentum) {
  return std::make_unique<BatchNormOp>(g, momentum);
}
std::unique_ptr<Op> make_pool(const PoolGeom& g) { return std::make_unique<PoolOp>(g); }
std::unique_ptr<Op> make_adaptive_avg_pool(const AdaptiveAvgPoolForward& shape) {
  return std::make_unique<AdaptiveAvgPoolOp>(shape);
}

}  // namespace ferry
