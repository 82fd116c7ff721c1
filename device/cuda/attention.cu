// The attention core's elementwise and per-row pieces between its cuBLAS products
// (attention_cublas.cc): the causal (and segment-masked) softmax with the forward's dropout, the
// dropout rebuilt for the backward, and the softmax's backward. One block per score row; a row's
// sums use fixed logical lanes and a fixed tree (the order depends on T only), so the bits repeat
// run to run and for every grid. The dropout draws DropoutForward's mask (device/counter_rng.h,
// offset 0 over the (N, heads, T, T) elements). Probabilities in fp32 or bf16 storage, the
// scores and their gradients fp32 (Note [bf16 storage in the CUDA kernels]).
#include <algorithm>

#include "device/counter_rng.h"
#include "device/cuda/lane_total.cuh"
#include "device/cuda/launch.cuh"
#include "device/cuda/storage.cuh"
#include "device/cuda/transformer_ops.h"

namespace ferry::cuda {
namespace {

// Logical lanes of a row: lane l takes columns l, l + kSmLanes, ...; threads loop over lanes
// when a block has fewer (the host emulation).
constexpr int kSmLanes = 64;

// Tree reductions over the lanes, returned to every thread; the caller filled the lanes.
__device__ float lane_max(float* lanes) {
  __syncthreads();
  for (int half = kSmLanes / 2; half > 0; half /= 2) {
    for (int l = static_cast<int>(threadIdx.x); l < half; l += static_cast<int>(blockDim.x)) {
      lanes[l] = lanes[l] < lanes[l + half] ? lanes[l + half] : lanes[l];
    }
    __syncthreads();
  }
  const float top = lanes[0];
  __syncthreads();
  return top;
}

// The first key query row r may see: its segment start (Note [Segments of a packed row] in
// device/kernels.h), 0 without segments. Row r is query r % t of batch row r / (heads t).
__device__ int64_t first_key(const int32_t* segments, int64_t r, int64_t t, int64_t heads) {
  if (segments == nullptr) return 0;
  return segments[(r / (heads * t)) * t + r % t];
}

// Row r holds query i = r % t; columns j in [b, i] are its keys, b its segment start. Lane l
// takes columns b + l, b + l + kSmLanes, ...: a document's sums do not depend on where its row
// put it. The exponentials are staged in the scores' row itself (each thread rewrites only the
// columns of its lanes); in fp32 the scores are `probs` (in place).
template <typename S>
__global__ void __launch_bounds__(kSmLanes)
    attention_softmax_kernel(int64_t rows, int64_t t, int64_t heads, const int32_t* segments,
                             float p, float keep, uint64_t seed, float* scores, S* probs,
                             S* dropped, uint8_t* mask) {
  __shared__ float lanes_max[kSmLanes];
  __shared__ double lanes_sum[kSmLanes];
  const float neg_inf = -__int_as_float(0x7f800000);
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const int64_t i = r % t;
    const int64_t b = first_key(segments, r, t, heads);
    float* s = scores + r * t;
    S* pr = probs + r * t;
    for (int l = static_cast<int>(threadIdx.x); l < kSmLanes; l += static_cast<int>(blockDim.x)) {
      float m = neg_inf;
      for (int64_t j = b + l; j <= i; j += kSmLanes) m = m < s[j] ? s[j] : m;
      lanes_max[l] = m;
    }
    const float top = lane_max(lanes_max);
    for (int l = static_cast<int>(threadIdx.x); l < kSmLanes; l += static_cast<int>(blockDim.x)) {
      double a = 0.0;
      for (int64_t j = b + l; j <= i; j += kSmLanes) {
        const float e = exp(s[j] - top);
        s[j] = e;
        a += static_cast<double>(e);
      }
      lanes_sum[l] = a;
    }
    const double total = lane_total<kSmLanes>(lanes_sum);
    for (int l = static_cast<int>(threadIdx.x); l < kSmLanes; l += static_cast<int>(blockDim.x)) {
      for (int64_t j = l; j < t; j += kSmLanes) {
        const float pj =
            b <= j && j <= i ? static_cast<float>(static_cast<double>(s[j]) / total) : 0.0f;
        pr[j] = as_storage<S>(pj);
        if (dropped != nullptr) {
          const int64_t at = r * t + j;
          const bool kept = counter_uniform(seed, static_cast<uint64_t>(at)) >= p;
          mask[at] = kept ? 1 : 0;
          dropped[at] = as_storage<S>(kept ? pj / keep : 0.0f);
        }
      }
    }
    __syncthreads();  // the row is final before the lanes are refilled
  }
}

template <typename S>
__global__ void attention_dropout_apply_kernel(int64_t count, float keep, const S* probs,
                                               const uint8_t* mask, S* dropped) {
  FERRY_GRID_STRIDE(q, count) {
    dropped[q] = as_storage<S>(mask[q] ? as_f32(probs[q]) / keep : 0.0f);
  }
}

// dP = DropoutBackward(dP') when dropping (as DropoutBackward: mask ? dP' / keep : 0).
__device__ float undropped(float g, const uint8_t* mask, int64_t at, float keep) {
  if (mask == nullptr) return g;
  return mask[at] ? g / keep : 0.0f;
}

// dS into `dscores` (in fp32 the gradient's own buffer `dprobs`: each thread reads g[j] before it
// writes the same element).
template <typename S>
__global__ void __launch_bounds__(kSmLanes)
    attention_softmax_grad_kernel(int64_t rows, int64_t t, int64_t heads, const int32_t* segments,
                                  float keep, const S* probs, const uint8_t* mask, float* dprobs,
                                  S* dscores) {
  __shared__ double lanes_sum[kSmLanes];
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const int64_t i = r % t;
    const int64_t b = first_key(segments, r, t, heads);
    const S* pr = probs + r * t;
    const float* g = dprobs + r * t;
    S* out = dscores + r * t;
    for (int l = static_cast<int>(threadIdx.x); l < kSmLanes; l += static_cast<int>(blockDim.x)) {
      double a = 0.0;
      for (int64_t j = b + l; j <= i; j += kSmLanes) {
        a += static_cast<double>(undropped(g[j], mask, r * t + j, keep)) *
             static_cast<double>(as_f32(pr[j]));
      }
      lanes_sum[l] = a;
    }
    const float dot = static_cast<float>(lane_total<kSmLanes>(lanes_sum));
    for (int l = static_cast<int>(threadIdx.x); l < kSmLanes; l += static_cast<int>(blockDim.x)) {
      for (int64_t j = l; j < t; j += kSmLanes) {
        out[j] = as_storage<S>(b <= j && j <= i
                                   ? as_f32(pr[j]) * (undropped(g[j], mask, r * t + j, keep) - dot)
                                   : 0.0f);
      }
    }
    __syncthreads();
  }
}

unsigned int row_grid(int64_t rows) {
  return static_cast<unsigned int>(std::max<int64_t>(1, std::min<int64_t>(rows, kMaxBlocks)));
}

}  // namespace

void launch_attention_softmax(int64_t rows, int64_t t, int64_t heads, const int32_t* segments,
                              float p, uint64_t seed, float* probs, float* dropped, uint8_t* mask,
                              cudaStream_t stream) {
  launch_attention_softmax(rows, t, heads, segments, p, seed, probs, probs, dropped, mask,
                           DType::kF32, stream);
}

void launch_attention_softmax(int64_t rows, int64_t t, int64_t heads, const int32_t* segments,
                              float p, uint64_t seed, float* scores, float* probs, float* dropped,
                              uint8_t* mask, DType dtype, cudaStream_t stream) {
  if (rows <= 0) return;
  with_storage(dtype, [&](auto tag) {
    using S = typename decltype(tag)::type;
    launch_kernel(attention_softmax_kernel<S>, row_grid(rows), kSmLanes, stream, rows, t, heads,
                  segments, p, 1.0f - p, seed, scores, stored<S>(probs),
                  stored<S>(p > 0.0f ? dropped : nullptr), mask);
  });
}

void launch_attention_dropout_apply(int64_t count, float p, const float* probs, const uint8_t* mask,
                                    float* dropped, cudaStream_t stream) {
  launch_attention_dropout_apply(count, p, probs, mask, dropped, DType::kF32, stream);
}

void launch_attention_dropout_apply(int64_t count, float p, const float* probs, const uint8_t* mask,
                                    float* dropped, DType dtype, cudaStream_t stream) {
  if (count <= 0) return;
  with_storage(dtype, [&](auto tag) {
    using S = typename decltype(tag)::type;
    launch_kernel(attention_dropout_apply_kernel<S>, grid_for(count), kThreads, stream, count,
                  1.0f - p, stored<S>(probs), mask, stored<S>(dropped));
  });
}

void launch_attention_softmax_backward(int64_t rows, int64_t t, int64_t heads,
                                       const int32_t* segments, float p, const float* probs,
                                       const uint8_t* mask, float* dprobs, cudaStream_t stream) {
  launch_attention_softmax_backward(rows, t, heads, segments, p, probs, mask, dprobs, dprobs,
                                    DType::kF32, stream);
}

void launch_attention_softmax_backward(int64_t rows, int64_t t, int64_t heads,
                                       const int32_t* segments, float p, const float* probs,
                                       const uint8_t* mask, float* dprobs, float* dscores,
                                       DType dtype, cudaStream_t stream) {
  if (rows <= 0) return;
  with_storage(dtype, [&](auto tag) {
    using S = typename decltype(tag)::type;
    launch_kernel(attention_softmax_grad_kernel<S>, row_grid(rows), kSmLanes, stream, rows, t,
                  heads, segments, 1.0f - p, stored<S>(probs), p > 0.0f ? mask : nullptr, dprobs,
                  stored<S>(dscores));
  });
}

}  // namespace ferry::cuda
