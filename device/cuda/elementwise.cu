// Fill and scale over fp32 or bf16 storage, and the bf16 steps of linear layers and convolutions
// (Note [bf16 storage in the CUDA kernels]), as grid-stride loops: the grid is capped at
// kMaxBlocks and each thread walks the array with the grid's stride, so any n (int64) is covered
// exactly once. The channel sums are one block per channel.
#include "device/cuda/elementwise.h"

#include <algorithm>

#include <fmt/format.h>

#include "common/error.h"
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

__global__ void bias_to_bf16_kernel(int64_t rows, int64_t cols, const float* acc, const float* bias,
                                    Bf16* y) {
  FERRY_GRID_STRIDE(i, rows * cols) { y[i] = as_storage<Bf16>(acc[i] + bias[i % cols]); }
}

__global__ void channel_bias_bf16_kernel(int64_t n, int64_t k, int64_t hw, const float* bias,
                                         Bf16* y) {
  FERRY_GRID_STRIDE(i, n * k * hw) { y[i] = as_storage<Bf16>(as_f32(y[i]) + bias[(i / hw) % k]); }
}

// One block per channel (grid-stride over channels): each thread adds its elements in order,
// then the fixed tree of block_sum.
__global__ void channel_sums_bf16_kernel(int64_t n, int64_t k, int64_t hw, const Bf16* dy,
                                         float* dbias) {
  for (int64_t c = blockIdx.x; c < k; c += gridDim.x) {
    double acc = 0.0;
    for (int64_t e = threadIdx.x; e < n * hw; e += blockDim.x) {
      acc += static_cast<double>(as_f32(dy[(e / hw) * k * hw + c * hw + e % hw]));
    }
    const double total = block_sum(acc);
    if (threadIdx.x == 0) dbias[c] = static_cast<float>(total);
  }
}

template <typename From, typename To>
__global__ void convert_kernel(int64_t n, const From* x, To* y) {
  FERRY_GRID_STRIDE(i, n) { y[i] = as_storage<To>(as_f32(x[i])); }
}

__global__ void widen_bf16_kernel(int64_t count, const Bf16* x, float* y) {
  FERRY_GRID_STRIDE(i, count) { y[i] = as_f32(x[i]); }
}

}  // namespace

void launch_channel_bias_bf16(int64_t n, int64_t k, int64_t hw, const float* bias, float* y,
                              cudaStream_t stream) {
  if (n * k * hw <= 0) return;
  launch_kernel(channel_bias_bf16_kernel, grid_for(n * k * hw), kThreads, stream, n, k, hw, bias,
                stored<Bf16>(y));
}

void launch_channel_sums_bf16(int64_t n, int64_t k, int64_t hw, const float* dy, float* dbias,
                              cudaStream_t stream) {
  if (k <= 0) return;
  const auto blocks = static_cast<unsigned int>(std::min<int64_t>(k, kMaxBlocks));
  launch_kernel(channel_sums_bf16_kernel, blocks, kThreads, stream, n, k, hw, stored<Bf16>(dy),
                dbias);
}

void launch_convert_floats(int64_t n, DType from, DType to, const void* x, void* y,
                           cudaStream_t stream) {
  const bool narrow = from == DType::kF32 && to == DType::kBF16;
  const bool widen = from == DType::kBF16 && to == DType::kF32;
  if (!narrow && !widen) {
    throw UnsupportedError(fmt::format("convert_floats: {} to {} is not a conversion the CUDA "
                                       "backend runs",
                                       dtype_name(from), dtype_name(to)),
                           "convert between F32 and BF16");
  }
  if (n <= 0) return;
  if (narrow) {
    launch_kernel(convert_kernel<float, Bf16>, grid_for(n), kThreads, stream, n,
                  static_cast<const float*>(x), static_cast<Bf16*>(y));
  } else {
    launch_kernel(convert_kernel<Bf16, float>, grid_for(n), kThreads, stream, n,
                  static_cast<const Bf16*>(x), static_cast<float*>(y));
  }
}

void launch_widen_bf16(int64_t count, const float* x, float* y, cudaStream_t stream) {
  if (count <= 0) return;
  launch_kernel(widen_bf16_kernel, grid_for(count), kThreads, stream, count, stored<Bf16>(x), y);
}

void launch_bias_to_bf16(int64_t rows, int64_t cols, const float* acc, const float* bias, float* y,
                         cudaStream_t stream) {
  if (rows <= 0 || cols <= 0) return;
  launch_kernel(bias_to_bf16_kernel, grid_for(rows * cols), kThreads, stream, rows, cols, acc, bias,
                stored<Bf16>(y));
}

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
