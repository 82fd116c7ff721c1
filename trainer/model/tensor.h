// The tensors of one model graph: what each one is for and who produces it. Parameters and
// buffers carry torchvision's state_dict names ("layer1.0.conv1.weight"), so checkpoints load
// in PyTorch; activations are named after the node that produces them.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "device/shape.h"

namespace ferry {

// A tensor's index in its Graph; the tape and the executor number tensors differently (Note
// [Three ids of a tensor] in trainer/exec/lower.h).
using TensorId = int32_t;
constexpr TensorId kNoTensor = -1;

enum class TensorRole : uint8_t {
  kInput,       // the image batch (N, C, H, W)
  kLabel,       // the int32 labels (N)
  kParam,       // a trained parameter; has a gradient
  kBuffer,      // persistent non-trained state (BN running statistics)
  kActivation,  // a forward output
  kAux,         // extra state a forward saves for its backward (BN batch stats, masks, probs)
  kMetric,      // a small persistent result read by the host (loss, correct count)
  kGradient,    // the gradient of an activation
  kWorkspace,   // a kernel's scratch, alive during one step
};

constexpr std::string_view role_name(TensorRole r) {
  switch (r) {
    case TensorRole::kInput:
      return "input";
    case TensorRole::kLabel:
      return "label";
    case TensorRole::kParam:
      return "param";
    case TensorRole::kBuffer:
      return "buffer";
    case TensorRole::kActivation:
      return "activation";
    case TensorRole::kAux:
      return "aux";
    case TensorRole::kMetric:
      return "metric";
    case TensorRole::kGradient:
      return "gradient";
    case TensorRole::kWorkspace:
      return "workspace";
  }
  return "?";
}

// Persistent tensors live for the whole run in blocks cut by a size table; the others live in
// the activation arena laid out by the memory plan.
constexpr bool is_persistent(TensorRole r) {
  return r == TensorRole::kParam || r == TensorRole::kBuffer || r == TensorRole::kMetric;
}

struct TensorInfo {
  std::string name;
  TensorDesc desc;
  TensorRole role = TensorRole::kActivation;
  int producer = -1;  // node index whose forward writes it (activations, aux, metrics)
};

}  // namespace ferry
