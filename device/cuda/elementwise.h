// Small CUDA kernels the device itself needs: fill (NaN poisoning of fresh memory), scale, and
// the steps of bf16 linear layers and convolutions that cuBLAS and cuDNN leave (biases, bias
// gradients, widening a bf16 weight gradient).
// Each enqueues one grid-stride kernel on `stream` and returns; y is device memory of GPU that
// is current on the calling thread, and n = 0 enqueues nothing.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "device/dtype.h"

namespace ferry::cuda {

// y[i] = value for i in [0, n), n elements of `dtype` (kF32 or kBF16: the value rounded once).
// Throws LibraryError when the launch fails.
void launch_fill(float* y, int64_t n, float value, DType dtype, cudaStream_t stream);

// y[i] *= alpha for i in [0, n), in fp32 math on elements of `dtype` (kF32 or kBF16). Throws
// LibraryError when the launch fails.
void launch_scale(float* y, int64_t n, float alpha, DType dtype, cudaStream_t stream);

// y[r, j] = bf16(acc[r, j] + bias[j]) for r < rows, j < cols: a bf16 linear layer's fp32
// product and its fp32 bias, added in fp32 and rounded once (y holds bf16 bits behind a float
// pointer). Throws LibraryError when the launch fails.
void launch_bias_to_bf16(int64_t rows, int64_t cols, const float* acc, const float* bias, float* y,
                         cudaStream_t stream);

// y[n, k, i] = bf16(float(y[n, k, i]) + bias[k]) over (N, K, HW): an fp32 bias added to a bf16
// convolution output in place. Throws LibraryError when the launch fails.
void launch_channel_bias_bf16(int64_t n, int64_t k, int64_t hw, const float* bias, float* y,
                              cudaStream_t stream);

// dbias[k] = the sum of dy[n, k, i] over (N, HW) for bf16 dy, in double in an order fixed by the
// shape and the block size (one block per channel), stored fp32. Throws LibraryError when the
// launch fails.
void launch_channel_sums_bf16(int64_t n, int64_t k, int64_t hw, const float* dy, float* dbias,
                              cudaStream_t stream);

// y[i] = float(x[i]) for i < count, x bf16 (exact). Throws LibraryError when the launch fails.
void launch_widen_bf16(int64_t count, const float* x, float* y, cudaStream_t stream);

// y[i] = x[i] converted from `from` to `to` for i < n: fp32 to bf16 rounds with device/bf16.h's
// float_to_bf16 (as the CPU backend narrows), bf16 to fp32 is exact. Any other pair throws
// UnsupportedError naming both; n = 0 enqueues nothing.
void launch_convert_floats(int64_t n, DType from, DType to, const void* x, void* y,
                           cudaStream_t stream);

}  // namespace ferry::cuda
