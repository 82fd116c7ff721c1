// Llama kernels on the CPU (kernels_llama.h): RMSNorm, rotary embeddings into the attention's qkv
// with grouped-query heads repeated, and SwiGLU's gate, as plain loops. Every sum runs inside one
// work item in a fixed order, so results do not depend on the threads.
#include <algorithm>
#include <cmath>
#include <vector>

#include "device/cpu/cpu_kernels_impl.h"
#include "device/cpu/parallel.h"
#include "device/cpu/simd.h"
#include "device/cpu/vec_math.h"
#include "device/kernel_checks.h"

namespace ferry::cpu {
namespace {

// ---- RMSNorm ----

// 1 / sqrt(mean(x^2) + eps) of one row, the mean in float64 lanes (vec_math.h).
FERRY_SIMD_CLONES float row_rstd(const float* x, int64_t c, float eps) {
  double lanes[kLanes] = {};
  const int64_t body = c / kLanes * kLanes;
  for (int64_t i = 0; i < body; i += kLanes) {
    for (int l = 0; l < kLanes; ++l) {
      const double v = static_cast<double>(x[i + l]);
      lanes[l] += v * v;
    }
  }
  for (int64_t i = body; i < c; ++i) {
    const double v = static_cast<double>(x[i]);
    lanes[i - body] += v * v;
  }
  const double ms = lane_total(lanes) / static_cast<double>(c);
  return static_cast<float>(1.0 / std::sqrt(ms + static_cast<double>(eps)));
}

FERRY_SIMD_CLONES void scale_row(const float* x, const float* w, int64_t c, float rstd, float* y) {
  for (int64_t i = 0; i < c; ++i) y[i] = (x[i] * rstd) * w[i];
}

// Note [RMSNorm's gradient order]
// As Note [Layer norm's gradient order] in kernels_transformer.cc: dweight is summed per block of
// kRmsNormBlockRows rows in float (fused with dx), then the blocks in order in float64.
constexpr int64_t kRmsNormBlockRows = 32;

// One row: dx = rstd * (g - xhat * mean(g * xhat)), g = dy * w; dy * xhat added to pw. dx may be
// dy.
FERRY_SIMD_CLONES void rms_norm_backward_row(const float* x, const float* dy, const float* w,
                                             int64_t c, float rstd, float* dx,
                                             float* __restrict pw) {
  float sum_gx[kLanes] = {};
  const int64_t body = c / kLanes * kLanes;
  for (int64_t i = 0; i < body; i += kLanes) {
    for (int l = 0; l < kLanes; ++l) sum_gx[l] += (dy[i + l] * w[i + l]) * (x[i + l] * rstd);
  }
  for (int64_t i = body; i < c; ++i) sum_gx[i - body] += (dy[i] * w[i]) * (x[i] * rstd);
  const float mgx = lane_total(sum_gx) / static_cast<float>(c);
  for (int64_t i = 0; i < c; ++i) {
    const float d = dy[i];
    const float xhat = x[i] * rstd;
    pw[i] += d * xhat;
    dx[i] = rstd * (d * w[i] - xhat * mgx);
  }
}

// ---- rotary embeddings ----

// cos and sin of position p's angles, table[p * D + i] (cos) and table[p * D + D/2 + i] (sin)
// for i < D/2 and p < T (Note [Rotary embeddings into the attention's qkv]).
std::vector<float> rope_table(const RopeGeom& g) {
  const int64_t half = g.head_dim / 2;
  std::vector<float> inv(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i) {
    // transformers: 1.0 / (base ** (arange(0, D, 2).float() / D)), in float32.
    const float e = static_cast<float>(2 * i) / static_cast<float>(g.head_dim);
    const float pw = static_cast<float>(std::pow(static_cast<double>(g.theta), double{e}));
    inv[i] = 1.0f / pw;
  }
  std::vector<float> table(static_cast<size_t>(g.t * g.head_dim));
  for (int64_t p = 0; p < g.t; ++p) {
    for (int64_t i = 0; i < half; ++i) {
      const double angle = static_cast<double>(static_cast<float>(p) * inv[i]);
      table[p * g.head_dim + i] = static_cast<float>(std::cos(angle));
      table[p * g.head_dim + half + i] = static_cast<float>(std::sin(angle));
    }
  }
  return table;
}

FERRY_SIMD_CLONES void rotate(const float* x, const float* cs, int64_t half, float* y) {
  const float* sn = cs + half;
  for (int64_t i = 0; i < half; ++i) {
    y[i] = x[i] * cs[i] - x[i + half] * sn[i];
    y[i + half] = x[i + half] * cs[i] + x[i] * sn[i];
  }
}

FERRY_SIMD_CLONES void rotate_back(const float* d, const float* cs, int64_t half, float* y) {
  const float* sn = cs + half;
  for (int64_t i = 0; i < half; ++i) {
    y[i] = d[i] * cs[i] + d[i + half] * sn[i];
    y[i + half] = d[i + half] * cs[i] - d[i] * sn[i];
  }
}

// y = the sum of `count` rows of x `stride` apart, in increasing order (from the first).
FERRY_SIMD_CLONES void sum_repeats(const float* x, int64_t stride, int64_t count, int64_t d,
                                   float* y) {
  for (int64_t i = 0; i < d; ++i) y[i] = x[i];
  for (int64_t r = 1; r < count; ++r) {
    for (int64_t i = 0; i < d; ++i) y[i] += x[r * stride + i];
  }
}

int64_t rope_position(const int32_t* segments, int64_t row, int64_t t) {
  return segments == nullptr ? row % t : row % t - segments[row];
}

// ---- SwiGLU ----

FERRY_SIMD_CLONES void swiglu(const float* g, const float* u, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = g[i] / (1.0f + exp_approx(-g[i])) * u[i];
}

FERRY_SIMD_CLONES void swiglu_grad(const float* g, const float* u, const float* dy, float* dg,
                                   float* __restrict du, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float d = dy[i];
    const float sig = 1.0f / (1.0f + exp_approx(-g[i]));
    const float silu = g[i] * sig;
    du[i] = d * silu;
    dg[i] = d * u[i] * (sig * (1.0f + g[i] * (1.0f - sig)));
  }
}

}  // namespace

void run(PlanCache&, const RmsNormForward& a) {
  check_rms_norm_forward(a);
  const int64_t c = a.g.c;
  parallel_items(a.g.rows, a.g.rows * c * 2, [&](int64_t r) {
    a.rstd[r] = row_rstd(a.x + r * c, c, a.g.eps);
    scale_row(a.x + r * c, a.weight, c, a.rstd[r], a.y + r * c);
  });
}

void run(PlanCache&, const RmsNormBackward& a) {
  check_rms_norm_backward(a);
  const int64_t rows = a.g.rows, c = a.g.c;
  const int64_t blocks = (rows + kRmsNormBlockRows - 1) / kRmsNormBlockRows;
  thread_local std::vector<float> partial;
  partial.assign(blocks * c, 0.0f);
  float* base = partial.data();
  parallel_items(blocks, rows * c * 4, [&](int64_t b) {
    for (int64_t r = b * kRmsNormBlockRows; r < std::min(rows, (b + 1) * kRmsNormBlockRows); ++r) {
      rms_norm_backward_row(a.x + r * c, a.dy + r * c, a.weight, c, a.rstd[r], a.dx + r * c,
                            base + b * c);
    }
  });
  parallel_chunks(c, 256, [&](int64_t j0, int64_t j1) {
    for (int64_t j = j0; j < j1; ++j) {
      double acc = 0.0;
      for (int64_t b = 0; b < blocks; ++b) acc += static_cast<double>(base[b * c + j]);
      a.dweight[j] = static_cast<float>(acc);
    }
  });
}

void run(PlanCache&, const RopeQkvForward& a) {
  check_rope_qkv_forward(a);
  const RopeGeom& g = a.g;
  const int64_t rows = g.n * g.t, d = g.head_dim, half = d / 2, qw = g.q_width(),
                kvw = g.kv_width(), rep = g.heads / g.kv_heads;
  check_segments(a.segments, rows, g.t, "rope_qkv_forward");
  const std::vector<float> table = rope_table(g);
  parallel_items(rows, rows * 3 * qw, [&](int64_t r) {
    const float* cs = table.data() + rope_position(a.segments, r, g.t) * d;
    float* out = a.qkv + r * 3 * qw;
    for (int64_t h = 0; h < g.heads; ++h) {
      const int64_t kv = h / rep;
      rotate(a.q + r * qw + h * d, cs, half, out + h * d);
      rotate(a.k + r * kvw + kv * d, cs, half, out + qw + h * d);
      std::copy_n(a.v + r * kvw + kv * d, d, out + 2 * qw + h * d);
    }
  });
}

void run(PlanCache&, const RopeQkvBackward& a) {
  check_rope_qkv_backward(a);
  const RopeGeom& g = a.g;
  const int64_t rows = g.n * g.t, d = g.head_dim, half = d / 2, qw = g.q_width(),
                kvw = g.kv_width(), rep = g.heads / g.kv_heads;
  check_segments(a.segments, rows, g.t, "rope_qkv_backward");
  const std::vector<float> table = rope_table(g);
  parallel_items(rows, rows * 3 * qw, [&](int64_t r) {
    const float* cs = table.data() + rope_position(a.segments, r, g.t) * d;
    const float* in = a.dqkv + r * 3 * qw;
    if (a.dq != nullptr) {
      for (int64_t h = 0; h < g.heads; ++h)
        rotate_back(in + h * d, cs, half, a.dq + r * qw + h * d);
    }
    thread_local std::vector<float> sum;  // one KV head's summed repeats
    sum.resize(static_cast<size_t>(d));
    float* s = sum.data();
    for (int64_t kv = 0; kv < g.kv_heads; ++kv) {
      if (a.dk != nullptr) {
        sum_repeats(in + qw + kv * rep * d, d, rep, d, s);
        rotate_back(s, cs, half, a.dk + r * kvw + kv * d);
      }
      if (a.dv != nullptr)
        sum_repeats(in + 2 * qw + kv * rep * d, d, rep, d, a.dv + r * kvw + kv * d);
    }
  });
}

void run(PlanCache&, const SwigluForward& a) {
  check_swiglu_forward(a);
  parallel_chunks(a.n, kParallelGrain / 4,
                  [&](int64_t b, int64_t e) { swiglu(a.gate + b, a.up + b, a.y + b, e - b); });
}

void run(PlanCache&, const SwigluBackward& a) {
  check_swiglu_backward(a);
  parallel_chunks(a.n, kParallelGrain / 4, [&](int64_t b, int64_t e) {
    swiglu_grad(a.gate + b, a.up + b, a.dy + b, a.dgate + b, a.dup + b, e - b);
  });
}

}  // namespace ferry::cpu
