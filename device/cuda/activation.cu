// Elementwise kernels of the model: ReLU, add, accumulate and inverted dropout, as grid-stride
// loops. Each output element depends on its own inputs only and the expressions are the CPU
// backend's, so the two backends agree bit for bit (the dropout mask included: both draw from
// device/counter_rng.h at the same indices).
#include "device/counter_rng.h"
#include "device/cuda/kernel_ops.h"
#include "device/cuda/launch.cuh"

namespace ferry::cuda {
namespace {

// PyTorch's clamp_min(x, 0): a NaN stays NaN.
__global__ void relu_kernel(int64_t n, const float* x, float* y) {
  FERRY_GRID_STRIDE(i, n) { y[i] = x[i] < 0.0f ? 0.0f : x[i]; }
}

__global__ void relu_grad_kernel(int64_t n, const float* y, const float* dy, float* dx) {
  FERRY_GRID_STRIDE(i, n) { dx[i] = y[i] > 0.0f ? dy[i] : 0.0f; }
}

__global__ void add_kernel(int64_t n, const float* a, const float* b, float* y) {
  FERRY_GRID_STRIDE(i, n) { y[i] = a[i] + b[i]; }
}

__global__ void accumulate_kernel(int64_t n, const float* x, float* y) {
  FERRY_GRID_STRIDE(i, n) { y[i] += x[i]; }
}

__global__ void dropout_kernel(int64_t n, float p, float keep, uint64_t seed, uint64_t offset,
                               const float* x, float* y, uint8_t* mask) {
  FERRY_GRID_STRIDE(i, n) {
    const bool kept = counter_uniform(seed, offset + static_cast<uint64_t>(i)) >= p;
    mask[i] = kept ? 1 : 0;
    y[i] = kept ? x[i] / keep : 0.0f;
  }
}

__global__ void dropout_grad_kernel(int64_t n, float keep, const float* dy, const uint8_t* mask,
                                    float* dx) {
  FERRY_GRID_STRIDE(i, n) { dx[i] = mask[i] ? dy[i] / keep : 0.0f; }
}

}  // namespace

void launch_relu_forward(int64_t n, const float* x, float* y, cudaStream_t stream) {
  if (n <= 0) return;
  launch_kernel(relu_kernel, grid_for(n), kThreads, stream, n, x, y);
}

void launch_relu_backward(int64_t n, const float* y, const float* dy, float* dx,
                          cudaStream_t stream) {
  if (n <= 0) return;
  launch_kernel(relu_grad_kernel, grid_for(n), kThreads, stream, n, y, dy, dx);
}

void launch_add(int64_t n, const float* a, const float* b, float* y, cudaStream_t stream) {
  if (n <= 0) return;
  launch_kernel(add_kernel, grid_for(n), kThreads, stream, n, a, b, y);
}

void launch_accumulate(int64_t n, const float* x, float* y, cudaStream_t stream) {
  if (n <= 0) return;
  launch_kernel(accumulate_kernel, grid_for(n), kThreads, stream, n, x, y);
}

void launch_dropout_forward(int64_t n, float p, uint64_t seed, uint64_t offset, const float* x,
                            float* y, uint8_t* mask, cudaStream_t stream) {
  if (n <= 0) return;
  launch_kernel(dropout_kernel, grid_for(n), kThreads, stream, n, p, 1.0f - p, seed, offset, x, y,
                mask);
}

void launch_dropout_backward(int64_t n, float p, const float* dy, const uint8_t* mask, float* dx,
                             cudaStream_t stream) {
  if (n <= 0) return;
  launch_kernel(dropout_grad_kernel, grid_for(n), kThreads, stream, n, 1.0f - p, dy, mask, dx);
}

}  // namespace ferry::cuda
