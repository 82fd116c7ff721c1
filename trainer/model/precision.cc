// apply_precision: Note [Which tensors are bf16], applied tensor by tensor.
// Invariant: only TensorDesc::dtype changes; shapes, roles and producers stay.
#include "trainer/model/precision.h"

#include <string_view>

namespace ferry {

namespace {

// Ops whose aux tensors are statistics, kept fp32.
bool saves_statistics(std::string_view op) { return op == "batchnorm2d" || op == "layernorm"; }

}  // namespace

void apply_precision(Graph& graph, Precision precision) {
  if (precision == Precision::kFp32) return;
  const DType narrow = narrow_dtype(precision);
  for (TensorInfo& t : graph.tensors_) {
    if (t.desc.dtype != DType::kF32 || is_persistent(t.role)) continue;
    switch (t.role) {
      case TensorRole::kInput:
      case TensorRole::kActivation:
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
