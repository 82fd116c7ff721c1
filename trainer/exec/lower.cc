// Graph -> tape lowering with autograd's requires-grad rule.
#include "trainer/exec/lower.h"

#include <fmt/format.h>

#include "common/error.h"

namespace ferry {

namespace {

class Lowering {
 public:
  Lowering(const Graph& graph, Kernels& kernels, bool training) : g_(graph), k_(kernels), out_{} {
    out_.training = training;
    out_.tape_of.assign(graph.tensors().size(), -1);
    grad_of_.assign(graph.tensors().size(), -1);
    requires_grad_.assign(graph.tensors().size(), false);
  }

  Lowered run() {
    for (size_t id = 0; id < g_.tensors().size(); ++id) {
      const TensorInfo& info = g_.tensors()[id];
      if (is_persistent(info.role)) continue;
      out_.tape_of[id] =
          add_tensor(info.name, info.desc.bytes(), kind_of(info.role), info.desc.dtype);
    }
    load_step();
    for (size_t n = 0; n < g_.nodes().size(); ++n) forward_step(static_cast<int>(n));
    if (out_.training) {
      for (int n = static_cast<int>(g_.nodes().size()) - 1; n >= 0; --n) backward_step(n);
      TapeStep update;
      update.phase = StepPhase::kUpdate;
      update.name = "optimizer";
      update.op = "update";
      push(std::move(update), {});
    }
    return std::move(out_);
  }

 private:
  static TapeTensorKind kind_of(TensorRole role) {
    switch (role) {
      case TensorRole::kInput:
      case TensorRole::kLabel:
        return TapeTensorKind::kInput;
      case TensorRole::kAux:
        return TapeTensorKind::kAux;
      case TensorRole::kGradient:
        return TapeTensorKind::kGradient;
      case TensorRole::kWorkspace:
        return TapeTensorKind::kWorkspace;
      default:
        return TapeTensorKind::kActivation;
    }
  }

  int add_tensor(std::string name, uint64_t bytes, TapeTensorKind kind, DType dtype) {
    out_.tape.tensors.push_back({std::move(name), bytes, kind, dtype});
    return static_cast<int>(out_.tape.tensors.size() - 1);
  }

  // A step of graph node `n` in `phase`, named after the node, with no tensors yet.
  TapeStep node_step(int n, StepPhase phase, double flops) const {
    const Node& node = g_.nodes()[n];
    TapeStep step;
    step.phase = phase;
    step.node = n;
    step.name = node.name;
    step.op = std::string(node.op->kind());
    step.flops = flops;
    return step;
  }

  // The OpIo slot for a graph tensor: its tape tensor, or its persistent encoding.
  int slot(TensorId id) const {
    const int t = out_.tape_of[id];
    return t >= 0 ? t : persistent_slot(id);
  }

  std::vector<int> slots(const std::vector<TensorId>& ids) const {
    std::vector<int> s;
    for (TensorId id : ids) s.push_back(slot(id));
    return s;
  }

  void push(TapeStep step, StepBinding binding) {
    out_.tape.steps.push_back(std::move(step));
    out_.bindings.push_back(std::move(binding));
  }

  int workspace(const Node& node, Pass pass, DType dtype) {
    const uint64_t bytes = node.op->workspace_bytes(k_, pass, out_.training, dtype);
    if (bytes == 0) return -1;
    return add_tensor(fmt::format("{}.{}_ws", node.name, pass == Pass::kForward ? "fwd" : "bwd"),
                      bytes, TapeTensorKind::kWorkspace, DType::kU8);
  }

  void load_step() {
    TapeStep step;
    step.phase = StepPhase::kLoad;
    step.name = "load";
    step.op = "load";
    step.writes = {out_.tape_of[g_.input()], out_.tape_of[g_.labels()]};
    if (g_.segments() != kNoTensor) {
      step.writes.push_back(out_.tape_of[g_.segments()]);
    }
    push(std::move(step), {});
  }

  void forward_step(int n) {
    const Node& node = g_.nodes()[n];
    bool grad = !node.params.empty();
    for (TensorId in : node.inputs) grad = grad || requires_grad_[in];
    for (TensorId o : node.outputs) {
      requires_grad_[o] = grad && g_.tensor(o).role == TensorRole::kActivation;
    }
    TapeStep step = node_step(n, StepPhase::kForward, node.op->cost().forward_flops);
    step.recomputable = node.op->recomputable();
    for (size_t i = 0; i < node.outputs.size(); ++i) {
      const int out = slot(node.outputs[i]);
      if (out >= 0 && !(node.op->rebuilt_outputs() & (1u << i))) step.not_rebuilt.push_back(out);
    }
    StepBinding b;
    b.inputs = slots(node.inputs);
    b.outputs = slots(node.outputs);
    b.params = slots(node.params);
    b.buffers = slots(node.buffers);
    b.aux = slots(node.aux);
    b.dtype = node_dtype(g_, n);
    b.workspace = workspace(node, Pass::kForward, b.dtype);
    for (int s : b.inputs)
      if (s >= 0) step.reads.push_back(s);
    for (int s : b.outputs)
      if (s >= 0) step.writes.push_back(s);
    for (int s : b.aux)
      if (s >= 0) step.writes.push_back(s);
    for (const auto& [i, o] : node.op->inplace(Pass::kForward)) {
      const int in = b.inputs[i], out = b.outputs[o];
      if (in >= 0 && out >= 0) step.alias.emplace_back(in, out);
    }
    if (b.workspace >= 0) step.writes.push_back(b.workspace);
    push(std::move(step), std::move(b));
  }

  void backward_step(int n) {
    const Node& node = g_.nodes()[n];
    const bool is_loss = node.outputs.size() == 2 && node.outputs[0] == g_.loss();
    StepBinding b;
    bool any_grad = is_loss;
    for (TensorId o : node.outputs) {
      const int gt = grad_of_[o];
      b.grad_outputs.push_back(gt);
      any_grad = any_grad || gt >= 0;
    }
    if (!any_grad) return;  // nothing downstream needs this node's gradients
    TapeStep step = node_step(n, StepPhase::kBackward, node.op->cost().backward_flops);
    // A backward sees only what its op saved: the other inputs and outputs may be gone.
    const SavedSet saved = node.op->saved();
    b.inputs = slots(node.inputs);
    for (size_t i = 0; i < b.inputs.size(); ++i) {
      if (!(saved.inputs & (1u << i))) b.inputs[i] = -1;
    }
    b.outputs = slots(node.outputs);
    for (size_t i = 0; i < b.outputs.size(); ++i) {
      if (!(saved.outputs & (1u << i))) b.outputs[i] = -1;
    }
    b.params = slots(node.params);
    b.buffers = slots(node.buffers);
    if (saved.aux) b.aux = slots(node.aux);
    for (TensorId p : node.params) b.grad_params.push_back(persistent_slot(p));
    for (TensorId saved : g_.saved_by(node)) {
      const int s = slot(saved);
      if (s >= 0) step.reads.push_back(s);
    }
    for (int gt : b.grad_outputs)
      if (gt >= 0) step.reads.push_back(gt);

    std::vector<std::pair<int, int>> accumulate;  // (partial, into)
    for (TensorId in : node.inputs) {
      if (!requires_grad_[in]) {
        b.grad_inputs.push_back(-1);
        continue;
      }
      int& g = grad_of_[in];
      // An activation's gradient has its dtype (Note [Which tensors are bf16]).
      const uint64_t bytes = g_.tensor(in).desc.bytes();
      const DType dtype = g_.tensor(in).desc.dtype;
      if (g < 0) {
        g = add_tensor("grad:" + g_.tensor(in).name, bytes, TapeTensorKind::kGradient, dtype);
        b.grad_inputs.push_back(g);
        step.writes.push_back(g);
      } else {
        const int partial = add_tensor(fmt::format("grad:{}#{}", g_.tensor(in).name, node.name),
                                       bytes, TapeTensorKind::kGradient, dtype);
        b.grad_inputs.push_back(partial);
        step.writes.push_back(partial);
        accumulate.emplace_back(partial, g);
      }
    }
    b.dtype = node_dtype(g_, n);
    b.workspace = workspace(node, Pass::kBackward, b.dtype);
    if (b.workspace >= 0) step.writes.push_back(b.workspace);
    for (const auto& [i, o] : node.op->inplace(Pass::kBackward)) {
      const int dy = b.grad_outputs[i], dx = b.grad_inputs[o];
      if (dy >= 0 && dx >= 0) step.alias.emplace_back(dy, dx);
    }
    push(std::move(step), std::move(b));
    for (const auto& [partial, into] : accumulate) {
      TapeStep acc;
      acc.phase = StepPhase::kAccumulate;
      acc.node = n;
      acc.name = out_.tape.tensors[into].name;
      acc.op = "accumulate";
      acc.flops = static_cast<double>(out_.tape.tensors[into].bytes /
                                      dtype_size(out_.tape.tensors[into].dtype));
      acc.reads = {partial, into};
      acc.writes = {into};
      StepBinding ab;
      ab.accumulate_from = partial;
      ab.accumulate_into = into;
      push(std::move(acc), std::move(ab));
    }
  }

  const Graph& g_;
  Kernels& k_;
  Lowered out_;
  std::vector<int> grad_of_;
  std::vector<bool> requires_grad_;
};

bool floating(DType t) { return t == DType::kF32 || t == DType::kBF16; }

}  // namespace

DType node_dtype(const Graph& graph, int n) {
  const Node& node = graph.nodes()[static_cast<size_t>(n)];
  for (TensorId o : node.outputs) {
    const TensorInfo& t = graph.tensor(o);
    if (t.role == TensorRole::kActivation && floating(t.desc.dtype)) return t.desc.dtype;
  }
  for (TensorId i : node.inputs) {
    const TensorInfo& t = graph.tensor(i);
    if ((t.role == TensorRole::kActivation || t.role == TensorRole::kInput) &&
        floating(t.desc.dtype))
      return t.desc.dtype;
  }
  return DType::kF32;
}

Lowered lower_graph(const Graph& graph, Kernels& kernels, bool training) {
  return Lowering(graph, kernels, training).run();
}

}  // namespace ferry
