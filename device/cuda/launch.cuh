// Private to the CUDA kernels (.cu files): one-dimensional grid-stride launches and fixed-order
// block reductions. A reduction's order depends on blockDim only, never on scheduling, so its
// result is the same bits on every run (no atomics).
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>

#include "device/cuda/cuda_check.h"

namespace ferry::cuda {

constexpr int kThreads = 256;
// Enough blocks to fill any current GPU many times over; larger arrays loop.
constexpr int64_t kMaxBlocks = 4096;

// Blocks for n > 0 elements at kThreads per block, capped at kMaxBlocks.
inline unsigned int grid_for(int64_t n) {
  return static_cast<unsigned int>(std::min((n + kThreads - 1) / kThreads, kMaxBlocks));
}

// The launch configuration of `blocks` x `threads` on `stream`.
inline cudaLaunchConfig_t config_for(unsigned int blocks, unsigned int threads,
                                     cudaStream_t stream) {
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(blocks);
  config.blockDim = dim3(threads);
  config.dynamicSmemBytes = 0;
  config.stream = stream;
  config.attrs = nullptr;
  config.numAttrs = 0;
  return config;
}

// Enqueues kernel<<<blocks, threads, 0, stream>>>(args...); cudaLaunchKernelEx returns this
// launch's own status, so a stale error of an earlier call is not blamed on it.
template <typename... Params, typename... Args>
void launch_kernel(void (*kernel)(Params...), unsigned int blocks, unsigned int threads,
                   cudaStream_t stream, Args... args) {
  const cudaLaunchConfig_t config = config_for(blocks, threads, stream);
  CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, static_cast<Params>(args)...));
}

// A grid-stride loop over [0, n): for (int64_t i : GridStride(n)) covers each index once.
#define FERRY_GRID_STRIDE(i, n)                                                          \
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < (n); \
       i += static_cast<int64_t>(blockDim.x) * gridDim.x)

}  // namespace ferry::cuda

#if defined(__CUDACC__)
#include "device/cuda/block_sum.cuh"
#endif
