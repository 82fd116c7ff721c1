// Tensor shapes and descriptions (shape + dtype). Dimensions are row-major, NCHW for images.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "device/dtype.h"

namespace ferry {

class Shape {
 public:
  Shape() = default;
  Shape(std::initializer_list<int64_t> dims) : dims_(dims) {}
  explicit Shape(std::vector<int64_t> dims) : dims_(std::move(dims)) {}

  size_t rank() const { return dims_.size(); }
  int64_t operator[](size_t i) const { return dims_[i]; }
  int64_t& operator[](size_t i) { return dims_[i]; }
  const std::vector<int64_t>& dims() const { return dims_; }
  // Product of the dimensions; 1 for a scalar (rank 0).
  int64_t numel() const;
  // "(64, 3, 32, 32)".
  std::string str() const;
  bool operator==(const Shape& other) const = default;

 private:
  std::vector<int64_t> dims_;
};

struct TensorDesc {
  Shape shape;
  DType dtype = DType::kF32;

  size_t bytes() const { return static_cast<size_t>(shape.numel()) * dtype_size(dtype); }
  bool operator==(const TensorDesc& other) const = default;
};

}  // namespace ferry
