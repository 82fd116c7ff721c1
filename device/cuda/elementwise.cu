// Fill and scale as grid-stride loops over fp32 or bf16 storage (Note [bf16 storage in the CUDA
// kernels]): the grid is capped at kMaxBlocks and each thread walks the array with the grid's
// stride, so any n (int64) is covered exactly once.
#include "device/cuda/elementwise.h"
#include "device/cuda/launch.cuh"
#include "device/cuda/storage.cuh"

namespace ferry::cuda {

namespace {

template <typename S>
__global__ void fill_kernel(S* y, int64_t n, float value) {
  const S stored_value = as_storage<S>(value);
  FERRY_GRID_STRIDE(i, n) { y[i] = stored_value; }
}

template <typename S>
__global__ void scale_kernel(S* y, int64_t n, float alpha) {
  FERRY_GRID_STRIDE(i, n) { y[i] = as_storage<S>(as_f32(y[i]) * alpha); }
}

}  // namespace

void launch_fill(float* y, int64_t n, float value, DType dtype, cudaStream_t stream) {
  if (n <= 0) return;
  with_storage(dtype, [&](auto tag) {
    using S = typename decltype(tag)::type;
    launch_kernel(fill_kernel<S>, grid_for(n), kThreads, stream, stored<S>(y), n, value);
  });
}

void launch_scale(float* y, int64_t n, float alpha, DType dtype, cudaStream_t stream) {
  if (n <= 0) return;
  with_storage(dtype, [&](auto tag) {
    using S = typename decltype(tag)::type;
    launch_kernel(scale_kernel<S>, grid_for(n), kThreads, stream, stored<S>(y), n, alpha);
  });
}

}  // namespace ferry::cuda
