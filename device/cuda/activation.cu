// Elementwise kernels of the model: ReLU, add, accumulate and inverted dropout, as grid-stride
// loops over fp32 or bf16 storage (Note [bf16 storage in the CUDA kernels]). Each output element
// depends on its own inputs only and the expressions are the CPU backend's, so the two backends
// agree bit for bit (the dropout mask included: both draw from device/counter_rng.h at the same
// indices).
#include "device/counter_rng.h"
#include "device/cuda/kernel_ops.h"
#include "device/cuda/launch.cuh"
#include "device/cuda/storage.cuh"

namespace ferry::cuda {
namespace {

// PyTorch's clamp_min(x, 0): a NaN stays NaN.
template <typename S>
__global__ void relu_kernel(int64_t n, const S* x, S* y) {
  FERRY_GRID_STRIDE(i, n) {
    const float v = as_f32(x[i]);
    y[i] = as_storage<S>(v < 0.0f ? 0.0f : v);
  }
}

template <typename S>
__global__ void relu_grad_kernel(int64_t n, const S* y, const S* dy, S* dx) {
  FERRY_GRID_STRIDE(i, n) { dx[i] = as_storage<S>(as_f32(y[i]) > 0.0f ? as_f32(dy[i]) : 0.0f); }
}

template <typename S>
__global__ void add_kernel(int64_t n, const S* a, const S* b, S* y) {
  FERRY_GRID_STRIDE(i, n) { y[i] = as_storage<S>(as_f32(a[i]) + as_f32(b[i])); }
}

template <typename S>
__global__ void accumulate_kernel(int64_t n, const S* x, S* y) {
  FERRY_GRID_STRIDE(i, n) { y[i] = as_storage<S>(as_f32(y[i]) + as_f32(x[i])); }
}

template <typename S>
__global__ void dropout_kernel(int64_t n, float p, float keep, uint64_t seed, uint64_t offset,
                               const S* x, S* y, uint8_t* mask) {
  FERRY_GRID_STRIDE(i, n) {
    const bool kept = counter_uniform(seed, offset + static_cast<uint64_t>(i)) >= p;
    mask[i] = kept ? 1 : 0;
    y[i] = as_storage<S>(kept ? as_f32(x[i]) / keep : 0.0f);
  }
}

template <typename S>
__global__ void dropout_grad_kernel(int64_t n, float keep, const S* dy, const uint8_t* mask,
                                    S* dx) {
  FERRY_GRID_STRIDE(i, n) { dx[i] = as_storage<S>(mask[i] ? as_f32(dy[i]) / keep : 0.0f); }
}

}  // namespace

void launch_relu_forward(int64_t n, const float* x, float* y, DType dtype, cudaStream_t stream) {
  if (n <= 0) return;
  with_storage(dtype, [&](auto tag) {
    using S = typename decltype(tag)::type;
    launch_kernel(relu_kernel<S>, grid_for(n), kThreads, stream, n, stored<S>(x), stored<S>(y));
  });
}

void launch_relu_backward(int64_t n, const float* y, const float* dy, float* dx, DType dtype,
                          cudaStream_t stream) {
  if (n <= 0) return;
  with_storage(dtype, [&](auto tag) {
    using S = typename decltype(tag)::type;
    launch_kernel(relu_grad_kernel<S>, grid_for(n), kThreads, stream, n, stored<S>(y),
                  stored<S>(dy), stored<S>(dx));
  });
}

void launch_add(int64_t n, const float* a, const float* b, float* y, DType dtype,
                cudaStream_t stream) {
  if (n <= 0) return;
  with_storage(dtype, [&](auto tag) {
    using S = typename decltype(tag)::type;
    launch_kernel(add_kernel<S>, grid_for(n), kThreads, stream, n, stored<S>(a), stored<S>(b),
                  stored<S>(y));
  });
}

void launch_accumulate(int64_t n, const float* x, float* y, DType dtype, cudaStream_t stream) {
  if (n <= 0) return;
  with_storage(dtype, [&](auto tag) {
    using S = typename decltype(tag)::type;
    launch_kernel(accumulate_kernel<S>, grid_for(n), kThreads, stream, n, stored<S>(x),
                  stored<S>(y));
  });
}

void launch_dropout_forward(int64_t n, float p, uint64_t seed, uint64_t offset, const float* x,
                            float* y, uint8_t* mask, DType dtype, cudaStream_t stream) {
  if (n <= 0) return;
  with_storage(dtype, [&](auto tag) {
    using S = typename decltype(tag)::type;
    launch_kernel(dropout_kernel<S>, grid_for(n), kThreads, stream, n, p, 1.0f - p, seed, offset,
                  stored<S>(x), stored<S>(y), mask);
  });
}

void launch_dropout_backward(int64_t n, float p, const float* dy, const uint8_t* mask, float* dx,
                             DType dtype, cudaStream_t stream) {
  if (n <= 0) return;
  with_storage(dtype, [&](auto tag) {
    using S = typename decltype(tag)::type;
    launch_kernel(dropout_grad_kernel<S>, grid_for(n), kThreads, stream, n, 1.0f - p, stored<S>(dy),
                  mask, stored<S>(dx));
  });
}

}  // namespace ferry::cuda
