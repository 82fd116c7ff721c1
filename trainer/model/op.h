// The Op interface: an op knows its shapes (fixed when the graph is built for an input shape),
// which tensors its backward reads, its cost, and how to launch its kernels. Ops never touch
// residency or allocation: the executor hands them device pointers in node order.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "device/kernels.h"

namespace ferry {

// Device pointers for one forward or backward call, in the order of the node's lists.
struct OpIo {
  std::vector<void*> inputs;
  std::vector<void*> outputs;
  std::vector<void*> params;
  // device.precision bf16: the bf16 working copy of each parameter, as params (Note [The bf16
  // working copy] in trainer/exec/parameter_store.h); empty in fp32. Convolutions and linear
  // layers read their weights from it; every other op reads the fp32 params.
  std::vector<void*> working;
  std::vector<void*> buffers;
  std::vector<void*> aux;
  // Backward only. A null grad_inputs[i] means that gradient is not needed.
  std::vector<void*> grad_outputs;
  std::vector<void*> grad_inputs;
  std::vector<void*> grad_params;
  Workspace ws;
  bool training = true;
  // False when the forward runs again to recompute a dropped activation: it must produce the
  // same bits and leave persistent state (BN running statistics) untouched.
  bool update_buffers = true;
  uint64_t seed = 0;  // per-node, per-step randomness (dropout)
  // The node's storage dtype (its kernels' `dtype`: Note [Storage dtype of a kernel] in
  // device/kernels.h), StepBinding::dtype.
  DType dtype = DType::kF32;
  // The batch's loss divisor (SoftmaxCrossEntropyForward::divisor; 0: the loss's rows), for the
  // loss op: Note [The mean over real tokens] in trainer/data/documents.h.
  float loss_divisor = 0.0f;
};

// Which of a node's tensors its backward reads, besides the output gradients.
struct SavedSet {
  uint32_t inputs = 0;   // bit i: inputs[i]
  uint32_t outputs = 0;  // bit i: outputs[i]
  bool aux = false;      // every aux tensor
};

struct OpCost {
  double forward_flops = 0;
  double backward_flops = 0;
};

enum class Pass { kForward, kBackward };

class Op {
 public:
  virtual ~Op() = default;
  // "conv2d", "batchnorm2d", ...
  virtual std::string_view kind() const = 0;
  // Hyper-parameters for the layer table: "3x3 s2 p1, 64->128".
  virtual std::string describe() const { return {}; }
  virtual SavedSet saved() const = 0;
  virtual OpCost cost() const = 0;
  // Scratch bytes a pass needs (io.ws) in storage dtype `dtype` (OpIo::dtype). Asked once per
  // graph, at planning time.
  virtual uint64_t workspace_bytes(Kernels& kernels, Pass pass, bool training, DType dtype) const {
    return 0;
  }
  uint64_t workspace_bytes(Kernels& kernels, Pass pass, bool training) const {
    return workspace_bytes(kernels, pass, training, DType::kF32);
  }
  // May run again in backward to rebuild its outputs (ReLU, BN, pooling, add, flatten,
  // convolutions, linear):
  // deterministic, and with update_buffers off it leaves persistent state alone. Whether it is
  // worth it is the planner's cost decision.
  virtual bool recomputable() const { return false; }
  // Of a recomputable op, the outputs a recompute may rebuild (bit i: outputs[i]); a recompute
  // passes null for each output it does not rebuild (attention rebuilds its probabilities,
  // never its result alone, which needs them).
  virtual uint32_t rebuilt_outputs() const { return ~0u; }
  // Outputs that are statistics (bit i: outputs[i]), kept fp32 under device.precision bf16
  // (Note [Which tensors are bf16] in trainer/model/precision.h): fused attention's log-sum-exp.
  virtual uint32_t statistic_outputs() const { return 0; }
  // Parameters (bit i: params[i]) a bf16 step reads only through the bf16 working copy
  // (OpIo::working), never as fp32: the weights of convolutions and linear layers. Every other
  // parameter stays whole in fp32 on every rank when the master weights are sharded (Note
  // [Sharded master weights] in trainer/exec/parameter_store.h).
  virtual uint32_t working_params() const { return 0; }
  // Pairs whose memory the pass may share when the first dies at this step (in place):
  // forward (input i, output j); backward (grad_output i, grad_input j). The kernels must be
  // correct with the two pointers equal.
  virtual std::vector<std::pair<int, int>> inplace(Pass pass) const { return {}; }
  virtual void forward(Kernels& k, Stream& s, const OpIo& io) const = 0;
  virtual void backward(Kernels& k, Stream& s, const OpIo& io) const = 0;
};

}  // namespace ferry
