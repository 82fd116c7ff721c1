// GPT-2's causal attention core on the CPU: oneDNN batched matmuls that read q, k and v straight
// out of the fused qkv and write y with the heads merged (strided views, no copies), and one fused
// loop per score row for the scale, causal (and segment) mask, softmax and dropout. Deterministic:
// every partition depends on the shape and the thread count only.
#include <cmath>

#include "device/counter_rng.h"
#include "device/cpu/cpu_kernels_impl.h"
#include "device/cpu/parallel.h"
#include "device/cpu/simd.h"
#include "device/cpu/vec_math.h"
#include "device/kernel_checks.h"

namespace ferry::cpu {
namespace {

// Note [Attention in chunks of the batch]
// The scores of B batch rows fill B * heads * T * T floats; the kernels keep their per-score
// scratch (the dropped probabilities, the score gradients) in the workspace and run over chunks
// of B rows, B the largest divisor of N whose scores fit kChunkBytes (at least 1). The workspace
// stays bounded for long contexts, a chunk's scores stay in cache from the matmul that writes them
// to the loop that reads them, and every chunk runs the same cached primitives.
constexpr int64_t kChunkBytes = 8 << 20;

int64_t chunk_rows(const AttentionGeom& g) {
  const int64_t per_row = g.heads * g.t * g.t * static_cast<int64_t>(sizeof(float));
  int64_t best = 1;
  for (int64_t b = 2; b <= g.n; ++b) {
    if (g.n % b == 0 && b * per_row <= kChunkBytes) best = b;
  }
  return best;
}

// Note [Causal blocks]
// Score rows are cut into blocks of kb rows (causal_block()); row block r, rows [r0, r1), needs
// only columns [0, r1) (the rest are masked), and column block r only rows [r0, T). Each pass
// runs one matmul per block over that triangle-covering part, about (1 + 1/R) / 2 of the full
// product for R blocks. Scores outside it are never written by a matmul; the row loops zero
// every masked entry, and the matmuls read only entries the row loops wrote. Blocks are at least
// 64 rows (a matmul that small still runs near full speed) and at most 8 per T.
int64_t causal_block(const AttentionGeom& g) {
  const int64_t eighth = (g.t + 7) / 8;
  return std::max<int64_t>(64, (eighth + 15) / 16 * 16);
}

enum AttentionMatmul : int64_t { kScores = 1, kContext, kGradProbs, kGradV, kGradQ, kGradK };

// Memory descriptors of one chunk of b batch rows, as (b, heads, rows, cols) matrices; row
// ranges are applied by offsetting the pointer (the offsets in elements are given below).
struct ChunkViews {
  int64_t b, h, t, d, c;
  ChunkViews(const AttentionGeom& g, int64_t rows)
      : b(rows), h(g.heads), t(g.t), d(g.head_dim()), c(g.c) {}

  // `len` rows of q, k or v (or their gradients) inside qkv (N, T, 3C): (b, H, len, D); the
  // rows from r0 start at element r0 * 3C.
  dnnl::memory::desc qkv(int64_t len) const {
    return strided_desc({b, h, len, d}, {t * 3 * c, d, 3 * c, 1});
  }
  // The same transposed: (b, H, D, len).
  dnnl::memory::desc qkv_t(int64_t len) const {
    return strided_desc({b, h, d, len}, {t * 3 * c, d, 1, 3 * c});
  }
  // `len` rows of y or dy (N, T, C): (b, H, len, D), from r0 at element r0 * C.
  dnnl::memory::desc merged(int64_t len) const {
    return strided_desc({b, h, len, d}, {t * c, d, c, 1});
  }
  // A (rows, cols) block of the scores (b, H, T, T), at element r0 * T + c0; or its transpose.
  dnnl::memory::desc scores(int64_t rows, int64_t cols) const {
    return strided_desc({b, h, rows, cols}, {h * t * t, t * t, t, 1});
  }
  dnnl::memory::desc scores_t(int64_t rows, int64_t cols) const {
    return strided_desc({b, h, cols, rows}, {h * t * t, t * t, 1, t});
  }
  int64_t score_floats() const { return b * h * t * t; }
};

std::shared_ptr<const PrimitivePlan> plan(PlanCache& plans, AttentionMatmul which,
                                          const AttentionGeom& g, int64_t rows, int64_t block,
                                          const dnnl::memory::desc& src,
                                          const dnnl::memory::desc& weights,
                                          const dnnl::memory::desc& dst) {
  return matmul_plan(
      plans, make_key({kernel_kind<AttentionForward>(), which, rows, g.t, g.heads, g.c, block}),
      src, weights, nullptr, dst);
}

// A pass's matmuls (kinds x causal blocks) and its workspace: [score buffers... | matmul
// scratchpad].
template <int kKinds>
struct Pass {
  int64_t rows = 1;  // batch rows per chunk
  int64_t kb = 1;    // rows per causal block
  int64_t blocks = 1;
  std::vector<std::shared_ptr<const PrimitivePlan>> mm[kKinds];  // [kind][block]
  uint64_t scratch_offset = 0;
  uint64_t bytes = 0;

  void init(const AttentionGeom& g) {
    rows = chunk_rows(g);
    kb = causal_block(g);
    blocks = (g.t + kb - 1) / kb;
  }
  void lay_out(int buffers, int64_t buffer_floats) {
    scratch_offset = buffers * align_up(buffer_floats * sizeof(float), kWorkspaceAlign);
    uint64_t scratch = 0;
    for (const auto& kind : mm) {
      for (const auto& p : kind) scratch = std::max(scratch, p->workspace_bytes());
    }
    bytes = scratch_offset + scratch;
  }
  float* buffer(const Workspace& ws, int i, int64_t buffer_floats) const {
    return reinterpret_cast<float*>(static_cast<char*>(ws.ptr) +
                                    i * align_up(buffer_floats * sizeof(float), kWorkspaceAlign));
  }
  Workspace scratch(const Workspace& ws) const {
    return Workspace{static_cast<char*>(ws.ptr) + scratch_offset, ws.bytes - scratch_offset};
  }
};

bool dropping(const AttentionForward& a) { return a.training && a.g.dropout > 0.0f; }

// Forward, per row block [r0, r1): S[r0:r1, :r1] = q[r0:r1] k[:r1]^T into probs, then
// y[r0:r1] = P'[r0:r1, :r1] v[:r1]. One buffer (P') when dropping.
Pass<2> forward_pass(PlanCache& plans, const AttentionGeom& g, bool drop) {
  check_attention_geom(g, "attention_forward");
  Pass<2> p;
  p.init(g);
  const ChunkViews v(g, p.rows);
  for (int64_t r = 0; r < p.blocks; ++r) {
    const int64_t r0 = r * p.kb, r1 = std::min(g.t, r0 + p.kb), m = r1 - r0;
    p.mm[0].push_back(plan(plans, kScores, g, p.rows, r, v.qkv(m), v.qkv_t(r1), v.scores(m, r1)));
    p.mm[1].push_back(plan(plans, kContext, g, p.rows, r, v.scores(m, r1), v.qkv(r1), v.merged(m)));
  }
  p.lay_out(drop ? 1 : 0, v.score_floats());
  return p;
}

// Backward, per row block [r0, r1): dP'[r0:r1, :r1] = dy[r0:r1] v[:r1]^T, dq[r0:r1] =
// dS[r0:r1, :r1] k[:r1]; per column block [c0, c1): dv[c0:c1] = P'[c0:, c0:c1]^T dy[c0:],
// dk[c0:c1] = dS[c0:, c0:c1]^T q[c0:]. Buffers: dP' (then dS) and, when dropping, P'.
Pass<4> backward_pass(PlanCache& plans, const AttentionGeom& g) {
  check_attention_geom(g, "attention_backward");
  Pass<4> p;
  p.init(g);
  const ChunkViews v(g, p.rows);
  for (int64_t r = 0; r < p.blocks; ++r) {
    const int64_t r0 = r * p.kb, r1 = std::min(g.t, r0 + p.kb), m = r1 - r0, below = g.t - r0;
    p.mm[0].push_back(
        plan(plans, kGradProbs, g, p.rows, r, v.merged(m), v.qkv_t(r1), v.scores(m, r1)));
    p.mm[1].push_back(plan(plans, kGradQ, g, p.rows, r, v.scores(m, r1), v.qkv(r1), v.qkv(m)));
    p.mm[2].push_back(
        plan(plans, kGradV, g, p.rows, r, v.scores_t(below, m), v.merged(below), v.qkv(m)));
    p.mm[3].push_back(
        plan(plans, kGradK, g, p.rows, r, v.scores_t(below, m), v.qkv(below), v.qkv(m)));
  }
  p.lay_out(g.dropout > 0.0f ? 2 : 1, v.score_floats());
  return p;
}

// ---- the row loops ----
// Row sums use kLanes lanes (lane l adds elements l, l + kLanes, ... in order) added by a
// pairwise tree: a fixed order that vectorizes.

// One row of scores (t wide) becomes its causal softmax: entries [begin, len) are scaled by
// 1 / sqrt_d and normalized, the rest set to 0 (begin: the query's segment start, Note
// [Segments of a packed row] in device/kernels.h; 0 without segments).
FERRY_SIMD_CLONES void softmax_row(float* row, int64_t begin, int64_t len, int64_t t,
                                   float sqrt_d) {
  for (int64_t j = 0; j < begin; ++j) row[j] = 0.0f;
  float* s = row + begin;
  len -= begin;
  t -= begin;
  float max_lanes[kLanes];
  for (float& m : max_lanes) m = -INFINITY;
  const int64_t body = len / kLanes * kLanes;
  for (int64_t j = 0; j < body; j += kLanes) {
    for (int l = 0; l < kLanes; ++l) {
      const float x = s[j + l] / sqrt_d;
      s[j + l] = x;
      max_lanes[l] = x > max_lanes[l] ? x : max_lanes[l];
    }
  }
  for (int64_t j = body; j < len; ++j) {
    const float x = s[j] / sqrt_d;
    s[j] = x;
    max_lanes[0] = x > max_lanes[0] ? x : max_lanes[0];
  }
  float m = max_lanes[0];
  for (int l = 1; l < kLanes; ++l) m = max_lanes[l] > m ? max_lanes[l] : m;

  float sum_lanes[kLanes] = {};
  for (int64_t j = 0; j < body; j += kLanes) {
    for (int l = 0; l < kLanes; ++l) {
      const float e = exp_approx(s[j + l] - m);
      s[j + l] = e;
      sum_lanes[l] += e;
    }
  }
  for (int64_t j = body; j < len; ++j) {
    const float e = exp_approx(s[j] - m);
    s[j] = e;
    sum_lanes[j - body] += e;
  }
  const float inv = 1.0f / lane_total(sum_lanes);
  for (int64_t j = 0; j < len; ++j) s[j] *= inv;
  for (int64_t j = len; j < t; ++j) s[j] = 0.0f;
}

// DropoutForward's draw on one row of t probabilities whose first element is element `index`.
// counter_uniform's value, converted through int32 (exact: 24 bits) so that the loop vectorizes
// (a uint64 -> float conversion does not, before AVX-512DQ).
FERRY_SIMD_CLONES void dropout_row(const float* p, int64_t t, float prob, uint64_t seed,
                                   uint64_t index, uint8_t* mask, float* out) {
  const float keep = 1.0f - prob;
  for (int64_t j = 0; j < t; ++j) {
    const int32_t bits =
        static_cast<int32_t>(counter_hash(seed, index + static_cast<uint64_t>(j)) >> 40);
    const bool kept = static_cast<float>(bits) * (1.0f / 16777216.0f) >= prob;
    const float scaled = p[j] / keep;
    mask[j] = static_cast<uint8_t>(kept);
    out[j] = kept ? scaled : 0.0f;
  }
}

// With dropout: P' = mask ? P / keep : 0 into out (t wide), and dP = mask ? dP' / keep : 0 in
// place (the first len).
FERRY_SIMD_CLONES void undrop_row(const float* p, const uint8_t* mask, int64_t len, int64_t t,
                                  float keep, float* out, float* dp) {
  for (int64_t j = 0; j < t; ++j) out[j] = mask[j] ? p[j] / keep : 0.0f;
  for (int64_t j = 0; j < len; ++j) dp[j] = mask[j] ? dp[j] / keep : 0.0f;
}

// Softmax backward on one row, dP in place becoming dS / sqrt_d (entries outside [begin, len):
// 0).
FERRY_SIMD_CLONES void softmax_grad_row(const float* row_p, float* row_dp, int64_t begin,
                                        int64_t len, int64_t t, float sqrt_d) {
  for (int64_t j = 0; j < begin; ++j) row_dp[j] = 0.0f;
  const float* p = row_p + begin;
  float* dp = row_dp + begin;
  len -= begin;
  t -= begin;
  double lanes[kLanes] = {};
  const int64_t body = len / kLanes * kLanes;
  for (int64_t j = 0; j < body; j += kLanes) {
    for (int l = 0; l < kLanes; ++l) lanes[l] += static_cast<double>(p[j + l] * dp[j + l]);
  }
  for (int64_t j = body; j < len; ++j) lanes[j - body] += static_cast<double>(p[j] * dp[j]);
  const float dot = static_cast<float>(lane_total(lanes));
  for (int64_t j = 0; j < len; ++j) dp[j] = p[j] * (dp[j] - dot) / sqrt_d;
  for (int64_t j = len; j < t; ++j) dp[j] = 0.0f;
}

// Batch row n's segment starts (T), or null without segments.
const int32_t* segments_of(const int32_t* segments, int64_t n, int64_t t) {
  return segments == nullptr ? nullptr : segments + n * t;
}

float sqrt_head_dim(const AttentionGeom& g) {
  return static_cast<float>(std::sqrt(static_cast<double>(g.head_dim())));
}

}  // namespace

uint64_t workspace(PlanCache& plans, const AttentionForward& a) {
  return forward_pass(plans, a.g, dropping(a)).bytes;
}

uint64_t workspace(PlanCache& plans, const AttentionBackward& a) {
  return backward_pass(plans, a.g).bytes;
}

void run(PlanCache& plans, const AttentionForward& a) {
  check_attention_forward(a);
  check_segments(a.segments, a.g.n * a.g.t, a.g.t, "attention_forward");
  const AttentionGeom& g = a.g;
  const bool drop = dropping(a) && a.y != nullptr;  // probabilities alone: nothing drops
  const Pass<2> pass = forward_pass(plans, g, dropping(a));
  check_workspace(a.ws, pass.bytes, "attention_forward");
  const int64_t t = g.t, c = g.c, tt = g.t * g.t;
  const ChunkViews views(g, pass.rows);
  float* dropped = drop ? pass.buffer(a.ws, 0, views.score_floats()) : nullptr;
  const Workspace scratch = pass.scratch(a.ws);
  const float sqrt_d = sqrt_head_dim(g);
  for (int64_t n0 = 0; n0 < g.n; n0 += pass.rows) {
    const float* qkv = a.qkv + n0 * t * 3 * c;
    const int64_t first = n0 * g.heads * tt;  // the chunk's first score element
    float* probs = a.probs + first;
    for (int64_t r = 0; r < pass.blocks; ++r) {
      const int64_t r0 = r * pass.kb;
      pass.mm[0][r]->execute({{DNNL_ARG_SRC, qkv + r0 * 3 * c},
                              {DNNL_ARG_WEIGHTS, qkv + c},
                              {DNNL_ARG_DST, probs + r0 * t}},
                             scratch, "attention_forward");
    }
    parallel_items(pass.rows * g.heads, views.score_floats(), [&](int64_t bh) {
      const int32_t* segments = segments_of(a.segments, n0 + bh / g.heads, t);
      for (int64_t i = 0; i < t; ++i) {
        const int64_t row = bh * tt + i * t;
        softmax_row(probs + row, segments ? segments[i] : 0, i + 1, t, sqrt_d);
        if (drop) {
          dropout_row(probs + row, t, g.dropout, a.seed, static_cast<uint64_t>(first + row),
                      a.mask + first + row, dropped + row);
        }
      }
    });
    if (a.y == nullptr) continue;  // a recompute of the probabilities
    const float* p = drop ? dropped : probs;
    for (int64_t r = 0; r < pass.blocks; ++r) {
      const int64_t r0 = r * pass.kb;
      pass.mm[1][r]->execute({{DNNL_ARG_SRC, p + r0 * t},
                              {DNNL_ARG_WEIGHTS, qkv + 2 * c},
                              {DNNL_ARG_DST, a.y + (n0 * t + r0) * c}},
                             scratch, "attention_forward");
    }
  }
}

void run(PlanCache& plans, const AttentionBackward& a) {
  check_attention_backward(a);
  check_segments(a.segments, a.g.n * a.g.t, a.g.t, "attention_backward");
  const AttentionGeom& g = a.g;
  const bool drop = g.dropout > 0.0f;
  const Pass<4> pass = backward_pass(plans, g);
  check_workspace(a.ws, pass.bytes, "attention_backward");
  const int64_t t = g.t, c = g.c, tt = g.t * g.t;
  const ChunkViews views(g, pass.rows);
  float* dscores = pass.buffer(a.ws, 0, views.score_floats());
  float* dropped = drop ? pass.buffer(a.ws, 1, views.score_floats()) : nullptr;
  const Workspace scratch = pass.scratch(a.ws);
  const float sqrt_d = sqrt_head_dim(g), keep = 1.0f - g.dropout;
  for (int64_t n0 = 0; n0 < g.n; n0 += pass.rows) {
    const float* qkv = a.qkv + n0 * t * 3 * c;
    const float* dy = a.dy + n0 * t * c;
    float* dqkv = a.dqkv + n0 * t * 3 * c;
    const int64_t first = n0 * g.heads * tt;
    const float* probs = a.probs + first;
    for (int64_t r = 0; r < pass.blocks; ++r) {
      const int64_t r0 = r * pass.kb;
      pass.mm[0][r]->execute({{DNNL_ARG_SRC, dy + r0 * c},
                              {DNNL_ARG_WEIGHTS, qkv + 2 * c},
                              {DNNL_ARG_DST, dscores + r0 * t}},
                             scratch, "attention_backward");
    }
    parallel_items(pass.rows * g.heads, views.score_floats(), [&](int64_t bh) {
      const int32_t* segments = segments_of(a.segments, n0 + bh / g.heads, t);
      for (int64_t i = 0; i < t; ++i) {
        const int64_t row = bh * tt + i * t;
        if (drop) {
          undrop_row(probs + row, a.mask + first + row, i + 1, t, keep, dropped + row,
                     dscores + row);
        }
        softmax_grad_row(probs + row, dscores + row, segments ? segments[i] : 0, i + 1, t, sqrt_d);
      }
    });
    const float* p = drop ? dropped : probs;
    for (int64_t r = 0; r < pass.blocks; ++r) {
      const int64_t r0 = r * pass.kb;
      const int64_t diag = r0 * t + r0;  // the block's first element on the diagonal
      pass.mm[1][r]->execute({{DNNL_ARG_SRC, dscores + r0 * t},
                              {DNNL_ARG_WEIGHTS, qkv + c},
                              {DNNL_ARG_DST, dqkv + r0 * 3 * c}},
                             scratch, "attention_backward");
      pass.mm[2][r]->execute({{DNNL_ARG_SRC, p + diag},
                              {DNNL_ARG_WEIGHTS, dy + r0 * c},
                              {DNNL_ARG_DST, dqkv + r0 * 3 * c + 2 * c}},
                             scratch, "attention_backward");
      pass.mm[3][r]->execute({{DNNL_ARG_SRC, dscores + diag},
                              {DNNL_ARG_WEIGHTS, qkv + r0 * 3 * c},
                              {DNNL_ARG_DST, dqkv + r0 * 3 * c + c}},
                             scratch, "attention_backward");
    }
  }
}

}  // namespace ferry::cpu
