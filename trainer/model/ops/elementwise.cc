// relu, add, flatten, dropout and the softmax cross-entropy loss.
#include <fmt/format.h>

#include "trainer/model/ops/ops.h"

namespace ferry {
namespace {

float* f(void* p) { return static_cast<float*>(p); }
const float* cf(void* p) { return static_cast<const float*>(p); }
// Bytes of n elements in the node's storage dtype.
uint64_t bytes(int64_t n, const OpIo& io) {
  return static_cast<uint64_t>(n) * dtype_size(io.dtype);
}

class ReluOp : public Op {
 public:
  explicit ReluOp(int64_t n) : n_(n) {}
  std::string_view kind() const override { return "relu"; }
  SavedSet saved() const override { return {.outputs = 1}; }
  // y over x (torchvision's ReLU(inplace=True)); dx over dy.
  std::vector<std::pair<int, int>> inplace(Pass) const override { return {{0, 0}}; }
  OpCost cost() const override { return {static_cast<double>(n_), static_cast<double>(n_)}; }
  bool recomputable() const override { return true; }
  void forward(Kernels& k, Stream& s, const OpIo& io) const override {
    k.launch(ReluForward{n_, cf(io.inputs[0]), f(io.outputs[0]), io.dtype}, s);
  }
  void backward(Kernels& k, Stream& s, const OpIo& io) const override {
    k.launch(
        ReluBackward{n_, cf(io.outputs[0]), cf(io.grad_outputs[0]), f(io.grad_inputs[0]), io.dtype},
        s);
  }

 private:
  int64_t n_;
};

class AddOp : public Op {
 public:
  explicit AddOp(int64_t n) : n_(n) {}
  std::string_view kind() const override { return "add"; }
  SavedSet saved() const override { return {}; }
  // Forward: y over a (or b). Backward: da over dy (db is a copy).
  std::vector<std::pair<int, int>> inplace(Pass pass) const override {
    if (pass == Pass::kForward) return {{0, 0}, {1, 0}};
    return {{0, 0}};
  }
  OpCost cost() const override { return {static_cast<double>(n_), 0}; }
  bool recomputable() const override { return true; }
  void forward(Kernels& k, Stream& s, const OpIo& io) const override {
    k.launch(AddForward{n_, cf(io.inputs[0]), cf(io.inputs[1]), f(io.outputs[0]), io.dtype}, s);
  }
  void backward(Kernels& k, Stream& s, const OpIo& io) const override {
    for (void* dx : io.grad_inputs) {
      // A gradient planned in place over dy already holds it.
      if (dx && dx != io.grad_outputs[0]) {
        k.launch(CopyDevice{bytes(n_, io), io.grad_outputs[0], dx}, s);
      }
    }
  }

 private:
  int64_t n_;
};

// (N, C, H, W) -> (N, C*H*W): the same bytes, copied so every tensor owns its memory.
class FlattenOp : public Op {
 public:
  explicit FlattenOp(int64_t n) : n_(n) {}
  std::string_view kind() const override { return "flatten"; }
  SavedSet saved() const override { return {}; }
  OpCost cost() const override { return {0, 0}; }
  bool recomputable() const override { return true; }
  void forward(Kernels& k, Stream& s, const OpIo& io) const override {
    k.launch(CopyDevice{bytes(n_, io), io.inputs[0], io.outputs[0]}, s);
  }
  void backward(Kernels& k, Stream& s, const OpIo& io) const override {
    k.launch(CopyDevice{bytes(n_, io), io.grad_outputs[0], io.grad_inputs[0]}, s);
  }

 private:
  int64_t n_;
};

class DropoutOp : public Op {
 public:
  DropoutOp(int64_t n, float p) : n_(n), p_(p) {}
  std::string_view kind() const override { return "dropout"; }
  std::string describe() const override { return fmt::format("p={}", p_); }
  SavedSet saved() const override { return {.aux = true}; }
  OpCost cost() const override { return {2.0 * n_, static_cast<double>(n_)}; }
  // Not recomputable: a second run would rewrite its saved mask.
  void forward(Kernels& k, Stream& s, const OpIo& io) const override {
    if (!io.training) {
      k.launch(CopyDevice{bytes(n_, io), io.inputs[0], io.outputs[0]}, s);
      return;
    }
    k.launch(DropoutForward{n_, p_, io.seed, 0, cf(io.inputs[0]), f(io.outputs[0]),
                            static_cast<uint8_t*>(io.aux[0]), io.dtype},
             s);
  }
  void backward(Kernels& k, Stream& s, const OpIo& io) const override {
    k.launch(DropoutBackward{n_, p_, cf(io.grad_outputs[0]), static_cast<const uint8_t*>(io.aux[0]),
                             f(io.grad_inputs[0]), io.dtype},
             s);
  }

 private:
  int64_t n_;
  float p_;
};

class SoftmaxCrossEntropyOp : public Op {
 public:
  SoftmaxCrossEntropyOp(int64_t n, int64_t k) : n_(n), k_(k) {}
  std::string_view kind() const override { return "softmax_cross_entropy"; }
  SavedSet saved() const override { return {.inputs = 2, .aux = true}; }
  OpCost cost() const override { return {5.0 * n_ * k_, 2.0 * n_ * k_}; }
  void forward(Kernels& k, Stream& s, const OpIo& io) const override {
    k.launch(SoftmaxCrossEntropyForward{n_, k_, cf(io.inputs[0]),
                                        static_cast<const int32_t*>(io.inputs[1]), f(io.outputs[0]),
                                        f(io.aux[0]), static_cast<int32_t*>(io.outputs[1]),
                                        io.loss_divisor, io.dtype},
             s);
  }
  void backward(Kernels& k, Stream& s, const OpIo& io) const override {
    k.launch(SoftmaxCrossEntropyBackward{n_, k_, 1.0f, cf(io.aux[0]),
                                         static_cast<const int32_t*>(io.inputs[1]),
                                         f(io.grad_inputs[0]), io.loss_divisor, io.dtype},
             s);
  }

 private:
  int64_t n_, k_;
};

}  // namespace

std::unique_ptr<Op> make_relu(int64_t n) { return std::make_unique<ReluOp>(n); }
std::unique_ptr<Op> make_add(int64_t n) { return std::make_unique<AddOp>(n); }
std::unique_ptr<Op> make_flatten(int64_t n) { return std::make_unique<FlattenOp>(n); }
std::unique_ptr<Op> make_dropout(int64_t n, float p) { return std::make_unique<DropoutOp>(n, p); }
std::unique_ptr<Op> make_softmax_cross_entropy(int64_t n, int64_t k) {
  return std::make_unique<SoftmaxCrossEntropyOp>(n, k);
}

}  // namespace ferry
