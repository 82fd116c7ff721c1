// The fused attention core on CUDA (Note [Fused attention] in device/kernels.h): tiles of kTile
// queries by kTile keys in shared memory, an online softmax in the forward, and a backward in
// two passes (dK and dV per key tile, then dq per query tile) that recompute the probabilities
// from q, k, lse. Every output element is written by one block in a fixed order: no atomics, the
// same bits for every grid.
#include <algorithm>
#include <cmath>

#include "device/counter_rng.h"
#include "device/cuda/launch.cuh"
#include "device/cuda/transformer_ops.h"

namespace ferry::cuda {
namespace {

constexpr int kFlashThreads = 128;

// The shapes and per-call scalars every kernel reads.
struct FlashGeom {
  int64_t n, t, heads, c;
  float sqrt_d;   // sqrt(D), as the CPU kernels divide by it
  float dropout;  // p; 0 = no dropout
  uint64_t seed;
  const int32_t* segments;  // (N, T) or null
};

__device__ int64_t key_begin(const FlashGeom& g, int64_t bn, int64_t i) {
  return g.segments == nullptr ? 0 : g.segments[bn * g.t + i];
}

// The least segment start of queries [i0, i1) of batch row bn (the same on every thread).
__device__ int64_t tile_first_key(const FlashGeom& g, int64_t bn, int64_t i0, int64_t i1) {
  int64_t lo = i0;
  for (int64_t i = i0; i < i1; ++i) lo = min(lo, key_begin(g, bn, i));
  return lo;
}

// Whether the dropout keeps score (i, j) of head (bn, h): the naive core's draw over the
// (N, heads, T, T) elements; always without dropout.
__device__ bool kept(const FlashGeom& g, int64_t bn, int64_t h, int64_t i, int64_t j) {
  if (g.dropout <= 0.0f) return true;
  const uint64_t at = static_cast<uint64_t>(((bn * g.heads + h) * g.t + i) * g.t + j);
  return counter_uniform(g.seed, at) >= g.dropout;
}

// Loads rows [r0, r0 + rows) of x (row stride ld, D wide) into a (kTile, kMaxD) tile, zero past
// `rows`.
template <int kTile, int kMaxD>
__device__ void load_tile(const float* x, int64_t ld, int64_t r0, int64_t rows, int64_t d,
                          float* tile) {
  for (int64_t e = threadIdx.x; e < kTile * d; e += blockDim.x) {
    const int64_t r = e / d, k = e % d;
    tile[r * kMaxD + k] = r < rows ? x[(r0 + r) * ld + k] : 0.0f;
  }
}

template <int kMaxD>
__device__ float dot_rows(const float* a, const float* b, int64_t d) {
  float acc = 0.0f;
  for (int64_t e = 0; e < d; ++e) acc += a[e] * b[e];
  return acc;
}

template <int kTile, int kMaxD>
__global__ void __launch_bounds__(kFlashThreads)
    flash_forward_kernel(FlashGeom g, const float* qkv, float* y, float* lse) {
  __shared__ float q_s[kTile * kMaxD], k_s[kTile * kMaxD], v_s[kTile * kMaxD];
  __shared__ float s_s[kTile * kTile], m_s[kTile], l_s[kTile], alpha_s[kTile];
  const float neg_inf = -__int_as_float(0x7f800000);
  const int64_t d = g.c / g.heads, ld = 3 * g.c, blocks = (g.t + kTile - 1) / kTile;
  for (int64_t tile = blockIdx.x; tile < g.n * g.heads * blocks; tile += gridDim.x) {
    const int64_t b = tile % blocks, bn = tile / blocks / g.heads, h = tile / blocks % g.heads;
    const int64_t i0 = b * kTile, i1 = min(g.t, i0 + kTile), rows = i1 - i0;
    const float* q = qkv + bn * g.t * ld + h * d;
    float* out = y == nullptr ? nullptr : y + bn * g.t * g.c + h * d;  // row i at i * C
    load_tile<kTile, kMaxD>(q, ld, i0, rows, d, q_s);
    for (int64_t e = threadIdx.x; e < rows * d; e += blockDim.x) {
      if (out != nullptr) out[(i0 + e / d) * g.c + e % d] = 0.0f;
    }
    for (int64_t r = threadIdx.x; r < kTile; r += blockDim.x) {
      m_s[r] = neg_inf;
      l_s[r] = 0.0f;
    }
    const int64_t first = tile_first_key(g, bn, i0, i1);
    __syncthreads();
    for (int64_t j0 = first / kTile * kTile; j0 < i1; j0 += kTile) {
      const int64_t cols = min(g.t, j0 + kTile) - j0;
      load_tile<kTile, kMaxD>(q + g.c, ld, j0, cols, d, k_s);
      load_tile<kTile, kMaxD>(q + 2 * g.c, ld, j0, cols, d, v_s);
      __syncthreads();
      for (int64_t e = threadIdx.x; e < kTile * kTile; e += blockDim.x) {
        s_s[e] =
            dot_rows<kMaxD>(q_s + (e / kTile) * kMaxD, k_s + (e % kTile) * kMaxD, d) / g.sqrt_d;
      }
      __syncthreads();
      for (int64_t r = threadIdx.x; r < rows; r += blockDim.x) {
        const int64_t i = i0 + r;
        const int64_t lo = min(max(key_begin(g, bn, i), j0), j0 + cols) - j0;
        const int64_t hi = max(lo, min(i + 1, j0 + cols) - j0);
        float* row = s_s + r * kTile;
        float top = m_s[r];
        for (int64_t j = lo; j < hi; ++j) top = row[j] > top ? row[j] : top;
        float alpha = 1.0f, sum = 0.0f;
        if (hi > lo) alpha = m_s[r] == neg_inf ? 0.0f : exp(m_s[r] - top);
        for (int64_t j = 0; j < kTile; ++j) {
          const float pj = lo <= j && j < hi ? exp(row[j] - top) : 0.0f;
          sum += pj;
          if (g.dropout > 0.0f && pj != 0.0f) {
            row[j] = kept(g, bn, h, i, j0 + j) ? pj / (1.0f - g.dropout) : 0.0f;
          } else {
            row[j] = pj;
          }
        }
        if (hi > lo) {
          l_s[r] = l_s[r] * alpha + sum;
          m_s[r] = top;
        }
        alpha_s[r] = alpha;
      }
      __syncthreads();
      for (int64_t e = threadIdx.x; out != nullptr && e < rows * d; e += blockDim.x) {
        const int64_t r = e / d, k = e % d;
        float* o = out + (i0 + r) * g.c + k;
        float acc = *o * alpha_s[r];
        for (int64_t j = 0; j < cols; ++j) acc += s_s[r * kTile + j] * v_s[j * kMaxD + k];
        *o = acc;
      }
      __syncthreads();
    }
    for (int64_t e = threadIdx.x; out != nullptr && e < rows * d; e += blockDim.x) {
      out[(i0 + e / d) * g.c + e % d] *= 1.0f / l_s[e / d];
    }
    for (int64_t r = threadIdx.x; lse != nullptr && r < rows; r += blockDim.x) {
      lse[(bn * g.heads + h) * g.t + i0 + r] = m_s[r] + log(l_s[r]);
    }
    __syncthreads();
  }
}

// The backward's per-query-tile state: q and dy rows, each row's lse and D = dy . y.
template <int kTile, int kMaxD>
__device__ void load_queries(const FlashGeom& g, const float* q, const float* dy, const float* y,
                             const float* lse, int64_t i0, int64_t rows, int64_t d, float* q_s,
                             float* dy_s, float* lse_s, float* dot_s) {
  load_tile<kTile, kMaxD>(q, 3 * g.c, i0, rows, d, q_s);
  load_tile<kTile, kMaxD>(dy, g.c, i0, rows, d, dy_s);
  for (int64_t r = threadIdx.x; r < rows; r += blockDim.x) {
    double acc = 0.0;
    for (int64_t e = 0; e < d; ++e) {
      acc += static_cast<double>(dy[(i0 + r) * g.c + e] * y[(i0 + r) * g.c + e]);
    }
    dot_s[r] = static_cast<float>(acc);
    lse_s[r] = lse[i0 + r];
  }
}

// dS (and P' when p_s is not null) of a (query tile, key tile): P = exp(S - lse), P' and dP the
// dropout's (kept ? x / keep : 0) of P and dy v^T, dS = P (dP - D) / sqrt(D); 0 where the query
// does not see the key.
template <int kTile, int kMaxD>
__device__ void tile_grads(const FlashGeom& g, int64_t bn, int64_t h, int64_t i0, int64_t rows,
                           int64_t j0, int64_t cols, int64_t d, const float* q_s, const float* dy_s,
                           const float* k_s, const float* v_s, const float* lse_s,
                           const float* dot_s, float* p_s, float* ds_s) {
  for (int64_t e = threadIdx.x; e < kTile * kTile; e += blockDim.x) {
    const int64_t r = e / kTile, j = e % kTile, i = i0 + r;
    float p = 0.0f, ds = 0.0f;
    if (r < rows && j < cols && j0 + j <= i && j0 + j >= key_begin(g, bn, i)) {
      const float s = dot_rows<kMaxD>(q_s + r * kMaxD, k_s + j * kMaxD, d) / g.sqrt_d;
      const float pj = exp(s - lse_s[r]);
      float dp = dot_rows<kMaxD>(dy_s + r * kMaxD, v_s + j * kMaxD, d);
      p = pj;
      if (g.dropout > 0.0f) {
        const bool k = kept(g, bn, h, i, j0 + j);
        p = k ? pj / (1.0f - g.dropout) : 0.0f;
        dp = k ? dp / (1.0f - g.dropout) : 0.0f;
      }
      ds = pj * (dp - dot_s[r]) / g.sqrt_d;
    }
    if (p_s != nullptr) p_s[e] = p;
    ds_s[e] = ds;
  }
}

// dK and dV of key tiles: one block per key tile, query tiles in increasing order.
template <int kTile, int kMaxD>
__global__ void __launch_bounds__(kFlashThreads)
    flash_backward_kv_kernel(FlashGeom g, const float* qkv, const float* y, const float* lse,
                             const float* dy, float* dqkv) {
  __shared__ float q_s[kTile * kMaxD], dy_s[kTile * kMaxD], k_s[kTile * kMaxD], v_s[kTile * kMaxD];
  __shared__ float p_s[kTile * kTile], ds_s[kTile * kTile], lse_s[kTile], dot_s[kTile];
  const int64_t d = g.c / g.heads, ld = 3 * g.c, blocks = (g.t + kTile - 1) / kTile;
  for (int64_t tile = blockIdx.x; tile < g.n * g.heads * blocks; tile += gridDim.x) {
    const int64_t kb = tile % blocks, bn = tile / blocks / g.heads, h = tile / blocks % g.heads;
    const int64_t j0 = kb * kTile, cols = min(g.t, j0 + kTile) - j0;
    const float* q = qkv + bn * g.t * ld + h * d;
    const float* dyh = dy + bn * g.t * g.c + h * d;
    const float* yh = y + bn * g.t * g.c + h * d;
    float* dk = dqkv + bn * g.t * ld + g.c + h * d;
    float* dv = dk + g.c;
    load_tile<kTile, kMaxD>(q + g.c, ld, j0, cols, d, k_s);
    load_tile<kTile, kMaxD>(q + 2 * g.c, ld, j0, cols, d, v_s);
    for (int64_t e = threadIdx.x; e < cols * d; e += blockDim.x) {
      dk[(j0 + e / d) * ld + e % d] = 0.0f;
      dv[(j0 + e / d) * ld + e % d] = 0.0f;
    }
    for (int64_t b = kb; b < blocks; ++b) {
      const int64_t i0 = b * kTile, rows = min(g.t, i0 + kTile) - i0;
      if (tile_first_key(g, bn, i0, i0 + rows) >= j0 + cols) continue;  // later documents
      __syncthreads();
      load_queries<kTile, kMaxD>(g, q, dyh, yh, lse + (bn * g.heads + h) * g.t, i0, rows, d, q_s,
                                 dy_s, lse_s, dot_s);
      __syncthreads();
      tile_grads<kTile, kMaxD>(g, bn, h, i0, rows, j0, cols, d, q_s, dy_s, k_s, v_s, lse_s, dot_s,
                               p_s, ds_s);
      __syncthreads();
      for (int64_t e = threadIdx.x; e < cols * d; e += blockDim.x) {
        const int64_t j = e / d, k = e % d;
        float gv = dv[(j0 + j) * ld + k], gk = dk[(j0 + j) * ld + k];
        for (int64_t r = 0; r < rows; ++r) {
          gv += p_s[r * kTile + j] * dy_s[r * kMaxD + k];
          gk += ds_s[r * kTile + j] * q_s[r * kMaxD + k];
        }
        dv[(j0 + j) * ld + k] = gv;
        dk[(j0 + j) * ld + k] = gk;
      }
    }
    __syncthreads();
  }
}

// dq of query tiles: one block per query tile, key tiles in increasing order.
template <int kTile, int kMaxD>
__global__ void __launch_bounds__(kFlashThreads)
    flash_backward_q_kernel(FlashGeom g, const float* qkv, const float* y, const float* lse,
                            const float* dy, float* dqkv) {
  __shared__ float q_s[kTile * kMaxD], dy_s[kTile * kMaxD], k_s[kTile * kMaxD], v_s[kTile * kMaxD];
  __shared__ float ds_s[kTile * kTile], lse_s[kTile], dot_s[kTile];
  const int64_t d = g.c / g.heads, ld = 3 * g.c, blocks = (g.t + kTile - 1) / kTile;
  for (int64_t tile = blockIdx.x; tile < g.n * g.heads * blocks; tile += gridDim.x) {
    const int64_t b = tile % blocks, bn = tile / blocks / g.heads, h = tile / blocks % g.heads;
    const int64_t i0 = b * kTile, rows = min(g.t, i0 + kTile) - i0;
    const float* q = qkv + bn * g.t * ld + h * d;
    float* dq = dqkv + bn * g.t * ld + h * d;
    load_queries<kTile, kMaxD>(g, q, dy + bn * g.t * g.c + h * d, y + bn * g.t * g.c + h * d,
                               lse + (bn * g.heads + h) * g.t, i0, rows, d, q_s, dy_s, lse_s,
                               dot_s);
    for (int64_t e = threadIdx.x; e < rows * d; e += blockDim.x) {
      dq[(i0 + e / d) * ld + e % d] = 0.0f;
    }
    const int64_t first = tile_first_key(g, bn, i0, i0 + rows);
    for (int64_t j0 = first / kTile * kTile; j0 < i0 + rows; j0 += kTile) {
      const int64_t cols = min(g.t, j0 + kTile) - j0;
      __syncthreads();
      load_tile<kTile, kMaxD>(q + g.c, ld, j0, cols, d, k_s);
      load_tile<kTile, kMaxD>(q + 2 * g.c, ld, j0, cols, d, v_s);
      __syncthreads();
      tile_grads<kTile, kMaxD>(g, bn, h, i0, rows, j0, cols, d, q_s, dy_s, k_s, v_s, lse_s, dot_s,
                               nullptr, ds_s);
      __syncthreads();
      for (int64_t e = threadIdx.x; e < rows * d; e += blockDim.x) {
        const int64_t r = e / d, k = e % d;
        float acc = dq[(i0 + r) * ld + k];
        for (int64_t j = 0; j < cols; ++j) acc += ds_s[r * kTile + j] * k_s[j * kMaxD + k];
        dq[(i0 + r) * ld + k] = acc;
      }
    }
    __syncthreads();
  }
}

FlashGeom flash_geom(int64_t n, int64_t t, int64_t heads, int64_t c, float dropout, uint64_t seed,
                     const int32_t* segments) {
  const float sqrt_d = static_cast<float>(std::sqrt(static_cast<double>(c / heads)));
  return {n, t, heads, c, sqrt_d, dropout, seed, segments};
}

unsigned int tile_grid(int64_t tiles) {
  return static_cast<unsigned int>(std::max<int64_t>(1, std::min<int64_t>(tiles, kMaxBlocks)));
}

}  // namespace

void launch_flash_attention_forward(int64_t n, int64_t t, int64_t heads, int64_t c, float dropout,
                                    uint64_t seed, const int32_t* segments, const float* qkv,
                                    float* y, float* lse, cudaStream_t stream) {
  const FlashGeom g = flash_geom(n, t, heads, c, dropout, seed, segments);
  if (c / heads <= kFlashSmallHead) {
    launch_kernel(flash_forward_kernel<32, kFlashSmallHead>, tile_grid(n * heads * ((t + 31) / 32)),
                  kFlashThreads, stream, g, qkv, y, lse);
  } else {
    launch_kernel(flash_forward_kernel<16, kFlashMaxHead>, tile_grid(n * heads * ((t + 15) / 16)),
                  kFlashThreads, stream, g, qkv, y, lse);
  }
}

void launch_flash_attention_backward(int64_t n, int64_t t, int64_t heads, int64_t c, float dropout,
                                     uint64_t seed, const int32_t* segments, const float* qkv,
                                     const float* y, const float* lse, const float* dy, float* dqkv,
                                     cudaStream_t stream) {
  const FlashGeom g = flash_geom(n, t, heads, c, dropout, seed, segments);
  if (c / heads <= kFlashSmallHead) {
    const unsigned int grid = tile_grid(n * heads * ((t + 31) / 32));
    launch_kernel(flash_backward_kv_kernel<32, kFlashSmallHead>, grid, kFlashThreads, stream, g,
                  qkv, y, lse, dy, dqkv);
    launch_kernel(flash_backward_q_kernel<32, kFlashSmallHead>, grid, kFlashThreads, stream, g, qkv,
                  y, lse, dy, dqkv);
  } else {
    const unsigned int grid = tile_grid(n * heads * ((t + 15) / 16));
    launch_kernel(flash_backward_kv_kernel<16, kFlashMaxHead>, grid, kFlashThreads, stream, g, qkv,
                  y, lse, dy, dqkv);
    launch_kernel(flash_backward_q_kernel<16, kFlashMaxHead>, grid, kFlashThreads, stream, g, qkv,
                  y, lse, dy, dqkv);
  }
}

}  // namespace ferry::cuda
