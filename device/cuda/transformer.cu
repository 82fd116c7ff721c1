// GPT-2's kernels around the attention core: embedding, layer norm, GELU (tanh approximation)
// and the gradient-clipping reductions. No float atomics: each output is written by one thread
// in an order fixed by the shape (Note [Embedding backward without atomics] in
// transformer_ops.h; Note [Deterministic multi-block reductions] in kernel_ops.h), so the bits
// are the same on every run, for every grid, and in the host emulation. Activations and their
// gradients in fp32 or bf16 storage; weights, statistics and weight gradients fp32 (Note [bf16
// storage in the CUDA kernels]).
#include <algorithm>

#include "device/cuda/lane_total.cuh"
#include "device/cuda/launch.cuh"
#include "device/cuda/storage.cuh"
#include "device/cuda/transformer_ops.h"

namespace ferry::cuda {
namespace {

// ---- embedding ------------------------------------------------------------------------------

// Token row `row`'s position: t, or its place in its document (Note [Segments of a packed row]
// in device/kernels.h).
__device__ int64_t position_of(const int32_t* segments, int64_t row, int64_t t) {
  return segments == nullptr ? row % t : row % t - segments[row];
}

template <typename S>
__global__ void embedding_forward_kernel(int64_t rows, int64_t t, int64_t c, const int32_t* tokens,
                                         const int32_t* segments, const float* wte,
                                         const float* wpe, S* y) {
  FERRY_GRID_STRIDE(q, rows * c) {
    const int64_t row = q / c, col = q % c;
    const float token = wte[static_cast<int64_t>(tokens[row]) * c + col];
    y[q] = as_storage<S>(wpe == nullptr ? token
                                        : token + wpe[position_of(segments, row, t) * c + col]);
  }
}

__global__ void zero_kernel(int64_t n, float* y) {
  FERRY_GRID_STRIDE(i, n) { y[i] = 0.0f; }
}

// Tokens staged per tile of the walk, so each block reads every token from global memory once.
constexpr int64_t kTokenTile = 256;

// Note [Embedding backward without atomics]: row v of dwte belongs to block v % gridDim.x.
// Token k's row is tokens[k]; with `segments` (the position table's walk, `t` its positions per
// row) it is instead token k's position, k % t - segments[k].
template <typename S>
__global__ void embedding_table_grad_kernel(int64_t count, int64_t c, const int32_t* tokens,
                                            const int32_t* segments, int64_t t, const S* dy,
                                            float* dwte) {
  __shared__ int32_t tile[kTokenTile];
  for (int64_t first = 0; first < count; first += kTokenTile) {
    const int64_t in_tile = count - first < kTokenTile ? count - first : kTokenTile;
    __syncthreads();  // the previous tile is used up
    for (int64_t k = threadIdx.x; k < in_tile; k += blockDim.x) {
      tile[k] = segments == nullptr ? tokens[first + k]
                                    : static_cast<int32_t>(position_of(segments, first + k, t));
    }
    __syncthreads();
    for (int64_t k = 0; k < in_tile; ++k) {
      const auto v = static_cast<uint32_t>(tile[k]);
      if (v % gridDim.x != blockIdx.x) continue;  // the same branch for the whole block
      float* row = dwte + static_cast<int64_t>(v) * c;
      const S* g = dy + (first + k) * c;
      for (int64_t col = threadIdx.x; col < c; col += blockDim.x) row[col] += as_f32(g[col]);
    }
  }
}

template <typename S>
__global__ void embedding_wpe_grad_kernel(int64_t n, int64_t t, int64_t c, int64_t context,
                                          const S* dy, float* dwpe) {
  FERRY_GRID_STRIDE(q, context * c) {
    const int64_t pos = q / c, col = q % c;
    float sum = 0.0f;
    if (pos < t) {
      for (int64_t b = 0; b < n; ++b) sum += as_f32(dy[(b * t + pos) * c + col]);
    }
    dwpe[q] = sum;
  }
}

// ---- layer norm -----------------------------------------------------------------------------

// Logical lanes of a row's sums: lane l adds columns l, l + kLnLanes, ... in order, then a
// fixed tree; threads loop over lanes when a block has fewer (the host emulation).
constexpr int kLnLanes = 32;
// Rows of layer norm's backward column sums are cut into chunks of at least this many rows.
constexpr int64_t kLnMinChunkRows = 16;

template <typename S>
__global__ void __launch_bounds__(kLnLanes)
    layer_norm_forward_kernel(int64_t rows, int64_t c, float eps, const S* x, const float* gamma,
                              const float* beta, S* y, float* mean_out, float* rstd_out) {
  __shared__ double lanes[kLnLanes];
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const S* xr = x + r * c;
    for (int l = static_cast<int>(threadIdx.x); l < kLnLanes; l += static_cast<int>(blockDim.x)) {
      double a = 0.0;
      for (int64_t j = l; j < c; j += kLnLanes) a += static_cast<double>(as_f32(xr[j]));
      lanes[l] = a;
    }
    const double mean = lane_total<kLnLanes>(lanes) / static_cast<double>(c);
    for (int l = static_cast<int>(threadIdx.x); l < kLnLanes; l += static_cast<int>(blockDim.x)) {
      double a = 0.0;
      for (int64_t j = l; j < c; j += kLnLanes) {
        const double d = static_cast<double>(as_f32(xr[j])) - mean;
        a += d * d;
      }
      lanes[l] = a;
    }
    const double var = lane_total<kLnLanes>(lanes) / static_cast<double>(c);
    const float mf = static_cast<float>(mean);
    const float rf = static_cast<float>(1.0 / sqrt(var + static_cast<double>(eps)));
    S* yr = y + r * c;
    for (int64_t j = threadIdx.x; j < c; j += blockDim.x) {
      yr[j] = as_storage<S>((as_f32(xr[j]) - mf) * rf * gamma[j] + beta[j]);
    }
    if (threadIdx.x == 0) {
      mean_out[r] = mf;
      rstd_out[r] = rf;
    }
  }
}

// Row chunks of the backward's column sums: a function of (rows, c) only.
struct LnSplit {
  int64_t chunks = 1, len = 1;
};

LnSplit ln_split(int64_t rows, int64_t c) {
  LnSplit s;
  if (rows <= 0) return {0, 1};  // no rows: the column totals are 0
  const int64_t most = std::max<int64_t>(1, kReductionPartials / c);
  s.chunks = std::max<int64_t>(1, std::min(most, (rows + kLnMinChunkRows - 1) / kLnMinChunkRows));
  s.len = (rows + s.chunks - 1) / s.chunks;
  s.chunks = (rows + s.len - 1) / s.len;
  return s;
}

// Partial (chunk, column) sums of dy * xhat (part_a, dgamma) and dy (part_b, dbeta), slot
// chunk * c + column; rows of a chunk in increasing order.
template <typename S>
__global__ void layer_norm_column_sums_kernel(int64_t rows, int64_t c, LnSplit split, const S* x,
                                              const S* dy, const float* mean, const float* rstd,
                                              double* part_a, double* part_b) {
  FERRY_GRID_STRIDE(u, split.chunks * c) {
    const int64_t chunk = u / c, col = u % c;
    const int64_t begin = chunk * split.len;
    const int64_t end = begin + split.len < rows ? begin + split.len : rows;
    double a = 0.0, b = 0.0;
    for (int64_t r = begin; r < end; ++r) {
      const double g = static_cast<double>(as_f32(dy[r * c + col]));
      const double xhat =
          (static_cast<double>(as_f32(x[r * c + col])) - static_cast<double>(mean[r])) *
          static_cast<double>(rstd[r]);
      a += g * xhat;
      b += g;
    }
    part_a[u] = a;
    part_b[u] = b;
  }
}

__global__ void layer_norm_column_totals_kernel(int64_t c, LnSplit split, const double* part_a,
                                                const double* part_b, float* dgamma, float* dbeta) {
  FERRY_GRID_STRIDE(col, c) {
    double a = 0.0, b = 0.0;
    for (int64_t j = 0; j < split.chunks; ++j) {
      a += part_a[j * c + col];
      b += part_b[j * c + col];
    }
    dgamma[col] = static_cast<float>(a);
    dbeta[col] = static_cast<float>(b);
  }
}

// dx = rstd (dxhat - mean(dxhat) - xhat mean(dxhat xhat)), dxhat = dy gamma. Each thread reads
// dy[j] before it writes dx[j], and no thread reads dy after the row's sums: dx may equal dy.
template <typename S>
__global__ void __launch_bounds__(kLnLanes)
    layer_norm_grad_input_kernel(int64_t rows, int64_t c, const S* x, const S* dy,
                                 const float* gamma, const float* mean, const float* rstd, S* dx) {
  __shared__ double lanes_a[kLnLanes];
  __shared__ double lanes_b[kLnLanes];
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const S* xr = x + r * c;
    const S* dyr = dy + r * c;
    const float mf = mean[r], rf = rstd[r];
    for (int l = static_cast<int>(threadIdx.x); l < kLnLanes; l += static_cast<int>(blockDim.x)) {
      double a = 0.0, b = 0.0;
      for (int64_t j = l; j < c; j += kLnLanes) {
        const double dxhat = static_cast<double>(as_f32(dyr[j])) * static_cast<double>(gamma[j]);
        a += dxhat;
        b += dxhat * ((static_cast<double>(as_f32(xr[j])) - mf) * rf);
      }
      lanes_a[l] = a;
      lanes_b[l] = b;
    }
    const double sum_b = lane_total<kLnLanes>(lanes_b);  // syncs the lanes of both
    const double sum_a = lane_total<kLnLanes>(lanes_a);
    const float mean_dxhat = static_cast<float>(sum_a / static_cast<double>(c));
    const float mean_dxhat_xhat = static_cast<float>(sum_b / static_cast<double>(c));
    S* dxr = dx + r * c;
    for (int64_t j = threadIdx.x; j < c; j += blockDim.x) {
      const float xhat = (as_f32(xr[j]) - mf) * rf;
      const float dxhat = as_f32(dyr[j]) * gamma[j];
      dxr[j] = as_storage<S>(rf * (dxhat - mean_dxhat - xhat * mean_dxhat_xhat));
    }
    __syncthreads();  // the row is written before the next row's lanes (dx may alias dy)
  }
}

// ---- GELU (PyTorch's tanh-approximation expressions) -------------------------------------------

constexpr float kGeluBeta = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kGeluKappa = 0.044715f;

template <typename S>
__global__ void gelu_kernel(int64_t n, const S* x, S* y) {
  FERRY_GRID_STRIDE(i, n) {
    const float v = as_f32(x[i]);
    const float inner = kGeluBeta * (v + kGeluKappa * (v * v * v));
    y[i] = as_storage<S>(0.5f * v * (1.0f + tanh(inner)));
  }
}

template <typename S>
__global__ void gelu_grad_kernel(int64_t n, const S* x, const S* dy, S* dx) {
  FERRY_GRID_STRIDE(i, n) {
    const float v = as_f32(x[i]);
    const float v_sq = v * v;
    const float inner = kGeluBeta * (v + kGeluKappa * (v_sq * v));
    const float tanh_inner = tanh(inner);
    const float left = 0.5f * v;
    const float right = 1.0f + tanh_inner;
    const float left_derivative = 0.5f * right;
    const float tanh_derivative = 1.0f - tanh_inner * tanh_inner;
    const float inner_derivative = kGeluBeta * (1.0f + 3.0f * kGeluKappa * v_sq);
    const float right_derivative = left * tanh_derivative * inner_derivative;
    dx[i] = as_storage<S>(as_f32(dy[i]) * (left_derivative + right_derivative));
  }
}

// ---- gradient clipping ----------------------------------------------------------------------

// Chunks of the sum of squares: lane l of kSsqLanes adds values l, l + kSsqLanes, ... of its
// chunk, then a fixed tree; the chunks (a function of n only) are added in order.
constexpr int kSsqLanes = 256;
constexpr int64_t kSsqMinChunk = 16 * kSsqLanes;

struct SsqSplit {
  int64_t chunks = 0, len = 1;
};

SsqSplit ssq_split(int64_t n) {
  SsqSplit s;
  if (n <= 0) return s;
  s.chunks = std::min(kReductionPartials, (n + kSsqMinChunk - 1) / kSsqMinChunk);
  s.len = (n + s.chunks - 1) / s.chunks;
  s.chunks = (n + s.len - 1) / s.len;
  return s;
}

__global__ void __launch_bounds__(kSsqLanes)
    sum_of_squares_chunks_kernel(int64_t n, SsqSplit split, const float* x, double* part) {
  __shared__ double lanes[kSsqLanes];
  for (int64_t u = blockIdx.x; u < split.chunks; u += static_cast<int64_t>(gridDim.x)) {
    const int64_t begin = u * split.len;
    const int64_t end = begin + split.len < n ? begin + split.len : n;
    for (int l = static_cast<int>(threadIdx.x); l < kSsqLanes; l += static_cast<int>(blockDim.x)) {
      double a = 0.0;
      for (int64_t e = begin + l; e < end; e += kSsqLanes) {
        const double v = static_cast<double>(x[e]);
        a += v * v;
      }
      lanes[l] = a;
    }
    __syncthreads();
    for (int half = kSsqLanes / 2; half > 0; half /= 2) {
      for (int l = static_cast<int>(threadIdx.x); l < half; l += static_cast<int>(blockDim.x)) {
        lanes[l] += lanes[l + half];
      }
      __syncthreads();
    }
    if (threadIdx.x == 0) part[u] = lanes[0];
    __syncthreads();  // the lanes are refilled for the next chunk
  }
}

// One thread: the chunks in order (at most kReductionPartials additions).
__global__ void sum_of_squares_total_kernel(SsqSplit split, const double* part, float* out) {
  if (blockIdx.x != 0 || threadIdx.x != 0) return;
  double total = 0.0;
  for (int64_t u = 0; u < split.chunks; ++u) total += part[u];
  out[0] = static_cast<float>(total);
}

// clip_grad_norm_'s float arithmetic; a NaN norm gives a NaN coefficient (clamp keeps NaN).
__global__ void clip_by_norm_kernel(int64_t n, float max_norm, const float* sum_sq, float* y) {
  const float norm = sqrt(sum_sq[0]);
  const float coef = max_norm / (norm + 1e-6f);
  const float scale = coef > 1.0f ? 1.0f : coef;
  FERRY_GRID_STRIDE(i, n) { y[i] *= scale; }
}

}  // namespace

void launch_embedding_forward(int64_t n, int64_t t, int64_t c, const int32_t* tokens,
                              const int32_t* segments, const float* wte, const float* wpe, float* y,
                              DType dtype, cudaStream_t stream) {
  const int64_t total = n * t * c;
  if (total <= 0) return;
  with_storage(dtype, [&](auto tag) {
    using S = typename decltype(tag)::type;
    launch_kernel(embedding_forward_kernel<S>, grid_for(total), kThreads, stream, n * t, t, c,
                  tokens, segments, wte, wpe, stored<S>(y));
  });
}

void launch_embedding_backward(int64_t n, int64_t t, int64_t c, int64_t vocab, int64_t context,
                               const int32_t* tokens, const int32_t* segments, const float* dy,
                               float* dwte, float* dwpe, bool accumulate, DType dtype,
                               cudaStream_t stream) {
  if (!accumulate)
    launch_kernel(zero_kernel, grid_for(vocab * c), kThreads, stream, vocab * c, dwte);
  with_storage(dtype, [&](auto tag) {
    using S = typename decltype(tag)::type;
    const auto owners = static_cast<unsigned int>(std::min<int64_t>(vocab, kMaxBlocks));
    launch_kernel(embedding_table_grad_kernel<S>, owners, kThreads, stream, n * t, c, tokens,
                  static_cast<const int32_t*>(nullptr), t, stored<S>(dy), dwte);
    if (dwpe == nullptr) return;  // no position table (Llama)
    if (segments == nullptr) {
      launch_kernel(embedding_wpe_grad_kernel<S>, grid_for(context * c), kThreads, stream, n, t, c,
                    context, stored<S>(dy), dwpe);
      return;
    }
    // Packed documents: a position's rows are scattered, so dwpe is walked in token order as dwte.
    launch_kernel(zero_kernel, grid_for(context * c), kThreads, stream, context * c, dwpe);
    const auto position_owners = static_cast<unsigned int>(std::min<int64_t>(t, kMaxBlocks));
    launch_kernel(embedding_table_grad_kernel<S>, position_owners, kThreads, stream, n * t, c,
                  tokens, segments, t, stored<S>(dy), dwpe);
  });
}

void launch_layer_norm_forward(int64_t rows, int64_t c, float eps, const float* x,
                               const float* gamma, const float* beta, float* y, float* mean,
                               float* rstd, DType dtype, cudaStream_t stream) {
  const auto blocks = static_cast<unsigned int>(std::min<int64_t>(rows, kMaxBlocks));
  with_storage(dtype, [&](auto tag) {
    using S = typename decltype(tag)::type;
    launch_kernel(layer_norm_forward_kernel<S>, blocks, kLnLanes, stream, rows, c, eps,
                  stored<S>(x), gamma, beta, stored<S>(y), mean, rstd);
  });
}

void launch_layer_norm_backward(int64_t rows, int64_t c, const float* x, const float* dy,
                                const float* gamma, const float* mean, const float* rstd, float* dx,
                                float* dgamma, float* dbeta, DType dtype,
                                const ReductionScratch& scratch, cudaStream_t stream) {
  const LnSplit split = ln_split(rows, c);
  double* part_a = scratch.ptr;
  double* part_b = scratch.ptr + kReductionPartials;
  with_storage(dtype, [&](auto tag) {
    using S = typename decltype(tag)::type;
    // The column sums first: they read dy, which dx may overwrite.
    if (split.chunks > 0) {
      launch_kernel(layer_norm_column_sums_kernel<S>, grid_for(split.chunks * c), kThreads, stream,
                    rows, c, split, stored<S>(x), stored<S>(dy), mean, rstd, part_a, part_b);
    }
    launch_kernel(layer_norm_column_totals_kernel, grid_for(c), kThreads, stream, c, split, part_a,
                  part_b, dgamma, dbeta);
    if (rows == 0) return;
    const auto blocks = static_cast<unsigned int>(std::min<int64_t>(rows, kMaxBlocks));
    launch_kernel(layer_norm_grad_input_kernel<S>, blocks, kLnLanes, stream, rows, c, stored<S>(x),
                  stored<S>(dy), gamma, mean, rstd, stored<S>(dx));
  });
}

void launch_gelu_forward(int64_t n, const float* x, float* y, DType dtype, cudaStream_t stream) {
  if (n <= 0) return;
  with_storage(dtype, [&](auto tag) {
    using S = typename decltype(tag)::type;
    launch_kernel(gelu_kernel<S>, grid_for(n), kThreads, stream, n, stored<S>(x), stored<S>(y));
  });
}

void launch_gelu_backward(int64_t n, const float* x, const float* dy, float* dx, DType dtype,
                          cudaStream_t stream) {
  if (n <= 0) return;
  with_storage(dtype, [&](auto tag) {
    using S = typename decltype(tag)::type;
    launch_kernel(gelu_grad_kernel<S>, grid_for(n), kThreads, stream, n, stored<S>(x),
                  stored<S>(dy), stored<S>(dx));
  });
}

void launch_sum_of_squares(int64_t n, const float* x, float* out, const ReductionScratch& scratch,
                           cudaStream_t stream) {
  const SsqSplit split = ssq_split(n);
  if (split.chunks > 0) {
    const auto blocks = static_cast<unsigned int>(
        std::max<int64_t>(1, std::min<int64_t>(split.chunks, 4 * std::max(scratch.sm_count, 1))));
    launch_kernel(sum_of_squares_chunks_kernel, blocks, kSsqLanes, stream, n, split, x,
                  scratch.ptr);
  }
  launch_kernel(sum_of_squares_total_kernel, 1, 1, stream, split, scratch.ptr, out);
}

void launch_clip_by_norm(int64_t n, float max_norm, const float* sum_sq, float* y,
                         cudaStream_t stream) {
  if (n <= 0) return;
  launch_kernel(clip_by_norm_kernel, grid_for(n), kThreads, stream, n, max_norm, sum_sq, y);
}

}  // namespace ferry::cuda
