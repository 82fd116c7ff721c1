// The fused attention core on CUDA (Note [Fused attention] in device/kernels.h): tiles of kTile
// queries by kTile keys in shared memory, an online softmax in the forward, and a backward in
// two passes (dK and dV per key tile, then dq per query tile) that recompute the probabilities
// from q, k, lse. Every output element is written by one block in a fixed order: no atomics, the
// same bits for every grid. One template over the storage of qkv, y, dy and dqkv (fp32 or bf16,
// Note [Fused attention in bf16 on CUDA]); the math is fp32 in both.
#include <algorithm>
#include <cmath>
#include <type_traits>

#include "device/counter_rng.h"
#include "device/cuda/launch.cuh"
#include "device/cuda/storage.cuh"
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

// Note [Fused attention in bf16 on CUDA]
// In bf16 storage (Note [Storage dtype of a kernel]) qkv, y, dy and dqkv are bf16, lse fp32, and
// every product, the softmax and every accumulation stay fp32: each stored operand is widened
// exactly as it is read, and each output is rounded once (as_storage) from the fp32 value the
// fp32 kernel computes from the same widened inputs, so a bf16 output is the fp32 kernel's
// rounded, bit for bit. Two things make that fit in the 48 KiB of static shared memory, where
// the fp32 backward's tiles already sit near the limit:
//  - the shared tiles of q, k, v and dy hold the storage's own elements (bf16 bits, half the
//    bytes of fp32), widened on each read;
//  - an fp32 kernel accumulates y, dK, dV and dq in place in its fp32 output (global memory);
//    a bf16 kernel cannot (each partial sum would be rounded), so it accumulates the
//    block's (kTile, D) results in fp32 shared memory and writes them rounded at the end. The
//    bytes the bf16 tiles save pay for these accumulators (FlashShared below).
// The tile shapes (32 x 32 up to D = 64, 16 x 16 up to D = 128) are the fp32 kernel's, so the
// order of every sum, and the bits, are too.

// The element of a shared tile: fp32, or the bits of a bf16 (Note [Fused attention in bf16 on
// CUDA]).
template <typename S>
struct TileElement {
  using type = float;
};
template <>
struct TileElement<Bf16> {
  using type = unsigned short;
};
template <typename S>
using TileT = typename TileElement<S>::type;

// The row pitch of a shared tile of T elements (Note [Shared tile rows]): kMaxD and one 32-bit
// word more, an odd number of words for the even kMaxD the kernels take.
template <typename T, int kMaxD>
constexpr int kPitch = kMaxD + static_cast<int>(4 / sizeof(T));

__device__ inline float from_tile(float v) { return v; }
__device__ inline float from_tile(unsigned short bits) {
  return __bfloat162float(__ushort_as_bfloat16(bits));
}
__device__ inline float to_tile(float v) { return v; }
__device__ inline unsigned short to_tile(Bf16 v) { return __bfloat16_as_ushort(v); }

// Whether storage S accumulates in its output in place (fp32), else in shared fp32 tiles.
template <typename S>
constexpr bool kInPlace = std::is_same_v<S, float>;

// The floats of a block's shared fp32 accumulators: one (kTile, kMaxD) tile each, or one float
// (unused) where the output accumulates in place.
template <typename S, int kTile, int kMaxD>
constexpr int kAccFloats = kInPlace<S> ? 1 : int{kTile * kMaxD};

// The static shared bytes of the three kernels, checked against the 48 KiB limit at compile time
// (nvcc's ptxas refuses more; the host emulation has no limit, so the asserts keep it honest).
template <typename S, int kTile, int kMaxD>
struct FlashShared {
  static constexpr int kTileBytes =
      kTile * kPitch<TileT<S>, kMaxD> * static_cast<int>(sizeof(TileT<S>));
  static constexpr int kAccBytes = kAccFloats<S, kTile, kMaxD> * 4;
  static constexpr int kForward = 3 * kTileBytes + kAccBytes + (kTile * kTile + 3 * kTile) * 4;
  static constexpr int kBackwardKv =
      4 * kTileBytes + 2 * kAccBytes + (2 * kTile * kTile + 2 * kTile) * 4;
  static constexpr int kBackwardQ = 4 * kTileBytes + kAccBytes + (kTile * kTile + 2 * kTile) * 4;
  static constexpr int kLimit = 48 * 1024;
  static_assert(kForward <= kLimit && kBackwardKv <= kLimit && kBackwardQ <= kLimit,
                "the fused attention tiles exceed 48 KiB of static shared memory");
};

// A (rows, D) fp32 accumulator: in place in an fp32 output (row stride ld) or a shared tile.
struct Accumulator {
  float* p;
  int64_t ld;
  __device__ float& at(int64_t r, int64_t k) const { return p[r * ld + k]; }
};

// The accumulator of rows [r0, ...) of output `out` (row stride ld): `out` itself for fp32
// storage, else the shared tile `acc_s` (row stride D).
template <typename S>
__device__ Accumulator accumulator(S* out, int64_t ld, int64_t r0, int64_t d, float* acc_s) {
  if constexpr (kInPlace<S>) {
    return {out == nullptr ? nullptr : out + r0 * ld, ld};
  } else {
    return {acc_s, d};
  }
}

// Writes a shared accumulator's rows [0, rows) to `out` (rows r0.., stride ld), each value times
// `scale` of its row (null: 1) rounded once; nothing for fp32 storage, whose accumulator is its
// output (scaled in place when `scale` is given).
template <typename S>
__device__ void store_rows(const Accumulator& acc, const float* scale, S* out, int64_t ld,
                           int64_t r0, int64_t rows, int64_t d) {
  for (int64_t e = threadIdx.x; e < rows * d; e += blockDim.x) {
    const int64_t r = e / d, k = e % d;
    if constexpr (kInPlace<S>) {
      if (scale != nullptr) acc.at(r, k) *= scale[r];
    } else {
      const float v = scale == nullptr ? acc.at(r, k) : acc.at(r, k) * scale[r];
      out[(r0 + r) * ld + k] = as_storage<S>(v);
    }
  }
}

// Note [Shared tile rows]
// Tiles in shared memory keep rows of kMaxD elements and one 32-bit word more (kPitch: kMaxD + 1
// floats, or kMaxD + 2 bf16s), an odd number of words: threads of a warp reading one column of
// consecutive rows (k_s, v_s in the score products) then hit distinct banks.
//
// Loads rows [r0, r0 + rows) of x (row stride ld, D wide) into a (kTile, kPitch) tile, zero past
// `rows`.
template <int kTile, int kMaxD, typename S>
__device__ void load_tile(const S* x, int64_t ld, int64_t r0, int64_t rows, int64_t d,
                          TileT<S>* tile) {
  for (int64_t e = threadIdx.x; e < kTile * d; e += blockDim.x) {
    const int64_t r = e / d, k = e % d;
    tile[r * kPitch<TileT<S>, kMaxD> + k] = r < rows ? to_tile(x[(r0 + r) * ld + k]) : TileT<S>{0};
  }
}

template <typename T>
__device__ float dot_rows(const T* a, const T* b, int64_t d) {
  float acc = 0.0f;
  for (int64_t e = 0; e < d; ++e) acc += from_tile(a[e]) * from_tile(b[e]);
  return acc;
}

template <typename S, int kTile, int kMaxD>
__global__ void __launch_bounds__(kFlashThreads)
    flash_forward_kernel(FlashGeom g, const S* qkv, S* y, float* lse) {
  using Shared = FlashShared<S, kTile, kMaxD>;
  constexpr int kRow = kPitch<TileT<S>, kMaxD>;
  static_assert(Shared::kForward <= Shared::kLimit);
  __shared__ TileT<S> q_s[kTile * kRow], k_s[kTile * kRow], v_s[kTile * kRow];
  __shared__ float o_s[kAccFloats<S, kTile, kMaxD>];
  __shared__ float s_s[kTile * kTile], m_s[kTile], l_s[kTile], alpha_s[kTile];
  const float neg_inf = -__int_as_float(0x7f800000);
  const int64_t d = g.c / g.heads, ld = 3 * g.c, blocks = (g.t + kTile - 1) / kTile;
  for (int64_t tile = blockIdx.x; tile < g.n * g.heads * blocks; tile += gridDim.x) {
    const int64_t b = tile % blocks, bn = tile / blocks / g.heads, h = tile / blocks % g.heads;
    const int64_t i0 = b * kTile, i1 = min(g.t, i0 + kTile), rows = i1 - i0;
    const S* q = qkv + bn * g.t * ld + h * d;
    S* out = y == nullptr ? nullptr : y + bn * g.t * g.c + h * d;  // row i at i * C
    const Accumulator acc = accumulator(out, g.c, i0, d, o_s);
    load_tile<kTile, kMaxD>(q, ld, i0, rows, d, q_s);
    for (int64_t e = threadIdx.x; e < rows * d; e += blockDim.x) {
      if (out != nullptr) acc.at(e / d, e % d) = 0.0f;
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
        s_s[e] = dot_rows(q_s + (e / kTile) * kRow, k_s + (e % kTile) * kRow, d) / g.sqrt_d;
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
        float& o = acc.at(r, k);
        float sum = o * alpha_s[r];
        for (int64_t j = 0; j < cols; ++j) sum += s_s[r * kTile + j] * from_tile(v_s[j * kRow + k]);
        o = sum;
      }
      __syncthreads();
    }
    for (int64_t r = threadIdx.x; r < rows; r += blockDim.x) alpha_s[r] = 1.0f / l_s[r];
    __syncthreads();
    if (out != nullptr) store_rows(acc, alpha_s, out, g.c, i0, rows, d);
    for (int64_t r = threadIdx.x; lse != nullptr && r < rows; r += blockDim.x) {
      lse[(bn * g.heads + h) * g.t + i0 + r] = m_s[r] + log(l_s[r]);
    }
    __syncthreads();
  }
}

// The backward's per-query-tile state: q and dy rows, each row's lse and D = dy . y.
template <int kTile, int kMaxD, typename S>
__device__ void load_queries(const FlashGeom& g, const S* q, const S* dy, const S* y,
                             const float* lse, int64_t i0, int64_t rows, int64_t d, TileT<S>* q_s,
                             TileT<S>* dy_s, float* lse_s, float* dot_s) {
  load_tile<kTile, kMaxD>(q, 3 * g.c, i0, rows, d, q_s);
  load_tile<kTile, kMaxD>(dy, g.c, i0, rows, d, dy_s);
  for (int64_t r = threadIdx.x; r < rows; r += blockDim.x) {
    double acc = 0.0;
    for (int64_t e = 0; e < d; ++e) {
      acc += static_cast<double>(as_f32(dy[(i0 + r) * g.c + e]) * as_f32(y[(i0 + r) * g.c + e]));
    }
    dot_s[r] = static_cast<float>(acc);
    lse_s[r] = lse[i0 + r];
  }
}

// dS (and P' when p_s is not null) of a (query tile, key tile): P = exp(S - lse), P' and dP the
// dropout's (kept ? x / keep : 0) of P and dy v^T, dS = P (dP - D) / sqrt(D); 0 where the query
// does not see the key.
template <int kTile, int kMaxD, typename T>
__device__ void tile_grads(const FlashGeom& g, int64_t bn, int64_t h, int64_t i0, int64_t rows,
                           int64_t j0, int64_t cols, int64_t d, const T* q_s, const T* dy_s,
                           const T* k_s, const T* v_s, const float* lse_s, const float* dot_s,
                           float* p_s, float* ds_s) {
  constexpr int kRow = kPitch<T, kMaxD>;
  for (int64_t e = threadIdx.x; e < kTile * kTile; e += blockDim.x) {
    const int64_t r = e / kTile, j = e % kTile, i = i0 + r;
    float p = 0.0f, ds = 0.0f;
    if (r < rows && j < cols && j0 + j <= i && j0 + j >= key_begin(g, bn, i)) {
      const float s = dot_rows(q_s + r * kRow, k_s + j * kRow, d) / g.sqrt_d;
      const float pj = exp(s - lse_s[r]);
      float dp = dot_rows(dy_s + r * kRow, v_s + j * kRow, d);
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
template <typename S, int kTile, int kMaxD>
__global__ void __launch_bounds__(kFlashThreads)
    flash_backward_kv_kernel(FlashGeom g, const S* qkv, const S* y, const float* lse, const S* dy,
                             S* dqkv) {
  using Shared = FlashShared<S, kTile, kMaxD>;
  constexpr int kRow = kPitch<TileT<S>, kMaxD>;
  static_assert(Shared::kBackwardKv <= Shared::kLimit);
  __shared__ TileT<S> q_s[kTile * kRow], dy_s[kTile * kRow], k_s[kTile * kRow], v_s[kTile * kRow];
  __shared__ float dk_s[kAccFloats<S, kTile, kMaxD>], dv_s[kAccFloats<S, kTile, kMaxD>];
  __shared__ float p_s[kTile * kTile], ds_s[kTile * kTile], lse_s[kTile], dot_s[kTile];
  const int64_t d = g.c / g.heads, ld = 3 * g.c, blocks = (g.t + kTile - 1) / kTile;
  for (int64_t tile = blockIdx.x; tile < g.n * g.heads * blocks; tile += gridDim.x) {
    const int64_t kb = tile % blocks, bn = tile / blocks / g.heads, h = tile / blocks % g.heads;
    const int64_t j0 = kb * kTile, cols = min(g.t, j0 + kTile) - j0;
    const S* q = qkv + bn * g.t * ld + h * d;
    const S* dyh = dy + bn * g.t * g.c + h * d;
    const S* yh = y + bn * g.t * g.c + h * d;
    S* dk = dqkv + bn * g.t * ld + g.c + h * d;
    S* dv = dk + g.c;
    const Accumulator gk = accumulator(dk, ld, j0, d, dk_s), gv = accumulator(dv, ld, j0, d, dv_s);
    load_tile<kTile, kMaxD>(q + g.c, ld, j0, cols, d, k_s);
    load_tile<kTile, kMaxD>(q + 2 * g.c, ld, j0, cols, d, v_s);
    for (int64_t e = threadIdx.x; e < cols * d; e += blockDim.x) {
      gk.at(e / d, e % d) = 0.0f;
      gv.at(e / d, e % d) = 0.0f;
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
        float sv = gv.at(j, k), sk = gk.at(j, k);
        for (int64_t r = 0; r < rows; ++r) {
          sv += p_s[r * kTile + j] * from_tile(dy_s[r * kRow + k]);
          sk += ds_s[r * kTile + j] * from_tile(q_s[r * kRow + k]);
        }
        gv.at(j, k) = sv;
        gk.at(j, k) = sk;
      }
    }
    store_rows(gk, nullptr, dk, ld, j0, cols, d);
    store_rows(gv, nullptr, dv, ld, j0, cols, d);
    __syncthreads();
  }
}

// dq of query tiles: one block per query tile, key tiles in increasing order.
template <typename S, int kTile, int kMaxD>
__global__ void __launch_bounds__(kFlashThreads)
    flash_backward_q_kernel(FlashGeom g, const S* qkv, const S* y, const float* lse, const S* dy,
                            S* dqkv) {
  using Shared = FlashShared<S, kTile, kMaxD>;
  constexpr int kRow = kPitch<TileT<S>, kMaxD>;
  static_assert(Shared::kBackwardQ <= Shared::kLimit);
  __shared__ TileT<S> q_s[kTile * kRow], dy_s[kTile * kRow], k_s[kTile * kRow], v_s[kTile * kRow];
  __shared__ float dq_s[kAccFloats<S, kTile, kMaxD>];
  __shared__ float ds_s[kTile * kTile], lse_s[kTile], dot_s[kTile];
  const int64_t d = g.c / g.heads, ld = 3 * g.c, blocks = (g.t + kTile - 1) / kTile;
  for (int64_t tile = blockIdx.x; tile < g.n * g.heads * blocks; tile += gridDim.x) {
    const int64_t b = tile % blocks, bn = tile / blocks / g.heads, h = tile / blocks % g.heads;
    const int64_t i0 = b * kTile, rows = min(g.t, i0 + kTile) - i0;
    const S* q = qkv + bn * g.t * ld + h * d;
    S* dq = dqkv + bn * g.t * ld + h * d;
    const Accumulator gq = accumulator(dq, ld, i0, d, dq_s);
    load_queries<kTile, kMaxD>(g, q, dy + bn * g.t * g.c + h * d, y + bn * g.t * g.c + h * d,
                               lse + (bn * g.heads + h) * g.t, i0, rows, d, q_s, dy_s, lse_s,
                               dot_s);
    for (int64_t e = threadIdx.x; e < rows * d; e += blockDim.x) gq.at(e / d, e % d) = 0.0f;
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
        float sum = gq.at(r, k);
        for (int64_t j = 0; j < cols; ++j)
          sum += ds_s[r * kTile + j] * from_tile(k_s[j * kRow + k]);
        gq.at(r, k) = sum;
      }
    }
    store_rows(gq, nullptr, dq, ld, i0, rows, d);
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

// Calls f(StorageTag<S>{}, std::integral_constant<int, kTile>{}, std::integral_constant<int,
// kMaxD>{}) with the tile shape of head width c / heads.
template <typename F>
void with_flash_shape(int64_t heads, int64_t c, DType dtype, F&& f) {
  with_storage(dtype, [&](auto tag) {
    if (c / heads <= kFlashSmallHead) {
      f(tag, std::integral_constant<int, 32>{}, std::integral_constant<int, kFlashSmallHead>{});
    } else {
      f(tag, std::integral_constant<int, 16>{}, std::integral_constant<int, kFlashMaxHead>{});
    }
  });
}

}  // namespace

void launch_flash_attention_forward(int64_t n, int64_t t, int64_t heads, int64_t c, float dropout,
                                    uint64_t seed, const int32_t* segments, const float* qkv,
                                    float* y, float* lse, DType dtype, cudaStream_t stream) {
  const FlashGeom g = flash_geom(n, t, heads, c, dropout, seed, segments);
  with_flash_shape(heads, c, dtype, [&](auto tag, auto tile, auto max_d) {
    using S = typename decltype(tag)::type;
    constexpr int kTile = decltype(tile)::value, kMaxD = decltype(max_d)::value;
    launch_kernel(flash_forward_kernel<S, kTile, kMaxD>,
                  tile_grid(n * heads * ((t + kTile - 1) / kTile)), kFlashThreads, stream, g,
                  stored<S>(qkv), stored<S>(y), lse);
  });
}

void launch_flash_attention_backward(int64_t n, int64_t t, int64_t heads, int64_t c, float dropout,
                                     uint64_t seed, const int32_t* segments, const float* qkv,
                                     const float* y, const float* lse, const float* dy, float* dqkv,
                                     DType dtype, cudaStream_t stream) {
  const FlashGeom g = flash_geom(n, t, heads, c, dropout, seed, segments);
  with_flash_shape(heads, c, dtype, [&](auto tag, auto tile, auto max_d) {
    using S = typename decltype(tag)::type;
    constexpr int kTile = decltype(tile)::value, kMaxD = decltype(max_d)::value;
    const unsigned int grid = tile_grid(n * heads * ((t + kTile - 1) / kTile));
    launch_kernel(flash_backward_kv_kernel<S, kTile, kMaxD>, grid, kFlashThreads, stream, g,
                  stored<S>(qkv), stored<S>(y), lse, stored<S>(dy), stored<S>(dqkv));
    launch_kernel(flash_backward_q_kernel<S, kTile, kMaxD>, grid, kFlashThreads, stream, g,
                  stored<S>(qkv), stored<S>(y), lse, stored<S>(dy), stored<S>(dqkv));
  });
}

}  // namespace ferry::cuda
