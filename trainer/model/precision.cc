// apply_precision: Note [Which tensors are bf16], applied tensor by tensor.
// Invariant: only TensorDesc::dtype changes; shapes, roles and producers stay.
#include "trainer/model/precision.h"

#include <string_view>

namespace ferry {

namespace {

// Ops whose aux tensors are statistics, kept fp32.
bool saves_statistics(std::string_view op) {
  return op == "batchnorm2d" || op == "layernorm" || op == "rmsnorm";
}

// Whether activation `id` is an output its producer marks as a statistic (Op::statistic_outputs).
bool statistic_output(const Graph& graph, TensorId id, const TensorInfo& t) {
  if (t.producer < 0) return false;
  const Node& node = graph.nodes()[static_cast<size_t>(t.producer)];
  const uint32_t bits = node.op->statistic_outputs();
  for (size_t i = 0; i < node.outputs.size() && i < 32; ++i)
    if (node.outputs[i] == id && (bits & (1u << i))) return true;
  return false;
}

}  // namespace

void apply_precision(Graph& graph, Precision precision) {
  if (precision == Precision::kFp32) return;
  const DType narrow = narrow_dtype(precision);
  for (size_t id = 0; id < graph.tensors_.size(); ++id) {
    TensorInfo& t = graph.tensors_[id];
    if (t.desc.dtype != DType::kF32 || is_persistent(t.role)) continue;
    switch (t.role) {
      case TensorRole::kActivation:
        if (!statistic_output(graph, static_cast<TensorId>(id), t)) t.desc.dtype = narrow;
        break;
      case TensorRole::kInput:
      case TensorRole::kGradient:
        t.desc.dtype = narrow;
        break;
      case TensorRole::kAux:
        if (t.producer < 0 ||
            !saves_statistics(graph.nodes_[static_cast<size_t>(t.producer)].op->kind()))
          t.desc.dtype = narrow;
        break;
      default:
        break;
    }
  }
}

uint64_t activation_bytes(const Graph& graph, DType dtype) {
  uint64_t bytes = 0;
  for (const TensorInfo& t : graph.tensors())
    if (!is_persistent(t.role) && t.desc.dtype == dtype) bytes += t.desc.bytes();
  return bytes;
}

}  // namespace ferry
