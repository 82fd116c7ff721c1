// The Llama family's kernels: RMSNorm, rotary embeddings into the attention core's qkv (grouped
// KV heads repeated), SwiGLU. No float atomics: each output is written by one thread in an order
// fixed by the shape, so the bits are the same on every run, for every grid, and in the host
// emulation.
#include <algorithm>

#include "device/cuda/lane_total.cuh"
#include "device/cuda/launch.cuh"
#include "device/cuda/llama_ops.h"

namespace ferry::cuda {
namespace {

// ---- RMSNorm ---------------------------------------------------------------------------------

constexpr int kRmsLanes = 32;
constexpr int64_t kRmsMinChunkRows = 16;

__global__ void __launch_bounds__(kRmsLanes)
    rms_norm_forward_kernel(int64_t rows, int64_t c, float eps, const float* x, const float* w,
                            float* y, float* rstd_out) {
  __shared__ double rms_lanes[kRmsLanes];
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const float* xr = x + r * c;
    for (int l = static_cast<int>(threadIdx.x); l < kRmsLanes; l += static_cast<int>(blockDim.x)) {
      double a = 0.0;
      for (int64_t j = l; j < c; j += kRmsLanes) {
        const double v = static_cast<double>(xr[j]);
        a += v * v;
      }
      rms_lanes[l] = a;
    }
    const double ms = lane_total<kRmsLanes>(rms_lanes) / static_cast<double>(c);
    const float rf = static_cast<float>(1.0 / sqrt(ms + static_cast<double>(eps)));
    float* yr = y + r * c;
    for (int64_t j = threadIdx.x; j < c; j += blockDim.x) yr[j] = (xr[j] * rf) * w[j];
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
__global__ void rms_norm_column_sums_kernel(int64_t rows, int64_t c, RmsSplit split, const float* x,
                                            const float* dy, const float* rstd, double* part) {
  FERRY_GRID_STRIDE(u, split.chunks * c) {
    const int64_t chunk = u / c, col = u % c;
    const int64_t begin = chunk * split.len;
    const int64_t end = begin + split.len < rows ? begin + split.len : rows;
    double a = 0.0;
    for (int64_t r = begin; r < end; ++r) {
      a += static_cast<double>(dy[r * c + col]) *
           (static_cast<double>(x[r * c + col]) * static_cast<double>(rstd[r]));
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
__global__ void __launch_bounds__(kRmsLanes)
    rms_norm_grad_input_kernel(int64_t rows, int64_t c, const float* x, const float* dy,
                               const float* w, const float* rstd, float* dx) {
  __shared__ double rms_grad_lanes[kRmsLanes];
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const float* xr = x + r * c;
    const float* dyr = dy + r * c;
    const float rf = rstd[r];
    for (int l = static_cast<int>(threadIdx.x); l < kRmsLanes; l += static_cast<int>(blockDim.x)) {
      double a = 0.0;
      for (int64_t j = l; j < c; j += kRmsLanes) {
        a += static_cast<double>(dyr[j]) * static_cast<double>(w[j]) *
             (static_cast<double>(xr[j]) * static_cast<double>(rf));
      }
      rms_grad_lanes[l] = a;
    }
    const float mgx =
        static_cast<float>(lane_total<kRmsLanes>(rms_grad_lanes) / static_cast<double>(c));
    float* dxr = dx + r * c;
    for (int64_t j = threadIdx.x; j < c; j += blockDim.x) {
      const float xhat = xr[j] * rf;
      dxr[j] = rf * (dyr[j] * w[j] - xhat * mgx);
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
__global__ void rope_qkv_forward_kernel(int64_t rows, int64_t t, int64_t heads, int64_t kv_heads,
                                        int64_t d, float theta, const float* q, const float* k,
                                        const float* v, const int32_t* segments, float* qkv) {
  const int64_t half = d / 2, qw = heads * d, kvw = kv_heads * d, rep = heads / kv_heads;
  FERRY_GRID_STRIDE(u, rows * heads * half) {
    const int64_t i = u % half, h = (u / half) % heads, r = u / (half * heads);
    float c, s;
    rope_cos_sin(rope_position(segments, r, t), i, d, theta, &c, &s);
    const float* qs = q + r * qw + h * d;
    const float* ks = k + r * kvw + (h / rep) * d;
    const float* vs = v + r * kvw + (h / rep) * d;
    float* out = qkv + r * 3 * qw + h * d;
    out[i] = qs[i] * c - qs[i + half] * s;
    out[i + half] = qs[i + half] * c + qs[i] * s;
    out[qw + i] = ks[i] * c - ks[i + half] * s;
    out[qw + i + half] = ks[i + half] * c + ks[i] * s;
    out[2 * qw + i] = vs[i];
    out[2 * qw + i + half] = vs[i + half];
  }
}

__global__ void rope_q_backward_kernel(int64_t rows, int64_t t, int64_t heads, int64_t d,
                                       float theta, const float* dqkv, const int32_t* segments,
                                       float* dq) {
  const int64_t half = d / 2, qw = heads * d;
  FERRY_GRID_STRIDE(u, rows * heads * half) {
    const int64_t i = u % half, h = (u / half) % heads, r = u / (half * heads);
    float c, s;
    rope_cos_sin(rope_position(segments, r, t), i, d, theta, &c, &s);
    const float* g = dqkv + r * 3 * qw + h * d;
    dq[r * qw + h * d + i] = g[i] * c + g[i + half] * s;
    dq[r * qw + h * d + i + half] = g[i + half] * c - g[i] * s;
  }
}

// One thread per (row, KV head, pair): the repeats summed in head order, then rotated back (k).
__global__ void rope_kv_backward_kernel(int64_t rows, int64_t t, int64_t heads, int64_t kv_heads,
                                        int64_t d, float theta, const float* dqkv,
                                        const int32_t* segments, float* dk, float* dv) {
  const int64_t half = d / 2, qw = heads * d, kvw = kv_heads * d, rep = heads / kv_heads;
  FERRY_GRID_STRIDE(u, rows * kv_heads * half) {
    const int64_t i = u % half, kv = (u / half) % kv_heads, r = u / (half * kv_heads);
    const float* gk = dqkv + r * 3 * qw + qw + kv * rep * d;
    const float* gv = gk + qw;
    float a = gk[i], b = gk[i + half], va = gv[i], vb = gv[i + half];
    for (int64_t j = 1; j < rep; ++j) {
      a += gk[j * d + i];
      b += gk[j * d + i + half];
      va += gv[j * d + i];
      vb += gv[j * d + i + half];
    }
    if (dk != nullptr) {
      float c, s;
      rope_cos_sin(rope_position(segments, r, t), i, d, theta, &c, &s);
      dk[r * kvw + kv * d + i] = a * c + b * s;
      dk[r * kvw + kv * d + i + half] = b * c - a * s;
    }
    if (dv != nullptr) {
      dv[r * kvw + kv * d + i] = va;
      dv[r * kvw + kv * d + i + half] = vb;
    }
  }
}

// ---- SwiGLU ----------------------------------------------------------------------------------

__global__ void swiglu_kernel(int64_t n, const float* gate, const float* up, float* y) {
  FERRY_GRID_STRIDE(i, n) { y[i] = gate[i] / (1.0f + exp(-gate[i])) * up[i]; }
}

__global__ void swiglu_grad_kernel(int64_t n, const float* gate, const float* up, const float* dy,
                                   float* dgate, float* dup) {
  FERRY_GRID_STRIDE(i, n) {
    const float d = dy[i], g = gate[i];
    const float sig = 1.0f / (1.0f + exp(-g));
    dup[i] = d * (g * sig);
    dgate[i] = d * up[i] * (sig * (1.0f + g * (1.0f - sig)));
  }
}

}  // namespace

void launch_rms_norm_forward(int64_t rows, int64_t c, float eps, const float* x, const float* w,
                             float* y, float* rstd, cudaStream_t stream) {
  if (rows <= 0) return;
  const auto blocks = static_cast<unsigned int>(std::min<int64_t>(rows, kMaxBlocks));
  launch_kernel(rms_norm_forward_kernel, blocks, kRmsLanes, stream, rows, c, eps, x, w, y, rstd);
}

void launch_rms_norm_backward(int64_t rows, int64_t c, const float* x, const float* dy,
                              const float* w, const float* rstd, float* dx, float* dw,
                              const ReductionScratch& scratch, cudaStream_t stream) {
  const RmsSplit split = rms_split(rows, c);
  if (split.chunks > 0) {
    launch_kernel(rms_norm_column_sums_kernel, grid_for(split.chunks * c), kThreads, stream, rows,
                  c, split, x, dy, rstd, scratch.ptr);
  }
  launch_kernel(rms_norm_column_totals_kernel, grid_for(c), kThreads, stream, c, split,
                static_cast<const double*>(scratch.ptr), dw);
  if (rows <= 0) return;
  const auto blocks = static_cast<unsigned int>(std::min<int64_t>(rows, kMaxBlocks));
  launch_kernel(rms_norm_grad_input_kernel, blocks, kRmsLanes, stream, rows, c, x, dy, w, rstd, dx);
}

void launch_rope_qkv_forward(int64_t n, int64_t t, int64_t heads, int64_t kv_heads,
                             int64_t head_dim, float theta, const float* q, const float* k,
                             const float* v, const int32_t* segments, float* qkv,
                             cudaStream_t stream) {
  const int64_t count = n * t * heads * (head_dim / 2);
  if (count <= 0) return;
  launch_kernel(rope_qkv_forward_kernel, grid_for(count), kThreads, stream, n * t, t, heads,
                kv_heads, head_dim, theta, q, k, v, segments, qkv);
}

void launch_rope_qkv_backward(int64_t n, int64_t t, int64_t heads, int64_t kv_heads,
                              int64_t head_dim, float theta, const float* dqkv,
                              const int32_t* segments, float* dq, float* dk, float* dv,
                              cudaStream_t stream) {
  const int64_t half = head_dim / 2;
  if (n * t * half <= 0) return;
  if (dq != nullptr) {
    launch_kernel(rope_q_backward_kernel, grid_for(n * t * heads * half), kThreads, stream, n * t,
                  t, heads, head_dim, theta, dqkv, segments, dq);
  }
  if (dk != nullptr || dv != nullptr) {
    launch_kernel(rope_kv_backward_kernel, grid_for(n * t * kv_heads * half), kThreads, stream,
                  n * t, t, heads, kv_heads, head_dim, theta, dqkv, segments, dk, dv);
  }
}

void launch_swiglu_forward(int64_t n, const float* gate, const float* up, float* y,
                           cudaStream_t stream) {
  if (n <= 0) return;
  launch_kernel(swiglu_kernel, grid_for(n), kThreads, stream, n, gate, up, y);
}

void launch_swiglu_backward(int64_t n, const float* gate, const float* up, const float* dy,
                            float* dgate, float* dup, cudaStream_t stream) {
  if (n <= 0) return;
  launch_kernel(swiglu_grad_kernel, grid_for(n), kThreads, stream, n, gate, up, dy, dgate, dup);
}

}  // namespace ferry::cuda
