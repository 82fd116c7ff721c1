// Element types a tensor can hold. fp32 is the default; kBF16 is the 16-bit storage type of mixed
// precision (device.precision bf16: Note [Which tensors are bf16] in trainer/model/precision.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace ferry {

// New values go at the end: the numbers are stable.
enum class DType : uint8_t { kF32, kF64, kI32, kI64, kU8, kBF16 };

constexpr size_t dtype_size(DType t) {
  switch (t) {
    case DType::kF32:
      return 4;
    case DType::kF64:
      return 8;
    case DType::kI32:
      return 4;
    case DType::kI64:
      return 8;
    case DType::kU8:
      return 1;
    case DType::kBF16:
      return 2;
  }
  return 0;
}

// The safetensors spelling: "F32", "F64", "I32", "I64", "U8", "BF16".
constexpr std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::kF32:
      return "F32";
    case DType::kF64:
      return "F64";
    case DType::kI32:
      return "I32";
    case DType::kI64:
      return "I64";
    case DType::kU8:
      return "U8";
    case DType::kBF16:
      return "BF16";
  }
  return "?";
}

}  // namespace ferry
