// The fixed-order block sum of the CUDA kernels, in the one copy that both nvcc and the host
// emulation compile (Note [Host emulation of the CUDA kernels]). Included by device/cuda/launch.cuh
// (and its emulation), which supply the CUDA keywords and built-ins.
#pragma once

namespace ferry::cuda {

// The sum of every thread's `value` over the block (blockDim.x a power of two, at most
// kMaxReduceThreads), returned to every thread. A fixed tree in shared memory: thread t adds
// t + half at each level, so the order depends on blockDim only.
constexpr int kMaxReduceThreads = 1024;

template <typename T>
__device__ T block_sum(T value) {
  __shared__ T partial[kMaxReduceThreads];
  __shared__ T total;
  const unsigned int t = threadIdx.x;
  partial[t] = value;
  __syncthreads();
  for (unsigned int half = blockDim.x / 2; half > 0; half /= 2) {
    if (t < half) partial[t] += partial[t + half];
    __syncthreads();
  }
  if (t == 0) total = partial[0];
  __syncthreads();
  const T result = total;
  __syncthreads();  // the shared buffers may be reused by the next call
  return result;
}

}  // namespace ferry::cuda
