// device.precision and comm.dtype: which float format a run stores its bf16-eligible tensors in.
// Invariant: kFp32 changes nothing (every tensor fp32, as before mixed precision existed).
#pragma once

#include "device/dtype.h"

namespace ferry {

// fp32: every float tensor fp32. bf16: mixed precision, never pure bf16 (fp32 master weights and
// optimizer state, bf16 activations and products: Note [Which tensors are bf16] in
// trainer/model/precision.h).
enum class Precision : uint8_t { kFp32, kBf16 };

// The storage dtype of a tensor that precision `p` narrows (activations, their gradients, the
// products of convolutions, linear layers and attention; an all-reduce under comm.dtype).
constexpr DType narrow_dtype(Precision p) {
  return p == Precision::kBf16 ? DType::kBF16 : DType::kF32;
}

}  // namespace ferry
