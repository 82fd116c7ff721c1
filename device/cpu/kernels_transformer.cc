// Transformer kernels on the CPU: GPT-2's embedding, layer norm and GELU as plain loops (the
// attention core is in kernels_attention.cc; the gradient-clipping reductions in kernels_optim.cc).
// Every sum runs inside one work item in a fixed order, so results do not depend on the threads.
#include <algorithm>
#include <cmath>
#include <functional>
#include <vector>

#include <fmt/format.h>

#include "device/cpu/cpu_kernels_impl.h"
#include "device/cpu/parallel.h"
#include "device/cpu/simd.h"
#include "device/cpu/vec_math.h"
#include "device/kernel_checks.h"

namespace ferry::cpu {
namespace {

// ---- embedding ----

FERRY_SIMD_CLONES void add_rows(const float* a, const float* b, float* y, int64_t c) {
  for (int64_t i = 0; i < c; ++i) y[i] = a[i] + b[i];
}

FERRY_SIMD_CLONES void accumulate_row(const float* x, float* y, int64_t c) {
  for (int64_t i = 0; i < c; ++i) y[i] += x[i];
}

FERRY_SIMD_CLONES void zero_row(float* y, int64_t c) {
  for (int64_t i = 0; i < c; ++i) y[i] = 0.0f;
}

// The position of row `row` (n * T + t) for the position table: t, or its place in its document
// (Note [Segments of a packed row] in device/kernels.h).
int64_t position_of(const int32_t* segments, int64_t row, int64_t t) {
  return segments == nullptr ? row % t : row % t - segments[row];
}

// The rows [0, rows) grouped by key (each in [0, keys)), in increasing row order within a key:
// a counting sort. start has keys + 1 entries; rows of key k are order[start[k], start[k + 1]).
void rows_by_key(int64_t rows, int64_t keys, const std::function<int64_t(int64_t)>& key,
                 std::vector<int64_t>& start, std::vector<int64_t>& order) {
  start.assign(static_cast<size_t>(keys + 1), 0);
  order.resize(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) ++start[key(r) + 1];
  for (int64_t k = 0; k < keys; ++k) start[k + 1] += start[k];
  std::vector<int64_t> next(start.begin(), start.end() - 1);
  for (int64_t r = 0; r < rows; ++r) order[next[key(r)]++] = r;
}

// ---- layer norm ----
// Row sums use kLanes lanes (lane l adds elements l, l + kLanes, ... in order; float64 for the
// statistics) added by a pairwise tree: a fixed order that vectorizes.

// mean and rstd of one row of c values.
FERRY_SIMD_CLONES void row_stats(const float* x, int64_t c, float eps, float* mean, float* rstd) {
  double lanes[kLanes] = {};
  const int64_t body = c / kLanes * kLanes;
  for (int64_t i = 0; i < body; i += kLanes) {
    for (int l = 0; l < kLanes; ++l) lanes[l] += static_cast<double>(x[i + l]);
  }
  for (int64_t i = body; i < c; ++i) lanes[i - body] += static_cast<double>(x[i]);
  const double m = lane_total(lanes) / static_cast<double>(c);
  for (double& l : lanes) l = 0.0;
  for (int64_t i = 0; i < body; i += kLanes) {
    for (int l = 0; l < kLanes; ++l) {
      const double d = static_cast<double>(x[i + l]) - m;
      lanes[l] += d * d;
    }
  }
  for (int64_t i = body; i < c; ++i) {
    const double d = static_cast<double>(x[i]) - m;
    lanes[i - body] += d * d;
  }
  const double var = lane_total(lanes) / static_cast<double>(c);
  *mean = static_cast<float>(m);
  *rstd = static_cast<float>(1.0 / std::sqrt(var + static_cast<double>(eps)));
}

FERRY_SIMD_CLONES void normalize_row(const float* x, const float* gamma, const float* beta,
                                     int64_t c, float mean, float rstd, float* y) {
  for (int64_t i = 0; i < c; ++i) y[i] = (x[i] - mean) * rstd * gamma[i] + beta[i];
}

// Note [Layer norm's gradient order]
// dgamma and dbeta are summed per block of kLayerNormBlockRows rows (in row order, in float, one
// work item per block, fused with dx), then the blocks' partial sums are added in block order in
// float64: an order fixed by the shape, so the bits do not depend on the threads. A row's two
// sums for dx use float lanes (as PyTorch's vectorized loops do).
constexpr int64_t kLayerNormBlockRows = 32;

// One row's gradients: dx = rstd * (g - mean(g) - xhat * mean(g * xhat)), g = dy * gamma, and
// dy * xhat, dy added to the block's partial sums pg, pb. dx may be dy.
FERRY_SIMD_CLONES void layer_norm_backward_row(const float* x, const float* dy, const float* gamma,
                                               int64_t c, float mean, float rstd, float* dx,
                                               float* __restrict pg, float* __restrict pb) {
  float sum_g[kLanes] = {}, sum_gx[kLanes] = {};
  auto add = [&](int64_t i, int l) {
    const float g = dy[i] * gamma[i];
    const float xhat = (x[i] - mean) * rstd;
    sum_g[l] += g;
    sum_gx[l] += g * xhat;
  };
  const int64_t body = c / kLanes * kLanes;
  for (int64_t i = 0; i < body; i += kLanes) {
    for (int l = 0; l < kLanes; ++l) add(i + l, l);
  }
  for (int64_t i = body; i < c; ++i) add(i, static_cast<int>(i - body));
  const float mg = lane_total(sum_g) / static_cast<float>(c);
  const float mgx = lane_total(sum_gx) / static_cast<float>(c);
  for (int64_t i = 0; i < c; ++i) {
    const float d = dy[i];
    const float xhat = (x[i] - mean) * rstd;
    pg[i] += d * xhat;
    pb[i] += d;
    dx[i] = rstd * (d * gamma[i] - mg - xhat * mgx);
  }
}

// out[j] = float(sum over blocks b, in order, of partial[b * stride + j]) for j < c.
FERRY_SIMD_CLONES void sum_blocks(const float* partial, int64_t blocks, int64_t stride, int64_t c,
                                  double* acc, float* out) {
  for (int64_t j = 0; j < c; ++j) acc[j] = 0.0;
  for (int64_t b = 0; b < blocks; ++b) {
    for (int64_t j = 0; j < c; ++j) acc[j] += static_cast<double>(partial[b * stride + j]);
  }
  for (int64_t j = 0; j < c; ++j) out[j] = static_cast<float>(acc[j]);
}

// ---- GELU (tanh approximation), PyTorch's formulas ----

constexpr float kGeluBeta = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kGeluKappa = 0.044715f;

FERRY_SIMD_CLONES void gelu(const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float v = x[i];
    const float inner = kGeluBeta * (v + kGeluKappa * (v * v * v));
    y[i] = 0.5f * v * (1.0f + tanh_approx(inner));
  }
}

FERRY_SIMD_CLONES void gelu_grad(const float* x, const float* dy, float* dx, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float v = x[i];
    const float v2 = v * v;
    const float t = tanh_approx(kGeluBeta * (v + kGeluKappa * (v2 * v)));
    const float left_derivative = 0.5f * (1.0f + t);
    const float right_derivative =
        0.5f * v * (1.0f - t * t) * (kGeluBeta * (1.0f + 3.0f * kGeluKappa * v2));
    dx[i] = dy[i] * (left_derivative + right_derivative);
  }
}

}  // namespace

void check_segments(const int32_t* segments, int64_t rows, int64_t t, const char* what) {
  if (segments == nullptr) return;
  for (int64_t r = 0; r < rows; ++r) {
    if (segments[r] < 0 || segments[r] > r % t) {
      throw DataError(fmt::format("{}: segment start {} of position {} of row {} is outside [0, "
                                  "{}]",
                                  what, segments[r], r % t, r / t, r % t),
                      "a position's document starts at or before it (Note [Segments of a packed "
                      "row] in device/kernels.h)");
    }
  }
}

void run(PlanCache&, const EmbeddingForward& a) {
  check_embedding_forward(a);
  check_segments(a.segments, a.n * a.t, a.t, "embedding_forward");
  parallel_items(a.n * a.t, a.n * a.t * a.c, [&](int64_t row) {
    const float* token = a.wte + static_cast<int64_t>(a.tokens[row]) * a.c;
    if (a.wpe == nullptr) {  // no position table (Llama)
      std::copy_n(token, a.c, a.y + row * a.c);
      return;
    }
    const int64_t p = position_of(a.segments, row, a.t);
    add_rows(token, a.wpe + p * a.c, a.y + row * a.c, a.c);
  });
}

void run(PlanCache&, const EmbeddingBackward& a) {
  check_embedding_backward(a);
  check_segments(a.segments, a.n * a.t, a.t, "embedding_backward");
  const int64_t rows = a.n * a.t, c = a.c;
  // The rows of each token and of each position, in increasing (n, t) order.
  std::vector<int64_t> start, order;
  rows_by_key(
      rows, a.vocab, [&](int64_t r) { return a.tokens[r]; }, start, order);
  parallel_items(a.vocab, rows * c + (a.accumulate_wte ? 0 : a.vocab * c), [&](int64_t v) {
    float* out = a.dwte + v * c;
    // Each dy row is added onto the row in (n, t) order, from 0 or (accumulating) from what the
    // tied head wrote: the CUDA kernel's order too.
    if (!a.accumulate_wte) zero_row(out, c);
    for (int64_t i = start[v]; i < start[v + 1]; ++i) accumulate_row(a.dy + order[i] * c, out, c);
  });
  if (a.dwpe == nullptr) return;  // no position table (Llama)
  rows_by_key(
      rows, a.t, [&](int64_t r) { return position_of(a.segments, r, a.t); }, start, order);
  parallel_items(a.context, rows * c, [&](int64_t p) {
    float* out = a.dwpe + p * c;
    zero_row(out, c);
    if (p >= a.t) return;
    for (int64_t i = start[p]; i < start[p + 1]; ++i) accumulate_row(a.dy + order[i] * c, out, c);
  });
}

void run(PlanCache&, const LayerNormForward& a) {
  check_layer_norm_forward(a);
  const int64_t c = a.g.c;
  parallel_items(a.g.rows, a.g.rows * c * 3, [&](int64_t r) {
    row_stats(a.x + r * c, c, a.g.eps, &a.mean[r], &a.rstd[r]);
    normalize_row(a.x + r * c, a.gamma, a.beta, c, a.mean[r], a.rstd[r], a.y + r * c);
  });
}

void run(PlanCache&, const LayerNormBackward& a) {
  check_layer_norm_backward(a);
  const int64_t rows = a.g.rows, c = a.g.c;
  const int64_t blocks = (rows + kLayerNormBlockRows - 1) / kLayerNormBlockRows;
  // Per block: dgamma's partial sums, then dbeta's (Note [Layer norm's gradient order]).
  // (The vector is this thread's; the workers see its data through `base`.)
  thread_local std::vector<float> partial;
  thread_local std::vector<double> acc;
  partial.assign(blocks * 2 * c, 0.0f);
  acc.resize(c);
  float* base = partial.data();
  parallel_items(blocks, rows * c * 4, [&](int64_t b) {
    float* pg = base + b * 2 * c;
    for (int64_t r = b * kLayerNormBlockRows; r < std::min(rows, (b + 1) * kLayerNormBlockRows);
         ++r) {
      layer_norm_backward_row(a.x + r * c, a.dy + r * c, a.gamma, c, a.mean[r], a.rstd[r],
                              a.dx + r * c, pg, pg + c);
    }
  });
  sum_blocks(base, blocks, 2 * c, c, acc.data(), a.dgamma);
  sum_blocks(base + c, blocks, 2 * c, c, acc.data(), a.dbeta);
}

void run(PlanCache&, const GeluForward& a) {
  check_gelu_forward(a);
  parallel_chunks(a.n, kParallelGrain / 4,
                  [&](int64_t b, int64_t e) { gelu(a.x + b, a.y + b, e - b); });
}

void run(PlanCache&, const GeluBackward& a) {
  check_gelu_backward(a);
  parallel_chunks(a.n, kParallelGrain / 4,
                  [&](int64_t b, int64_t e) { gelu_grad(a.x + b, a.dy + b, a.dx + b, e - b); });
}

}  // namespace ferry::cpu
