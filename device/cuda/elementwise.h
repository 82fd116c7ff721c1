// Small CUDA kernels the device itself needs: fill (NaN poisoning of fresh memory) and scale.
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

}  // namespace ferry::cuda
