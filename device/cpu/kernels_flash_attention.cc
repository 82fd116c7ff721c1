// The fused (memory-efficient) attention core on the CPU: Note [Fused attention] in
// device/kernels.h, computed in tiles of kRows queries by kCols keys with an online softmax.
// Deterministic: each item (forward: one query block of one head; backward: one head) runs on
// one thread in a fixed order, so the bits depend on the shape only.
#include <cmath>
#include <limits>
#include <vector>

#include "device/counter_rng.h"
#include "device/cpu/cpu_kernels_impl.h"
#include "device/cpu/parallel.h"
#include "device/cpu/simd.h"
#include "device/cpu/vec_math.h"
#include "device/kernel_checks.h"

namespace ferry::cpu {
namespace {

// Note [Fused attention tiles]
// A tile is kRows queries by kCols keys: its scores (16 KiB), the query block's accumulator
// (kRows x D) and the key block transposed (D x kCols) stay in L1/L2 while the tile's three
// products run. Every product is a plain loop whose innermost index is contiguous (the key
// columns of a score row, or the D columns of a value row), so it vectorizes; sums keep fixed
// lanes (vec_math.h), so no result depends on the instruction-set clone.
constexpr int64_t kRows = 64;
constexpr int64_t kCols = 64;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// s (rows, kCols) = a (rows, D; row stride lda) times bt (D, kCols): scores of a query block
// against a transposed key block (or dy against transposed values).
FERRY_SIMD_CLONES void tile_product(const float* a, int64_t lda, const float* bt, int64_t rows,
                                    int64_t d, float* s) {
  for (int64_t r = 0; r < rows; ++r) {
    float* out = s + r * kCols;
    for (int64_t j = 0; j < kCols; ++j) out[j] = 0.0f;
    const float* ar = a + r * lda;
    for (int64_t e = 0; e < d; ++e) {
      const float x = ar[e];
      const float* b = bt + e * kCols;
      for (int64_t j = 0; j < kCols; ++j) out[j] += x * b[j];
    }
  }
}

// acc (rows_out, D; stride ldo) += p (rows_out x cols, row stride ps, column stride 1)
// times b (cols, D; row stride ldb).
FERRY_SIMD_CLONES void tile_accumulate(const float* p, int64_t ps, int64_t rows_out, int64_t cols,
                                       const float* b, int64_t ldb, int64_t d, float* acc,
                                       int64_t ldo) {
  for (int64_t r = 0; r < rows_out; ++r) {
    float* out = acc + r * ldo;
    const float* pr = p + r * ps;
    for (int64_t j = 0; j < cols; ++j) {
      const float x = pr[j];
      if (x == 0.0f) continue;
      const float* br = b + j * ldb;
      for (int64_t e = 0; e < d; ++e) out[e] += x * br[e];
    }
  }
}

// acc (cols, D) += p^T b: p (rows x kCols), b (rows, D; row stride ldb). The key block's
// gradients, dV += P'^T dy and dK += dS^T q.
FERRY_SIMD_CLONES void tile_accumulate_t(const float* p, int64_t rows, int64_t cols, const float* b,
                                         int64_t ldb, int64_t d, float* acc) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* br = b + r * ldb;
    const float* pr = p + r * kCols;
    for (int64_t j = 0; j < cols; ++j) {
      const float x = pr[j];
      if (x == 0.0f) continue;
      float* out = acc + j * d;
      for (int64_t e = 0; e < d; ++e) out[e] += x * br[e];
    }
  }
}

// bt (D, kCols) = rows [0, cols) of x (row stride ld) transposed; columns past cols are 0.
void transpose_block(const float* x, int64_t ld, int64_t cols, int64_t d, float* bt) {
  for (int64_t e = 0; e < d; ++e) {
    float* out = bt + e * kCols;
    for (int64_t j = 0; j < cols; ++j) out[j] = x[j * ld + e];
    for (int64_t j = cols; j < kCols; ++j) out[j] = 0.0f;
  }
}

float row_sum(const float* x, int64_t n) {
  float lanes[kLanes] = {};
  const int64_t body = n / kLanes * kLanes;
  for (int64_t j = 0; j < body; j += kLanes) {
    for (int l = 0; l < kLanes; ++l) lanes[l] += x[j + l];
  }
  for (int64_t j = body; j < n; ++j) lanes[j - body] += x[j];
  return lane_total(lanes);
}

// The head's view of one batch row: q, k and v rows (stride 3C) and its segment starts.
struct HeadView {
  const float* q;
  const float* k;
  const float* v;
  int64_t ld;
  const int32_t* segments;  // (T) or null
  uint64_t first;           // the (N, heads, T, T) element index of (i, j) = (0, 0)
  int32_t begin(int64_t i) const { return segments == nullptr ? 0 : segments[i]; }
};

HeadView head_view(const AttentionGeom& g, const float* qkv, const int32_t* segments, int64_t n,
                   int64_t h) {
  const int64_t d = g.head_dim(), ld = 3 * g.c;
  const float* q = qkv + n * g.t * ld + h * d;
  return {q,
          q + g.c,
          q + 2 * g.c,
          ld,
          segments == nullptr ? nullptr : segments + n * g.t,
          static_cast<uint64_t>((n * g.heads + h) * g.t * g.t)};
}

// The least segment start of queries [i0, i1): no query of the block sees keys before it.
int64_t first_key(const HeadView& v, int64_t i0, int64_t i1) {
  int64_t lo = i0;
  for (int64_t i = i0; i < i1; ++i) lo = std::min<int64_t>(lo, v.begin(i));
  return lo;
}

bool kept(uint64_t seed, uint64_t index, float p) { return counter_uniform(seed, index) >= p; }

float sqrt_head_dim(const AttentionGeom& g) {
  return static_cast<float>(std::sqrt(static_cast<double>(g.head_dim())));
}

// Forward of query block [i0, i1) of one head: online softmax over the key blocks it sees.
void forward_block(const FlashAttentionForward& a, const HeadView& v, int64_t n, int64_t h,
                   int64_t i0, int64_t i1, bool drop) {
  const AttentionGeom& g = a.g;
  const int64_t d = g.head_dim(), rows = i1 - i0;
  const float sqrt_d = sqrt_head_dim(g), keep = 1.0f - g.dropout;
  std::vector<float> kt(d * kCols), s(kRows * kCols), acc(rows * d, 0.0f);
  float m[kRows], l[kRows];
  for (int64_t r = 0; r < rows; ++r) {
    m[r] = kNegInf;
    l[r] = 0.0f;
  }
  for (int64_t j0 = first_key(v, i0, i1) / kCols * kCols; j0 < i1; j0 += kCols) {
    const int64_t j1 = std::min(g.t, j0 + kCols), cols = j1 - j0;
    transpose_block(v.k + j0 * v.ld, v.ld, cols, d, kt.data());
    tile_product(v.q + i0 * v.ld, v.ld, kt.data(), rows, d, s.data());
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t i = i0 + r;
      float* row = s.data() + r * kCols;
      const int64_t lo = std::min(std::max<int64_t>(v.begin(i), j0), j1) - j0;
      const int64_t hi = std::min(i + 1, j1) - j0;
      if (hi <= lo) {
        for (int64_t j = 0; j < kCols; ++j) row[j] = 0.0f;
        continue;
      }
      float top = m[r];
      for (int64_t j = lo; j < hi; ++j) {
        row[j] = row[j] / sqrt_d;
        top = row[j] > top ? row[j] : top;
      }
      const float alpha = m[r] == kNegInf ? 0.0f : exp_approx(m[r] - top);
      for (int64_t j = 0; j < lo; ++j) row[j] = 0.0f;
      for (int64_t j = lo; j < hi; ++j) row[j] = exp_approx(row[j] - top);
      for (int64_t j = hi; j < kCols; ++j) row[j] = 0.0f;
      l[r] = l[r] * alpha + row_sum(row + lo, hi - lo);
      m[r] = top;
      if (drop) {
        const uint64_t at = v.first + static_cast<uint64_t>(i * g.t + j0);
        for (int64_t j = lo; j < hi; ++j) {
          row[j] = kept(a.seed, at + static_cast<uint64_t>(j), g.dropout) ? row[j] / keep : 0.0f;
        }
      }
      if (alpha != 1.0f) {
        float* out = acc.data() + r * d;
        for (int64_t e = 0; e < d; ++e) out[e] *= alpha;
      }
    }
    if (a.y != nullptr) {
      tile_accumulate(s.data(), kCols, rows, cols, v.v + j0 * v.ld, v.ld, d, acc.data(), d);
    }
  }
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t i = i0 + r;
    if (a.lse != nullptr) a.lse[(n * g.heads + h) * g.t + i] = m[r] + std::log(l[r]);
    if (a.y == nullptr) continue;
    float* out = a.y + (n * g.t + i) * g.c + h * d;
    const float inv = 1.0f / l[r];
    for (int64_t e = 0; e < d; ++e) out[e] = acc[r * d + e] * inv;
  }
}

// Backward of one head (n, h): key blocks outer (their dK and dV in tile accumulators), query
// blocks inner (dq accumulated in place, key block by key block).
void backward_head(const FlashAttentionBackward& a, int64_t n, int64_t h) {
  const AttentionGeom& g = a.g;
  const HeadView v = head_view(g, a.qkv, a.segments, n, h);
  const int64_t d = g.head_dim(), t = g.t, c = g.c, ld = v.ld;
  const float sqrt_d = sqrt_head_dim(g), keep = 1.0f - g.dropout;
  const bool drop = g.dropout > 0.0f;
  const float* dy = a.dy + n * t * c + h * d;  // row i at i * c
  const float* y = a.y + n * t * c + h * d;
  const float* lse = a.lse + (n * g.heads + h) * t;
  float* dq = a.dqkv + n * t * ld + h * d;
  float* dk = dq + c;
  float* dv = dq + 2 * c;
  // D_i = dy_i . y_i (= sum_j P'_ij dP'_ij).
  std::vector<float> dot(t);
  for (int64_t i = 0; i < t; ++i) {
    double lanes[kLanes] = {};
    for (int64_t e = 0; e < d; ++e) {
      lanes[e % kLanes] += static_cast<double>(dy[i * c + e] * y[i * c + e]);
    }
    dot[i] = static_cast<float>(lane_total(lanes));
    for (int64_t e = 0; e < d; ++e) dq[i * ld + e] = 0.0f;
  }
  const int64_t blocks = (t + kRows - 1) / kRows;
  std::vector<int64_t> block_first(blocks);
  for (int64_t b = 0; b < blocks; ++b) {
    block_first[b] = first_key(v, b * kRows, std::min(t, (b + 1) * kRows));
  }
  std::vector<float> kt(d * kCols), vt(d * kCols), p(kRows * kCols), ds(kRows * kCols);
  std::vector<float> dk_acc(kCols * d), dv_acc(kCols * d);
  for (int64_t j0 = 0; j0 < t; j0 += kCols) {
    const int64_t j1 = std::min(t, j0 + kCols), cols = j1 - j0;
    transpose_block(v.k + j0 * ld, ld, cols, d, kt.data());
    transpose_block(v.v + j0 * ld, ld, cols, d, vt.data());
    std::fill(dk_acc.begin(), dk_acc.end(), 0.0f);
    std::fill(dv_acc.begin(), dv_acc.end(), 0.0f);
    for (int64_t b = j0 / kRows; b < blocks; ++b) {
      if (block_first[b] >= j1) continue;  // every query of the block starts after these keys
      const int64_t i0 = b * kRows, i1 = std::min(t, i0 + kRows), rows = i1 - i0;
      tile_product(v.q + i0 * ld, ld, kt.data(), rows, d, p.data());
      tile_product(dy + i0 * c, c, vt.data(), rows, d, ds.data());
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t i = i0 + r;
        float* pr = p.data() + r * kCols;
        float* sr = ds.data() + r * kCols;
        // The query's keys in this block: [lo, hi) (empty when its document starts later).
        const int64_t lo = std::min(std::max<int64_t>(v.begin(i), j0), j1) - j0;
        const int64_t hi = std::max<int64_t>(lo, std::min(i + 1, j1) - j0);
        const float row_lse = lse[i], row_dot = dot[i];
        const uint64_t at = v.first + static_cast<uint64_t>(i * t + j0);
        for (int64_t j = 0; j < lo; ++j) pr[j] = sr[j] = 0.0f;
        for (int64_t j = lo; j < hi; ++j) {
          const float pj = exp_approx(pr[j] / sqrt_d - row_lse);
          float dpj = sr[j];
          float dropped = pj;
          if (drop) {
            const bool k = kept(a.seed, at + static_cast<uint64_t>(j), g.dropout);
            dropped = k ? pj / keep : 0.0f;
            dpj = k ? dpj / keep : 0.0f;
          }
          pr[j] = dropped;
          sr[j] = pj * (dpj - row_dot) / sqrt_d;
        }
        for (int64_t j = hi; j < kCols; ++j) pr[j] = sr[j] = 0.0f;
      }
      tile_accumulate_t(p.data(), rows, cols, dy + i0 * c, c, d, dv_acc.data());
      tile_accumulate_t(ds.data(), rows, cols, v.q + i0 * ld, ld, d, dk_acc.data());
      tile_accumulate(ds.data(), kCols, rows, cols, v.k + j0 * ld, ld, d, dq + i0 * ld, ld);
    }
    for (int64_t j = 0; j < cols; ++j) {
      for (int64_t e = 0; e < d; ++e) {
        dk[(j0 + j) * ld + e] = dk_acc[j * d + e];
        dv[(j0 + j) * ld + e] = dv_acc[j * d + e];
      }
    }
  }
}

}  // namespace

void run(PlanCache&, const FlashAttentionForward& a) {
  check_flash_attention_forward(a);
  check_segments(a.segments, a.g.n * a.g.t, a.g.t, "flash_attention_forward");
  const AttentionGeom& g = a.g;
  const bool drop = a.training && g.dropout > 0.0f;
  const int64_t blocks = (g.t + kRows - 1) / kRows;
  parallel_items(g.n * g.heads * blocks, g.n * g.heads * g.t * g.t, [&](int64_t item) {
    const int64_t b = item % blocks, nh = item / blocks, n = nh / g.heads, h = nh % g.heads;
    const HeadView v = head_view(g, a.qkv, a.segments, n, h);
    forward_block(a, v, n, h, b * kRows, std::min(g.t, (b + 1) * kRows), drop);
  });
}

void run(PlanCache&, const FlashAttentionBackward& a) {
  check_flash_attention_backward(a);
  check_segments(a.segments, a.g.n * a.g.t, a.g.t, "flash_attention_backward");
  const AttentionGeom& g = a.g;
  parallel_items(g.n * g.heads, g.n * g.heads * g.t * g.t,
                 [&](int64_t nh) { backward_head(a, nh / g.heads, nh % g.heads); });
}

}  // namespace ferry::cpu
