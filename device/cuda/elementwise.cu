// Fill and scale as grid-stride loops: the grid is capped at kMaxBlocks and each thread walks
// the array with the grid's stride, so any n (int64) is covered exactly once.
#include "device/cuda/elementwise.h"

#include <algorithm>

#include "device/cuda/cuda_check.h"

namespace ferry::cuda {

namespace {

constexpr int64_t kThreads = 256;
// Enough blocks to fill any current GPU many times over; larger arrays loop.
constexpr int64_t kMaxBlocks = 4096;

__global__ void fill_kernel(float* y, int64_t n, float value) {
  const int64_t stride = static_cast<int64_t>(blockDim.x) * gridDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    y[i] = value;
  }
}

__global__ void scale_kernel(float* y, int64_t n, float alpha) {
  const int64_t stride = static_cast<int64_t>(blockDim.x) * gridDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    y[i] *= alpha;
  }
}

// One-dimensional launch for n > 0 elements on `stream`.
cudaLaunchConfig_t launch_config(int64_t n, cudaStream_t stream) {
  cudaLaunchConfig_t config = {};
  const int64_t blocks = std::min((n + kThreads - 1) / kThreads, kMaxBlocks);
  config.gridDim = dim3(static_cast<unsigned int>(blocks));
  config.blockDim = dim3(static_cast<unsigned int>(kThreads));
  config.dynamicSmemBytes = 0;
  config.stream = stream;
  config.attrs = nullptr;
  config.numAttrs = 0;
  return config;
}

}  // namespace

// cudaLaunchKernelEx returns this launch's own status, so no stale error of an earlier call
// left in cudaGetLastError() can be blamed on it.
void launch_fill(float* y, int64_t n, float value, cudaStream_t stream) {
  if (n <= 0) return;
  const cudaLaunchConfig_t config = launch_config(n, stream);
  CUDA_CHECK(cudaLaunchKernelEx(&config, fill_kernel, y, n, value));
}

void launch_scale(float* y, int64_t n, float alpha, cudaStream_t stream) {
  if (n <= 0) return;
  const cudaLaunchConfig_t config = launch_config(n, stream);
  CUDA_CHECK(cudaLaunchKernelEx(&config, scale_kernel, y, n, alpha));
}

}  // namespace ferry::cuda
