// Private to the pooling kernels: PyTorch's window bounds, shared by the max pooling
// (kernels_maxpool.cc) and average pooling (kernels_pool.cc) loops. Geometries reaching them
// passed check_pool_geom (device/kernel_checks.h).
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "device/kernels.h"

namespace ferry::cpu {

// A window along one axis, PyTorch's way: [start, end) clipped to the input, and `padded`, its
// extent within the padded input (the count_include_pad divisor).
struct Window {
  int64_t start, end, padded;
};

inline Window window(int64_t o, int64_t in, int64_t k, int64_t s, int64_t p) {
  const int64_t start = o * s - p;
  const int64_t padded_end = std::min(start + k, in + p);
  return {std::max<int64_t>(start, 0), std::min(padded_end, in), padded_end - start};
}

// The windows of every output row and column, computed once per launch.
struct Windows {
  std::vector<Window> rows, cols;
  explicit Windows(const PoolGeom& g) {
    for (int64_t i = 0; i < g.out_h(); ++i) {
      rows.push_back(window(i, g.h, g.kh, g.stride_h, g.pad_h));
    }
    for (int64_t j = 0; j < g.out_w(); ++j) {
      cols.push_back(window(j, g.w, g.kw, g.stride_w, g.pad_w));
    }
  }
};

// Max pooling with PyTorch's rule (kernels_maxpool.cc): each window's value and gradient target
// is its first maximum in row-major order, NaN winning (a NaN replaces the maximum, a later NaN
// replaces it again). Geometry already checked.
void max_pool_forward(const PoolForward& a);
void max_pool_backward(const PoolBackward& a);

}  // namespace ferry::cpu
