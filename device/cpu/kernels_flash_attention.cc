// The fused (memory-efficient) attention core on the CPU: Note [Fused attention] in
// device/kernels.h, computed in tiles of kRows queries by kCols keys with an online softmax.
// Deterministic: each item (forward: one query block of one head; backward: one head) runs on
// one thread in a fixed order, so the bits depend on the shape only.
#include <omp.h>

#include <cmath>
#include <limits>
#include <vector>

#include <fmt/format.h>
#include <oneapi/dnnl/dnnl.h>

#include "device/counter_rng.h"
#include "device/cpu/cpu_kernels_impl.h"
#include "device/cpu/simd.h"
#include "device/cpu/vec_math.h"
#include "device/kernel_checks.h"

namespace ferry::cpu {
namespace {

// Note [Fused attention tiles]
// A tile is kRows queries by kCols keys: its scores (16 KiB) and the query block's accumulator
// (kRows x D) stay in L1/L2 while the tile's products run. The products are oneDNN's sgemm on
// strided views of qkv (no copies); called inside the items' parallel loop, each runs on its
// item's thread, and its order of summation depends on the shapes only (K <= kCols or D: never
// split), so the bits do not depend on the thread count.
constexpr int64_t kRows = 64;
constexpr int64_t kCols = 64;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Row-major C (m, n; ldc) = op(A) op(B) + beta C, op 'N' or 'T' (oneDNN's dnnl_sgemm).
void gemm(char ta, char tb, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda,
          const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  const dnnl_status_t status = dnnl_sgemm(ta, tb, m, n, k, 1.0f, a, lda, b, ldb, beta, c, ldc);
  if (status != dnnl_success) {
    throw LibraryError("oneDNN", "dnnl_sgemm", fmt::format("status {}", static_cast<int>(status)),
                       __FILE__, __LINE__);
  }
}

// Calls body(i) for i in [0, n): in parallel over the items, or one after another with OpenMP
// held to one thread, so that an sgemm never splits its work across threads (Note [Fused
// attention tiles]).
template <typename Body>
void for_items(int64_t n, const Body& body) {
  if (n > 1 && omp_get_max_threads() > 1 && !omp_in_parallel()) {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) body(i);
    return;
  }
  struct OneThread {
    int saved = omp_get_max_threads();
    OneThread() { omp_set_num_threads(1); }
    ~OneThread() { omp_set_num_threads(saved); }
  } one;
  for (int64_t i = 0; i < n; ++i) body(i);
}

// The row loops: fixed lanes (lane l takes elements l, l + kLanes, ...) reduced by a pairwise
// tree, so they vectorize and no result depends on the clone that runs (vec_math.h).

// x[j] /= sqrt_d for j < n; returns the largest of them and `top`.
FERRY_SIMD_CLONES float scale_max(float* x, int64_t n, float sqrt_d, float top) {
  float lanes[kLanes];
  for (float& m : lanes) m = top;
  const int64_t body = n / kLanes * kLanes;
  for (int64_t j = 0; j < body; j += kLanes) {
    for (int l = 0; l < kLanes; ++l) {
      const float y = x[j + l] / sqrt_d;
      x[j + l] = y;
      lanes[l] = y > lanes[l] ? y : lanes[l];
    }
  }
  for (int64_t j = body; j < n; ++j) {
    x[j] = x[j] / sqrt_d;
    lanes[0] = x[j] > lanes[0] ? x[j] : lanes[0];
  }
  float m = lanes[0];
  for (int l = 1; l < kLanes; ++l) m = lanes[l] > m ? lanes[l] : m;
  return m;
}

// x[j] = exp(x[j] - top) for j < n; returns their sum.
FERRY_SIMD_CLONES float exp_sum(float* x, int64_t n, float top) {
  float lanes[kLanes] = {};
  const int64_t body = n / kLanes * kLanes;
  for (int64_t j = 0; j < body; j += kLanes) {
    for (int l = 0; l < kLanes; ++l) {
      const float e = exp_approx(x[j + l] - top);
      x[j + l] = e;
      lanes[l] += e;
    }
  }
  for (int64_t j = body; j < n; ++j) {
    x[j] = exp_approx(x[j] - top);
    lanes[j - body] += x[j];
  }
  return lane_total(lanes);
}

// Without dropout, for j < n: p = exp(s[j] / sqrt_d - lse) into s, and dp[j] (dy . v) becomes
// dS = p (dp - dot) / sqrt_d.
FERRY_SIMD_CLONES void grad_row(float* s, float* dp, int64_t n, float sqrt_d, float lse,
                                float dot) {
  for (int64_t j = 0; j < n; ++j) {
    const float p = exp_approx(s[j] / sqrt_d - lse);
    s[j] = p;
    dp[j] = p * (dp[j] - dot) / sqrt_d;
  }
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
  std::vector<float> s(kRows * kCols), acc(rows * d, 0.0f);
  float m[kRows], l[kRows];
  for (int64_t r = 0; r < rows; ++r) {
    m[r] = kNegInf;
    l[r] = 0.0f;
  }
  for (int64_t j0 = first_key(v, i0, i1) / kCols * kCols; j0 < i1; j0 += kCols) {
    const int64_t j1 = std::min(g.t, j0 + kCols), cols = j1 - j0;
    gemm('N', 'T', rows, cols, d, v.q + i0 * v.ld, v.ld, v.k + j0 * v.ld, v.ld, 0.0f, s.data(),
         kCols);
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t i = i0 + r;
      float* row = s.data() + r * kCols;
      const int64_t lo = std::min(std::max<int64_t>(v.begin(i), j0), j1) - j0;
      const int64_t hi = std::min(i + 1, j1) - j0;
      if (hi <= lo) {
        for (int64_t j = 0; j < kCols; ++j) row[j] = 0.0f;
        continue;
      }
      const float top = scale_max(row + lo, hi - lo, sqrt_d, m[r]);
      const float alpha = m[r] == kNegInf ? 0.0f : exp_approx(m[r] - top);
      for (int64_t j = 0; j < lo; ++j) row[j] = 0.0f;
      const float sum = exp_sum(row + lo, hi - lo, top);
      for (int64_t j = hi; j < kCols; ++j) row[j] = 0.0f;
      l[r] = l[r] * alpha + sum;
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
      gemm('N', 'N', rows, d, cols, s.data(), kCols, v.v + j0 * v.ld, v.ld, 1.0f, acc.data(), d);
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
  std::vector<float> p(kRows * kCols), ds(kRows * kCols);
  std::vector<float> dk_acc(kCols * d), dv_acc(kCols * d);
  for (int64_t j0 = 0; j0 < t; j0 += kCols) {
    const int64_t j1 = std::min(t, j0 + kCols), cols = j1 - j0;
    std::fill(dk_acc.begin(), dk_acc.end(), 0.0f);
    std::fill(dv_acc.begin(), dv_acc.end(), 0.0f);
    for (int64_t b = j0 / kRows; b < blocks; ++b) {
      if (block_first[b] >= j1) continue;  // every query of the block starts after these keys
      const int64_t i0 = b * kRows, i1 = std::min(t, i0 + kRows), rows = i1 - i0;
      gemm('N', 'T', rows, cols, d, v.q + i0 * ld, ld, v.k + j0 * ld, ld, 0.0f, p.data(), kCols);
      gemm('N', 'T', rows, cols, d, dy + i0 * c, c, v.v + j0 * ld, ld, 0.0f, ds.data(), kCols);
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
        if (!drop) grad_row(pr + lo, sr + lo, hi - lo, sqrt_d, row_lse, row_dot);
        for (int64_t j = lo; drop && j < hi; ++j) {  // P' (for dV) and dP = dropout'(dP')
          const float pj = exp_approx(pr[j] / sqrt_d - row_lse);
          const bool k = kept(a.seed, at + static_cast<uint64_t>(j), g.dropout);
          pr[j] = k ? pj / keep : 0.0f;
          sr[j] = pj * ((k ? sr[j] / keep : 0.0f) - row_dot) / sqrt_d;
        }
        for (int64_t j = hi; j < kCols; ++j) pr[j] = sr[j] = 0.0f;
      }
      gemm('T', 'N', cols, d, rows, p.data(), kCols, dy + i0 * c, c, 1.0f, dv_acc.data(), d);
      gemm('T', 'N', cols, d, rows, ds.data(), kCols, v.q + i0 * ld, ld, 1.0f, dk_acc.data(), d);
      gemm('N', 'N', rows, d, cols, ds.data(), kCols, v.k + j0 * ld, ld, 1.0f, dq + i0 * ld, ld);
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
  for_items(g.n * g.heads * blocks, [&](int64_t item) {
    const int64_t b = item % blocks, nh = item / blocks, n = nh / g.heads, h = nh % g.heads;
    const HeadView v = head_view(g, a.qkv, a.segments, n, h);
    forward_block(a, v, n, h, b * kRows, std::min(g.t, (b + 1) * kRows), drop);
  });
}

void run(PlanCache&, const FlashAttentionBackward& a) {
  check_flash_attention_backward(a);
  check_segments(a.segments, a.g.n * a.g.t, a.g.t, "flash_attention_backward");
  const AttentionGeom& g = a.g;
  for_items(g.n * g.heads, [&](int64_t nh) { backward_head(a, nh / g.heads, nh % g.heads); });
}

}  // namespace ferry::cpu
