// Max, average and adaptive average pooling. Forward: one thread per output. Backward: one
// thread per input element gathering from the windows that contain it, in output row-major
// order, so overlapping windows never race and the sum order equals the CPU backend's. fp32 or
// bf16 storage (Note [bf16 storage in the CUDA kernels]).
#include "device/cuda/kernel_ops.h"
#include "device/cuda/launch.cuh"
#include "device/cuda/storage.cuh"

namespace ferry::cuda {
namespace {

// A window along one axis, PyTorch's way (as device/cpu/pool_windows.h): [start, end) clipped
// to the input and `padded`, its extent within the padded input (count_include_pad's divisor).
struct Span {
  int64_t start, end, padded;
};

__device__ Span span(int64_t o, int64_t in, int64_t k, int64_t s, int64_t p) {
  const int64_t start = o * s - p;
  const int64_t padded_end = min(start + k, in + p);
  return {max(start, int64_t{0}), min(padded_end, in), padded_end - start};
}

// Whether `v` replaces the running maximum `best` (PyTorch: strictly greater, or NaN).
__device__ bool replaces(float v, float best) { return v > best || v != v; }

// The first maximum of window (rows, cols) of plane x in row-major order, NaN winning; returns
// its flat index in the plane (the window's first element when every value is -inf).
template <typename S>
__device__ int64_t first_max(const S* x, int64_t w, Span rows, Span cols, float* value) {
  float best = -__int_as_float(0x7f800000);  // -inf
  int64_t at = rows.start * w + cols.start;
  for (int64_t ih = rows.start; ih < rows.end; ++ih) {
    for (int64_t iw = cols.start; iw < cols.end; ++iw) {
      const float v = as_f32(x[ih * w + iw]);
      if (replaces(v, best)) {
        best = v;
        at = ih * w + iw;
      }
    }
  }
  *value = best;
  return at;
}

__device__ float avg_divisor(bool include_pad, Span rows, Span cols) {
  const int64_t count =
      include_pad ? rows.padded * cols.padded : (rows.end - rows.start) * (cols.end - cols.start);
  return static_cast<float>(count);
}

template <typename S>
__global__ void pool_forward_kernel(PoolShape s, const S* x, S* y) {
  const int64_t total = s.planes * s.oh * s.ow;
  FERRY_GRID_STRIDE(q, total) {
    const int64_t plane = q / (s.oh * s.ow);
    const int64_t i = (q / s.ow) % s.oh, j = q % s.ow;
    const Span rows = span(i, s.h, s.kh, s.stride_h, s.pad_h);
    const Span cols = span(j, s.w, s.kw, s.stride_w, s.pad_w);
    const S* xp = x + plane * s.h * s.w;
    if (s.max) {
      float best;
      first_max(xp, s.w, rows, cols, &best);
      y[q] = as_storage<S>(best);
    } else {
      float sum = 0.0f;
      for (int64_t ih = rows.start; ih < rows.end; ++ih) {
        for (int64_t iw = cols.start; iw < cols.end; ++iw) sum += as_f32(xp[ih * s.w + iw]);
      }
      y[q] = as_storage<S>(sum / avg_divisor(s.count_include_pad, rows, cols));
    }
  }
}

// The outputs o in [lo, hi] along one axis whose window [o*s - p, o*s - p + k) holds `at`.
__device__ void covering(int64_t at, int64_t k, int64_t s, int64_t p, int64_t out, int64_t* lo,
                         int64_t* hi) {
  const int64_t first = at + p - k + 1;  // o*s >= first
  *lo = first <= 0 ? 0 : (first + s - 1) / s;
  *hi = min((at + p) / s, out - 1);
}

template <typename S>
__global__ void pool_backward_kernel(PoolShape s, const S* x, const S* dy, S* dx) {
  const int64_t total = s.planes * s.h * s.w;
  FERRY_GRID_STRIDE(e, total) {
    const int64_t plane = e / (s.h * s.w);
    const int64_t ih = (e / s.w) % s.h, iw = e % s.w;
    const int64_t self = ih * s.w + iw;
    const S* xp = x == nullptr ? nullptr : x + plane * s.h * s.w;
    const S* dyp = dy + plane * s.oh * s.ow;
    int64_t i0, i1, j0, j1;
    covering(ih, s.kh, s.stride_h, s.pad_h, s.oh, &i0, &i1);
    covering(iw, s.kw, s.stride_w, s.pad_w, s.ow, &j0, &j1);
    float acc = 0.0f;
    for (int64_t i = i0; i <= i1; ++i) {
      const Span rows = span(i, s.h, s.kh, s.stride_h, s.pad_h);
      for (int64_t j = j0; j <= j1; ++j) {
        const Span cols = span(j, s.w, s.kw, s.stride_w, s.pad_w);
        if (s.max) {
          float best;
          if (first_max(xp, s.w, rows, cols, &best) == self) acc += as_f32(dyp[i * s.ow + j]);
        } else {
          acc += as_f32(dyp[i * s.ow + j]) / avg_divisor(s.count_include_pad, rows, cols);
        }
      }
    }
    dx[e] = as_storage<S>(acc);
  }
}

// Adaptive pooling's cell [start, end) along one axis.
__device__ int64_t cell_start(int64_t o, int64_t in, int64_t out) { return (o * in) / out; }
__device__ int64_t cell_end(int64_t o, int64_t in, int64_t out) {
  return ((o + 1) * in + out - 1) / out;
}

template <typename S>
__global__ void adaptive_forward_kernel(int64_t planes, int64_t h, int64_t w, int64_t oh,
                                        int64_t ow, const S* x, S* y) {
  FERRY_GRID_STRIDE(q, planes * oh * ow) {
    const int64_t plane = q / (oh * ow);
    const int64_t i = (q / ow) % oh, j = q % ow;
    const int64_t h0 = cell_start(i, h, oh), h1 = cell_end(i, h, oh);
    const int64_t w0 = cell_start(j, w, ow), w1 = cell_end(j, w, ow);
    const S* xp = x + plane * h * w;
    float sum = 0.0f;
    for (int64_t ih = h0; ih < h1; ++ih) {
      for (int64_t iw = w0; iw < w1; ++iw) sum += as_f32(xp[ih * w + iw]);
    }
    y[q] = as_storage<S>(sum / static_cast<float>((h1 - h0) * (w1 - w0)));
  }
}

// Bounds [lo, hi] on the cells o along one axis that hold `at` (start(o) <= at < end(o)).
__device__ void cells_holding(int64_t at, int64_t in, int64_t out, int64_t* lo, int64_t* hi) {
  // One cell of slack each side; the caller tests membership exactly.
  *lo = max((at * out) / in - 1, int64_t{0});
  *hi = min(((at + 1) * out - 1) / in + 1, out - 1);
}

template <typename S>
__global__ void adaptive_backward_kernel(int64_t planes, int64_t h, int64_t w, int64_t oh,
                                         int64_t ow, const S* dy, S* dx) {
  FERRY_GRID_STRIDE(e, planes * h * w) {
    const int64_t plane = e / (h * w);
    const int64_t ih = (e / w) % h, iw = e % w;
    const S* dyp = dy + plane * oh * ow;
    int64_t i0, i1, j0, j1;
    cells_holding(ih, h, oh, &i0, &i1);
    cells_holding(iw, w, ow, &j0, &j1);
    float acc = 0.0f;
    for (int64_t i = i0; i <= i1; ++i) {
      const int64_t h0 = cell_start(i, h, oh), h1 = cell_end(i, h, oh);
      if (ih < h0 || ih >= h1) continue;
      for (int64_t j = j0; j <= j1; ++j) {
        const int64_t w0 = cell_start(j, w, ow), w1 = cell_end(j, w, ow);
        if (iw < w0 || iw >= w1) continue;
        acc += as_f32(dyp[i * ow + j]) / static_cast<float>((h1 - h0) * (w1 - w0));
      }
    }
    dx[e] = as_storage<S>(acc);
  }
}

}  // namespace

void launch_pool_forward(const PoolShape& s, const float* x, float* y, DType dtype,
                         cudaStream_t stream) {
  const int64_t total = s.planes * s.oh * s.ow;
  if (total <= 0) return;
  with_storage(dtype, [&](auto tag) {
    using S = typename decltype(tag)::type;
    launch_kernel(pool_forward_kernel<S>, grid_for(total), kThreads, stream, s, stored<S>(x),
                  stored<S>(y));
  });
}

void launch_pool_backward(const PoolShape& s, const float* x, const float* dy, float* dx,
                          DType dtype, cudaStream_t stream) {
  const int64_t total = s.planes * s.h * s.w;
  if (total <= 0) return;
  with_storage(dtype, [&](auto tag) {
    using S = typename decltype(tag)::type;
    launch_kernel(pool_backward_kernel<S>, grid_for(total), kThreads, stream, s, stored<S>(x),
                  stored<S>(dy), stored<S>(dx));
  });
}

void launch_adaptive_avg_pool_forward(int64_t planes, int64_t h, int64_t w, int64_t oh, int64_t ow,
                                      const float* x, float* y, DType dtype, cudaStream_t stream) {
  const int64_t total = planes * oh * ow;
  if (total <= 0) return;
  with_storage(dtype, [&](auto tag) {
    using S = typename decltype(tag)::type;
    launch_kernel(adaptive_forward_kernel<S>, grid_for(total), kThreads, stream, planes, h, w, oh,
                  ow, stored<S>(x), stored<S>(y));
  });
}

void launch_adaptive_avg_pool_backward(int64_t planes, int64_t h, int64_t w, int64_t oh, int64_t ow,
                                       const float* dy, float* dx, DType dtype,
                                       cudaStream_t stream) {
  const int64_t total = planes * h * w;
  if (total <= 0) return;
  with_storage(dtype, [&](auto tag) {
    using S = typename decltype(tag)::type;
    launch_kernel(adaptive_backward_kernel<S>, grid_for(total), kThreads, stream, planes, h, w, oh,
                  ow, stored<S>(dy), stored<S>(dx));
  });
}

}  // namespace ferry::cuda
