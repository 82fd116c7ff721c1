// The Llama family's kernels: RMSNorm, rotary embeddings into the attention core's qkv (grouped
// KV heads repeated), SwiGLU. No float atomics: each output is written by one thread in an order
// fixed by the shape, so the bits are the same on every run, for every grid, and in the host
// emulation. Activations and their gradients in fp32 or bf16 storage; RMSNorm's weight, rstd and
// weight gradient fp32 (Note [bf16 storage in the CUDA kernels] in storage.cuh).
#include <algorithm>

#include "device/cuda/lane_total.cuh"
#include "device/cuda/launch.cuh"
#include "device/cuda/llama_ops.h"
#include "device/cuda/storage.cuh"

namespace ferry::cuda {
namespace {

// ---- RMSNorm ---------------------------------------------------------------------------------

constexpr int kRmsLanes = 32;
constexpr int64_t kRmsMinChunkRows = 16;

template <typename S>
__global__ void __launch_bounds__(kRmsLanes)
    rms_norm_forward_kernel(int64_t rows, int64_t c, float eps, const S* x, const float* w, S* y,
                            float* rstd_out) {
  __shared__ double rms_lanes[kRmsLanes];
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const S* xr = x + r * c;
    for (int l = static_cast<int>(threadIdx.x); l < kRmsLanes; l += static_cast<int>(blockDim.x)) {
      double a = 0.0;
      for (int64_t j = l; j < c; j += kRmsLanes) {
        const double v = static_cast<double>(as_f32(xr[j]));
        a += v * v;
      }
      rms_lanes[l] = a;
    }
    const double ms = lane_total<kRmsLanes>(rms_lanes) / static_cast<double>(c);
    const float rf = static_cast<float>(1.0 / sqrt(ms + static_cast<double>(eps)));
    S* yr = y + r * c;
    for (int64_t j = threadIdx.x; j < c; j += blockDim.x)
      yr[j] = as_storage<S>((as_f32(xr[j]) * rf) * w[j]);
    if (threadIdx.x == 0) rstd_out[r] = rf;
  }
}

struct RmsSplit {
  int64_t chunks = 1, len = 1;
};

RmsSplit rms_split(int64_t rows, int64_t c) {
  RmsSplit s;
  if (rows <= 0) return {0, 1};
  const int64_t most = std::max<int64_t>(1, kReductionPartials / c);
  s.chunks = std::max<int64_t>(1, std::min(most, (rows + kRmsMinChunkRows - 1) / kRmsMinChunkRows));
  s.len = (rows + s.chunks - 1) / s.chunks;
  s.chunks = (rows + s.len - 1) / s.len;
  return s;
}

// Partial (chunk, column) sums of dy * xhat, slot chunk * c + column; rows in increasing order.
template <typename S>
__global__ void rms_norm_column_sums_kernel(int64_t rows, int64_t c, RmsSplit split, const S* x,
                                            const S* dy, const float* rstd, double* part) {
  FERRY_GRID_STRIDE(u, split.chunks * c) {
    const int64_t chunk = u / c, col = u % c;
    const int64_t begin = chunk * split.len;
    const int64_t end = begin + split.len < rows ? begin + split.len : rows;
    double a = 0.0;
    for (int64_t r = begin; r < end; ++r) {
      a += static_cast<double>(as_f32(dy[r * c + col])) *
           (static_cast<double>(as_f32(x[r * c + col])) * static_cast<double>(rstd[r]));
    }
    part[u] = a;
  }
}

__global__ void rms_norm_column_totals_kernel(int64_t c, RmsSplit split, const double* part,
                                              float* dw) {
  FERRY_GRID_STRIDE(col, c) {
    double a = 0.0;
    for (int64_t j = 0; j < split.chunks; ++j) a += part[j * c + col];
    dw[col] = static_cast<float>(a);
  }
}

// dx = rstd (g - xhat mean(g xhat)), g = dy w. Each thread reads dy[j] before it writes dx[j],
// and no thread reads dy after the row's sum: dx may equal dy.
template <typename S>
__global__ void __launch_bounds__(kRmsLanes)
    rms_norm_grad_input_kernel(int64_t rows, int64_t c, const S* x, const S* dy, const float* w,
                               const float* rstd, S* dx) {
  __shared__ double rms_grad_lanes[kRmsLanes];
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const S* xr = x + r * c;
    const S* dyr = dy + r * c;
    const float rf = rstd[r];
    for (int l = static_cast<int>(threadIdx.x); l < kRmsLanes; l += static_cast<int>(blockDim.x)) {
      double a = 0.0;
      for (int64_t j = l; j < c; j += kRmsLanes) {
        a += static_cast<double>(as_f32(dyr[j])) * static_cast<double>(w[j]) *
             (static_cast<double>(as_f32(xr[j])) * static_cast<double>(rf));
      }
      rms_grad_lanes[l] = a;
    }
    const float mgx =
        static_cast<float>(lane_total<kRmsLanes>(rms_grad_lanes) / static_cast<double>(c));
    S* dxr = dx + r * c;
    for (int64_t j = threadIdx.x; j < c; j += blockDim.x) {
      const float xhat = as_f32(xr[j]) * rf;
      dxr[j] = as_storage<S>(rf * (as_f32(dyr[j]) * w[j] - xhat * mgx));
    }
  }
}

// ---- rotary embeddings -----------------------------------------------------------------------

// cos and sin of frequency i at position p, as the CPU's table: HF's float32 inverse frequency
// and float32 angle, the trigonometry in double.
__device__ void rope_cos_sin(int64_t p, int64_t i, int64_t d, float theta, float* c, float* s) {
  const float e = static_cast<float>(2 * i) / static_cast<float>(d);
  const float inv =
      1.0f / static_cast<float>(pow(static_cast<double>(theta), static_cast<double>(e)));
  const double angle = static_cast<double>(static_cast<float>(p) * inv);
  *c = static_cast<float>(cos(angle));
  *s = static_cast<float>(sin(angle));
}

__device__ int64_t rope_position(const int32_t* segments, int64_t row, int64_t t) {
  return segments == nullptr ? row % t : row % t - segments[row];
}

// One thread per (row, head, pair i < D/2): q and k of the head rotated, v's two columns copied.
template <typename S>
__global__ void rope_qkv_forward_kernel(int64_t rows, int64_t t, int64_t heads, int64_t kv_heads,
                                        int64_t d, float theta, const S* q, const S* k, const S* v,
                                        const int32_t* segments, S* qkv) {
  const int64_t half = d / 2, qw = heads * d, kvw = kv_heads * d, rep = heads / kv_heads;
  FERRY_GRID_STRIDE(u, rows * heads * half) {
    const int64_t i = u % half, h = (u / half) % heads, r = u / (half * heads);
    float c, s;
    rope_cos_sin(rope_position(segments, r, t), i, d, theta, &c, &s);
    const S* qs = q + r * qw + h * d;
    const S* ks = k + r * kvw + (h / rep) * d;
    const S* vs = v + r * kvw + (h / rep) * d;
    S* out = qkv + r * 3 * qw + h * d;
    const float q0 = as_f32(qs[i]), q1 = as_f32(qs[i + half]);
    const float k0 = as_f32(ks[i]), k1 = as_f32(ks[i + half]);
    out[i] = as_storage<S>(q0 * c - q1 * s);
    out[i + half] = as_storage<S>(q1 * c + q0 * s);
    out[qw + i] = as_storage<S>(k0 * c - k1 * s);
    out[qw + i + half] = as_storage<S>(k1 * c + k0 * s);
    out[2 * qw + i] = vs[i];  // a copy: the same bits in either storage
    out[2 * qw + i + half] = vs[i + half];
  }
}

template <typename S>
__global__ void rope_q_backward_kernel(int64_t rows, int64_t t, int64_t heads, int64_t d,
                                       float theta, const S* dqkv, const int32_t* segments, S* dq) {
  const int64_t half = d / 2, qw = heads * d;
  FERRY_GRID_STRIDE(u, rows * heads * half) {
    const int64_t i = u % half, h = (u / half) % heads, r = u / (half * heads);
    float c, s;
    rope_cos_sin(rope_position(segments, r, t), i, d, theta, &c, &s);
    const S* g = dqkv + r * 3 * qw + h * d;
    const float g0 = as_f32(g[i]), g1 = as_f32(g[i + half]);
    dq[r * qw + h * d + i] = as_storage<S>(g0 * c + g1 * s);
    dq[r * qw + h * d + i + half] = as_storage<S>(g1 * c - g0 * s);
  }
}

// One thread per (row, KV head, pair): the repeats summed in head order, then rotated back (k).
template <typename S>
__global__ void rope_kv_backward_kernel(int64_t rows, int64_t t, int64_t heads, int64_t kv_heads,
                                        int64_t d, float theta, const S* dqkv,
                                        const int32_t* segments, S* dk, S* dv) {
  const int64_t half = d / 2, qw = heads * d, kvw = kv_heads * d, rep = heads / kv_heads;
  FERRY_GRID_STRIDE(u, rows * kv_heads * half) {
    const int64_t i = u % half, kv = (u / half) % kv_heads, r = u / (half * kv_heads);
    const S* gk = dqkv + r * 3 * qw + qw + kv * rep * d;
    const S* gv = gk + qw;
    float a = as_f32(gk[i]), b = as_f32(gk[i + half]), va = as_f32(gv[i]),
          vb = as_f32(gv[i + half]);
    for (int64_t j = 1; j < rep; ++j) {
      a += as_f32(gk[j * d + i]);
      b += as_f32(gk[j * d + i + half]);
      va += as_f32(gv[j * d + i]);
      vb += as_f32(gv[j * d + i + half]);
    }
    if (dk != nullptr) {
      float c, s;
      rope_cos_sin(rope_position(segments, r, t), i, d, theta, &c, &s);
      dk[r * kvw + kv * d + i] = as_storage<S>(a * c + b * s);
      dk[r * kvw + kv * d + i + half] = as_storage<S>(b * c - a * s);
    }
    if (dv != nullptr) {
      dv[r * kvw + kv * d + i] = as_storage<S>(va);
      dv[r * kvw + kv * d + i + half] = as_storage<S>(vb);
    }
  }
}

// ---- SwiGLU ----------------------------------------------------------------------------------

template <typename S>
__global__ void swiglu_kernel(int64_t n, const S* gate, const S* up, S* y) {
  FERRY_GRID_STRIDE(i, n) {
    const float g = as_f32(gate[i]);
    y[i] = as_storage<S>(g / (1.0f + exp(-g)) * as_f32(up[i]));
  }
}

template <typename S>
__global__ void swiglu_grad_kernel(int64_t n, const S* gate, const S* up, const S* dy, S* dgate,
                                   S* dup) {
  FERRY_GRID_STRIDE(i, n) {
    const float d = as_f32(dy[i]), g = as_f32(gate[i]);
    const float sig = 1.0f / (1.0f + exp(-g));
    dup[i] = as_storage<S>(d * (g * sig));
    dgate[i] = as_storage<S>(d * as_f32(up[i]) * (sig * (1.0f + g * (1.0f - sig))));
  }
}

}  // namespace

void launch_rms_norm_forward(int64_t rows, int64_t c, float eps, const float* x, const float* w,
                             float* y, float* rstd, DType dtype, cudaStream_t stream) {
  if (rows <= 0) return;
  const auto blocks = static_cast<unsigned int>(std::min<int64_t>(rows, kMaxBlocks));
  with_storage(dtype, [&](auto tag) {
    using S = typename decltype(tag)::type;
    launch_kernel(rms_norm_forward_kernel<S>, blocks, kRmsLanes, stream, rows, c, eps, stored<S>(x),
                  w, stored<S>(y), rstd);
  });
}

void launch_rms_norm_backward(int64_t rows, int64_t c, const float* x, const float* dy,
                              const float* w, const float* rstd, float* dx, float* dw, DType dtype,
                              const ReductionScratch& scratch, cudaStream_t stream) {
  const RmsSplit split = rms_split(rows, c);
  with_storage(dtype, [&](auto tag) {
    using S = typename decltype(tag)::type;
    // The column sums first: they read dy, which dx may overwrite.
    if (split.chunks > 0) {
      launch_kernel(rms_norm_column_sums_kernel<S>, grid_for(split.chunks * c), kThreads, stream,
                    rows, c, split, stored<S>(x), stored<S>(dy), rstd, scratch.ptr);
    }
    launch_kernel(rms_norm_column_totals_kernel, grid_for(c), kThreads, stream, c, split,
                  static_cast<const double*>(scratch.ptr), dw);
    if (rows <= 0) return;
    const auto blocks = static_cast<unsigned int>(std::min<int64_t>(rows, kMaxBlocks));
    launch_kernel(rms_norm_grad_input_kernel<S>, blocks, kRmsLanes, stream, rows, c, stored<S>(x),
                  stored<S>(dy), w, rstd, stored<S>(dx));
  });
}

void launch_rope_qkv_forward(int64_t n, int64_t t, int64_t heads, int64_t kv_heads,
                             int64_t head_dim, float theta, const float* q, const float* k,
                             const float* v, const int32_t* segments, float* qkv, DType dtype,
                             cudaStream_t stream) {
  const int64_t count = n * t * heads * (head_dim / 2);
  if (count <= 0) return;
  with_storage(dtype, [&](auto tag) {
    using S = typename decltype(tag)::type;
    launch_kernel(rope_qkv_forward_kernel<S>, grid_for(count), kThreads, stream, n * t, t, heads,
                  kv_heads, head_dim, theta, stored<S>(q), stored<S>(k), stored<S>(v), segments,
                  stored<S>(qkv));
  });
}

void launch_rope_qkv_backward(int64_t n, int64_t t, int64_t heads, int64_t kv_heads,
                              int64_t head_dim, float theta, const float* dqkv,
                              const int32_t* segments, float* dq, float* dk, float* dv, DType dtype,
                              cudaStream_t stream) {
  const int64_t half = head_dim / 2;
  if (n * t * half <= 0) return;
  with_storage(dtype, [&](auto tag) {
    using S = typename decltype(tag)::type;
    if (dq != nullptr) {
      launch_kernel(rope_q_backward_kernel<S>, grid_for(n * t * heads * half), kThreads, stream,
                    n * t, t, heads, head_dim, theta, stored<S>(dqkv), segments, stored<S>(dq));
    }
    if (dk != nullptr || dv != nullptr) {
      launch_kernel(rope_kv_backward_kernel<S>, grid_for(n * t * kv_heads * half), kThreads, stream,
                    n * t, t, heads, kv_heads, head_dim, theta, stored<S>(dqkv), segments,
                    stored<S>(dk), stored<S>(dv));
    }
  });
}

void launch_swiglu_forward(int64_t n, const float* gate, const float* up, float* y, DType dtype,
                           cudaStream_t stream) {
  if (n <= 0) return;
  with_storage(dtype, [&](auto tag) {
    using S = typename decltype(tag)::type;
    launch_kernel(swiglu_kernel<S>, grid_for(n), kThreads, stream, n, stored<S>(gate),
                  stored<S>(up), stored<S>(y));
  });
}

void launch_swiglu_backward(int64_t n, const float* gate, const float* up, const float* dy,
                            float* dgate, float* dup, DType dtype, cudaStream_t stream) {
  if (n <= 0) return;
  with_storage(dtype, [&](auto tag) {
    using S = typename decltype(tag)::type;
    launch_kernel(swiglu_grad_kernel<S>, grid_for(n), kThreads, stream, n, stored<S>(gate),
                  stored<S>(up), stored<S>(dy), stored<S>(dgate), stored<S>(dup));
  });
}

}  // namespace ferry::cuda
