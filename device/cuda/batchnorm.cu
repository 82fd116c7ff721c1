// Batch normalisation on plain NCHW, several blocks per channel. Each channel's N*HW values are cut
// into chunks by the shape alone; a block sums a chunk in double by a fixed lane order and writes
// it to scratch, and a per-channel kernel adds the chunks in order (Note [Deterministic
// multi-block reductions] in kernel_ops.h): the same bits on every run and for every grid, and
// the CPU backend's bits, since it sums in the same order (Note [Batch norm's summation order]).
// x, y, dy and dx in fp32 or bf16 storage, statistics fp32 (Note [bf16 storage in the CUDA
// kernels]).
#include <algorithm>

#include "device/batch_norm_order.h"
#include "device/cuda/kernel_ops.h"
#include "device/cuda/launch.cuh"
#include "device/cuda/storage.cuh"

namespace ferry::cuda {
namespace {

// Note [Batch norm's summation order] (device/batch_norm_order.h) fixes the chunks and the order
// inside them; one thread per lane on the GPU, a block per chunk.
constexpr int kBnLanes = kBatchNormLanes;
// Resident blocks asked per multiprocessor for the chunk kernels (grid size only).
constexpr int64_t kBnBlocksPerSm = 4;

using BnSplit = BatchNormSplit;

BnSplit bn_split(int64_t count, int64_t c) { return batch_norm_split(count, c); }

// Blocks for the chunk kernels: enough to fill every multiprocessor, never more than the chunks.
unsigned int bn_grid(int64_t units, int sm_count) {
  return static_cast<unsigned int>(
      std::max<int64_t>(1, std::min(units, kBnBlocksPerSm * std::max(sm_count, 1))));
}

// The scratch's regions (kernel_ops.h): partials A and B, slot c * chunks + j for chunk j of
// channel c; then four per-channel statistics.
struct BnScratch {
  double* part_a;
  double* part_b;
  double* stat[4];
};

BnScratch bn_scratch(const ReductionScratch& scratch) {
  BnScratch r;
  r.part_a = scratch.ptr;
  r.part_b = scratch.ptr + kReductionPartials;
  for (int i = 0; i < 4; ++i)
    r.stat[i] = scratch.ptr + 2 * kReductionPartials + i * kReductionChannels;
  return r;
}

// Element e of a channel's N*HW values, as an offset from the channel's first plane. N*HW fits
// in 32 bits (cuda_ops.cc checks), so the division is the cheap 32-bit one.
__device__ int64_t channel_offset(int64_t e, int64_t hw, int64_t stride) {
  const uint32_t plane = static_cast<uint32_t>(e) / static_cast<uint32_t>(hw);
  return static_cast<int64_t>(plane) * stride + (e - static_cast<int64_t>(plane) * hw);
}

// The channel of element q of an (N, C, HW) tensor; 32-bit divisions when the whole tensor has
// fewer than 2^32 elements (`narrow`, the same for every thread), as even ResNet-50's largest
// batch norm at batch 256 does.
__device__ int64_t channel_of(int64_t q, const BatchNormShape& s, bool narrow) {
  if (narrow) {
    return (static_cast<uint32_t>(q) / static_cast<uint32_t>(s.hw)) % static_cast<uint32_t>(s.c);
  }
  return (q / s.hw) % s.c;
}

bool narrow_tensor(const BatchNormShape& s) { return s.n * s.c * s.hw <= int64_t{UINT32_MAX}; }

// What a chunk kernel sums: x; (x - mean)^2; or dy and dy * (x - mean).
enum class BnSums { kValue, kSquaredDeviation, kGradient };

// Partial sums of every chunk of every channel into part_a (and part_b for kGradient). The mean
// is mean_d[c], or save_mean[c] when mean_d is null. Blocks take chunks grid-stride; the order
// inside a chunk depends on kBnLanes only (threads loop over lanes when there are fewer).
template <typename S>
__global__ void __launch_bounds__(kBnLanes)
    bn_chunk_sums_kernel(BatchNormShape s, BnSplit split, BnSums what, const S* x, const S* dy,
                         const double* mean_d, const float* save_mean, double* part_a,
                         double* part_b) {
  __shared__ double lane_a[kBnLanes];
  __shared__ double lane_b[kBnLanes];
  const int64_t count = s.n * s.hw, stride = s.c * s.hw;
  const int64_t units = s.c * split.chunks;
  for (int64_t u = blockIdx.x; u < units; u += static_cast<int64_t>(gridDim.x)) {
    const int64_t c = u / split.chunks;
    const int64_t begin = (u % split.chunks) * split.len;
    const int64_t end = begin + split.len < count ? begin + split.len : count;
    const S* xc = x + c * s.hw;
    const S* dyc = dy == nullptr ? nullptr : dy + c * s.hw;
    double mean = 0.0;
    if (mean_d != nullptr) mean = mean_d[c];
    if (save_mean != nullptr) mean = static_cast<double>(save_mean[c]);
    for (int l = static_cast<int>(threadIdx.x); l < kBnLanes; l += static_cast<int>(blockDim.x)) {
      double a = 0.0, b = 0.0;
      for (int64_t e = begin + l; e < end; e += kBnLanes) {
        const int64_t at = channel_offset(e, s.hw, stride);
        if (what == BnSums::kValue) {
          a += static_cast<double>(as_f32(xc[at]));
        } else if (what == BnSums::kSquaredDeviation) {
          const double d = static_cast<double>(as_f32(xc[at])) - mean;
          a += d * d;
        } else {
          const double g = static_cast<double>(as_f32(dyc[at]));
          a += g;
          b += g * (static_cast<double>(as_f32(xc[at])) - mean);
        }
      }
      lane_a[l] = a;
      lane_b[l] = b;
    }
    __syncthreads();
    for (int half = kBnLanes / 2; half > 0; half /= 2) {
      for (int l = static_cast<int>(threadIdx.x); l < half; l += static_cast<int>(blockDim.x)) {
        lane_a[l] += lane_a[l + half];
        lane_b[l] += lane_b[l + half];
      }
      __syncthreads();
    }
    if (threadIdx.x == 0) {
      part_a[u] = lane_a[0];
      if (what == BnSums::kGradient) part_b[u] = lane_b[0];
    }
    __syncthreads();  // the lanes are refilled for the next chunk
  }
}

// The sum of channel c's chunk partials, in chunk order.
__device__ double channel_total(const double* part, int64_t c, int64_t chunks) {
  double total = 0.0;
  for (int64_t j = 0; j < chunks; ++j) total += part[c * chunks + j];
  return total;
}

__global__ void bn_mean_kernel(BatchNormShape s, BnSplit split, const double* part_a,
                               double* mean) {
  FERRY_GRID_STRIDE(c, s.c) {
    mean[c] = channel_total(part_a, c, split.chunks) / static_cast<double>(s.n * s.hw);
  }
}

// Variance, the saved and running statistics, and the per-channel mean, scale and shift the
// normalisation reads (stat 1..3, floats held in doubles).
__global__ void bn_forward_stats_kernel(BatchNormShape s, BnSplit split, float momentum,
                                        const float* gamma, const float* beta, const double* part_a,
                                        const double* mean_d, float* running_mean,
                                        float* running_var, float* save_mean, float* save_var,
                                        double* mean_f, double* scale, double* shift) {
  FERRY_GRID_STRIDE(c, s.c) {
    const int64_t count = s.n * s.hw;
    const double mean = mean_d[c];
    const double var = channel_total(part_a, c, split.chunks) / static_cast<double>(count);
    const double invstd = 1.0 / sqrt(var + static_cast<double>(s.eps));
    mean_f[c] = static_cast<float>(mean);
    scale[c] = static_cast<float>(static_cast<double>(gamma[c]) * invstd);
    shift[c] = beta[c];
    const double m = momentum;
    const double unbias = static_cast<double>(count) / static_cast<double>(count - 1);
    if (save_mean != nullptr) save_mean[c] = static_cast<float>(mean);
    if (save_var != nullptr) save_var[c] = static_cast<float>(var);
    if (running_mean != nullptr) {
      running_mean[c] = static_cast<float>((1.0 - m) * running_mean[c] + m * mean);
    }
    if (running_var != nullptr) {
      running_var[c] = static_cast<float>((1.0 - m) * running_var[c] + m * var * unbias);
    }
  }
}

template <typename S>
__global__ void bn_normalize_kernel(BatchNormShape s, bool narrow, const S* x, const double* mean_f,
                                    const double* scale, const double* shift, S* y) {
  const int64_t total = s.n * s.c * s.hw;
  FERRY_GRID_STRIDE(q, total) {
    const int64_t c = channel_of(q, s, narrow);
    y[q] = as_storage<S>((as_f32(x[q]) - static_cast<float>(mean_f[c])) *
                             static_cast<float>(scale[c]) +
                         static_cast<float>(shift[c]));
  }
}

template <typename S>
__global__ void bn_forward_inference_kernel(BatchNormShape s, bool narrow, const S* x,
                                            const float* gamma, const float* beta,
                                            const float* running_mean, const float* running_var,
                                            S* y) {
  const int64_t total = s.n * s.c * s.hw;
  FERRY_GRID_STRIDE(q, total) {
    const int64_t c = channel_of(q, s, narrow);
    const double invstd =
        1.0 / sqrt(static_cast<double>(running_var[c]) + static_cast<double>(s.eps));
    const float scale = static_cast<float>(static_cast<double>(gamma[c]) * invstd);
    y[q] = as_storage<S>((as_f32(x[q]) - running_mean[c]) * scale + beta[c]);
  }
}

// dbeta, dgamma, and the per-channel constants of dx: k1 (stat 0), mean (1), mean_dy (2), k2 (3).
__global__ void bn_backward_stats_kernel(BatchNormShape s, BnSplit split, const float* gamma,
                                         const float* save_mean, const float* save_var,
                                         const double* part_a, const double* part_b, float* dgamma,
                                         float* dbeta, double* k1, double* mean_f, double* mean_dy,
                                         double* k2) {
  FERRY_GRID_STRIDE(c, s.c) {
    const double n = static_cast<double>(s.n * s.hw);
    const double invstd = 1.0 / sqrt(static_cast<double>(save_var[c]) + static_cast<double>(s.eps));
    const double sum_dy = channel_total(part_a, c, split.chunks);
    const double sum_dyx = channel_total(part_b, c, split.chunks);
    dbeta[c] = static_cast<float>(sum_dy);
    dgamma[c] = static_cast<float>(sum_dyx * invstd);
    k1[c] = static_cast<float>(static_cast<double>(gamma[c]) * invstd);
    k2[c] = static_cast<float>(invstd * invstd * sum_dyx / n);
    mean_dy[c] = static_cast<float>(sum_dy / n);
    mean_f[c] = save_mean[c];
  }
}

template <typename S>
__global__ void bn_grad_input_kernel(BatchNormShape s, bool narrow, const S* x, const S* dy,
                                     const double* k1, const double* mean_f, const double* mean_dy,
                                     const double* k2, S* dx) {
  const int64_t total = s.n * s.c * s.hw;
  FERRY_GRID_STRIDE(q, total) {
    const int64_t c = channel_of(q, s, narrow);
    dx[q] =
        as_storage<S>((as_f32(dy[q]) - static_cast<float>(mean_dy[c]) -
                       (as_f32(x[q]) - static_cast<float>(mean_f[c])) * static_cast<float>(k2[c])) *
                      static_cast<float>(k1[c]));
  }
}

}  // namespace

void launch_batch_norm_forward_training(const BatchNormShape& s, float momentum, const float* x,
                                        const float* gamma, const float* beta, float* y,
                                        float* running_mean, float* running_var, float* save_mean,
                                        float* save_var, DType dtype,
                                        const ReductionScratch& scratch, cudaStream_t stream) {
  const BnSplit split = bn_split(s.n * s.hw, s.c);
  const BnScratch w = bn_scratch(scratch);
  const unsigned int blocks = bn_grid(s.c * split.chunks, scratch.sm_count);
  const double* no_mean = nullptr;
  const float* no_floats = nullptr;
  with_storage(dtype, [&](auto tag) {
    using S = typename decltype(tag)::type;
    const S* no_values = nullptr;
    launch_kernel(bn_chunk_sums_kernel<S>, blocks, kBnLanes, stream, s, split, BnSums::kValue,
                  stored<S>(x), no_values, no_mean, no_floats, w.part_a, w.part_b);
    launch_kernel(bn_mean_kernel, grid_for(s.c), kThreads, stream, s, split, w.part_a, w.stat[0]);
    launch_kernel(bn_chunk_sums_kernel<S>, blocks, kBnLanes, stream, s, split,
                  BnSums::kSquaredDeviation, stored<S>(x), no_values, w.stat[0], no_floats,
                  w.part_a, w.part_b);
    launch_kernel(bn_forward_stats_kernel, grid_for(s.c), kThreads, stream, s, split, momentum,
                  gamma, beta, w.part_a, w.stat[0], running_mean, running_var, save_mean, save_var,
                  w.stat[1], w.stat[2], w.stat[3]);
    launch_kernel(bn_normalize_kernel<S>, grid_for(s.n * s.c * s.hw), kThreads, stream, s,
                  narrow_tensor(s), stored<S>(x), w.stat[1], w.stat[2], w.stat[3], stored<S>(y));
  });
}

void launch_batch_norm_forward_inference(const BatchNormShape& s, const float* x,
                                         const float* gamma, const float* beta,
                                         const float* running_mean, const float* running_var,
                                         float* y, DType dtype, cudaStream_t stream) {
  const int64_t total = s.n * s.c * s.hw;
  with_storage(dtype, [&](auto tag) {
    using S = typename decltype(tag)::type;
    launch_kernel(bn_forward_inference_kernel<S>, grid_for(total), kThreads, stream, s,
                  narrow_tensor(s), stored<S>(x), gamma, beta, running_mean, running_var,
                  stored<S>(y));
  });
}

void launch_batch_norm_backward(const BatchNormShape& s, const float* x, const float* dy,
                                const float* gamma, const float* save_mean, const float* save_var,
                                float* dx, float* dgamma, float* dbeta, DType dtype,
                                const ReductionScratch& scratch, cudaStream_t stream) {
  const BnSplit split = bn_split(s.n * s.hw, s.c);
  const BnScratch w = bn_scratch(scratch);
  const unsigned int blocks = bn_grid(s.c * split.chunks, scratch.sm_count);
  const double* no_mean = nullptr;
  with_storage(dtype, [&](auto tag) {
    using S = typename decltype(tag)::type;
    launch_kernel(bn_chunk_sums_kernel<S>, blocks, kBnLanes, stream, s, split, BnSums::kGradient,
                  stored<S>(x), stored<S>(dy), no_mean, save_mean, w.part_a, w.part_b);
    launch_kernel(bn_backward_stats_kernel, grid_for(s.c), kThreads, stream, s, split, gamma,
                  save_mean, save_var, w.part_a, w.part_b, dgamma, dbeta, w.stat[0], w.stat[1],
                  w.stat[2], w.stat[3]);
    launch_kernel(bn_grad_input_kernel<S>, grid_for(s.n * s.c * s.hw), kThreads, stream, s,
                  narrow_tensor(s), stored<S>(x), stored<S>(dy), w.stat[0], w.stat[1], w.stat[2],
                  w.stat[3], stored<S>(dx));
  });
}

}  // namespace ferry::cuda
