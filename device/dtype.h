// Element types a tensor can hold. Training is fp32 today; the dtype stays in every tensor
// description so that mixed precision can be added without changing interfaces.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace ferry {

enum class DType : uint8_t { kF32, kF64, kI32, kI64, kU8 };

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
  }
  return 0;
}

// The safetensors spelling: "F32", "F64", "I32", "I64", "U8".
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
  }
  return "?";
}

}  // namespace ferry
