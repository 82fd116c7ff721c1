// Transformer kernels on the CPU: GPT-2's embedding, layer norm and GELU as plain loops (the
// attention core is in kernels_attention.cc), and the gradient-clipping reductions. Every sum runs
// inside one work item in a fixed order, so results do not depend on the threads.
#include <cmath>
#include <vector>

#include "common/error.h"
#include "device/cpu/cpu_kernels_impl.h"
#include "device/cpu/parallel.h"
#include "device/cpu/simd.h"
#include "device/cpu/vec_math.h"
#include "device/kernel_checks.h"

namespace ferry::cpu {
namespace {

template <typename Args>
[[noreturn]] void not_yet(const Args& a) {
  throw UnsupportedError(std::string(kernel_name(KernelArgs(a))) + " is not written yet on the CPU",
                         "use a model without transformer layers");
}

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

// ---- layer norm ----
// Row sums use kLanes float64 lanes (lane l adds elements l, l + kLanes, ... in order) added
// by a pairwise tree: a fixed order that vectorizes.

constexpr int kLanes = 16;

double lane_total(double* lanes) {
  for (int half = kLanes / 2; half > 0; half /= 2) {
    for (int l = 0; l < half; ++l) lanes[l] += lanes[l + half];
  }
  return lanes[0];
}

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

// dx for one row: rstd * (g - mean(g) - xhat * mean(g * xhat)), g = dy * gamma. dx may be dy.
FERRY_SIMD_CLONES void layer_norm_dx_row(const float* x, const float* dy, const float* gamma,
                                         int64_t c, float mean, float rstd, float* dx) {
  double sum_g[kLanes] = {}, sum_gx[kLanes] = {};
  auto add = [&](int64_t i, int l) {
    const float g = dy[i] * gamma[i];
    const float xhat = (x[i] - mean) * rstd;
    sum_g[l] += static_cast<double>(g);
    sum_gx[l] += static_cast<double>(g * xhat);
  };
  const int64_t body = c / kLanes * kLanes;
  for (int64_t i = 0; i < body; i += kLanes) {
    for (int l = 0; l < kLanes; ++l) add(i + l, l);
  }
  for (int64_t i = body; i < c; ++i) add(i, static_cast<int>(i - body));
  const float mg = static_cast<float>(lane_total(sum_g) / static_cast<double>(c));
  const float mgx = static_cast<float>(lane_total(sum_gx) / static_cast<double>(c));
  for (int64_t i = 0; i < c; ++i) {
    const float xhat = (x[i] - mean) * rstd;
    dx[i] = rstd * (dy[i] * gamma[i] - mg - xhat * mgx);
  }
}

// dgamma, dbeta for columns [begin, end): sums over the rows in order, in float64.
FERRY_SIMD_CLONES void layer_norm_dparams(const float* x, const float* dy, const float* mean,
                                          const float* rstd, int64_t rows, int64_t c, int64_t begin,
                                          int64_t end, double* acc_g, double* acc_b, float* dgamma,
                                          float* dbeta) {
  const int64_t w = end - begin;
  for (int64_t j = 0; j < w; ++j) acc_g[j] = acc_b[j] = 0.0;
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * c + begin;
    const float* dyr = dy + r * c + begin;
    const float m = mean[r], s = rstd[r];
    for (int64_t j = 0; j < w; ++j) {
      acc_g[j] += static_cast<double>(dyr[j] * ((xr[j] - m) * s));
      acc_b[j] += static_cast<double>(dyr[j]);
    }
  }
  for (int64_t j = 0; j < w; ++j) {
    dgamma[begin + j] = static_cast<float>(acc_g[j]);
    dbeta[begin + j] = static_cast<float>(acc_b[j]);
  }
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

void run(PlanCache&, const EmbeddingForward& a) {
  check_embedding_forward(a);
  parallel_items(a.n * a.t, a.n * a.t * a.c, [&](int64_t row) {
    const int64_t t = row % a.t;
    add_rows(a.wte + static_cast<int64_t>(a.tokens[row]) * a.c, a.wpe + t * a.c, a.y + row * a.c,
             a.c);
  });
}

void run(PlanCache&, const EmbeddingBackward& a) {
  check_embedding_backward(a);
  const int64_t rows = a.n * a.t, c = a.c;
  // The positions of each token, in increasing (n, t) order (a counting sort).
  std::vector<int64_t> start(a.vocab + 1, 0), positions(rows);
  for (int64_t r = 0; r < rows; ++r) ++start[a.tokens[r] + 1];
  for (int64_t v = 0; v < a.vocab; ++v) start[v + 1] += start[v];
  {
    std::vector<int64_t> next(start.begin(), start.end() - 1);
    for (int64_t r = 0; r < rows; ++r) positions[next[a.tokens[r]]++] = r;
  }
  parallel_items(a.vocab, rows * c + (a.accumulate_wte ? 0 : a.vocab * c), [&](int64_t v) {
    float* out = a.dwte + v * c;
    const int64_t b = start[v], e = start[v + 1];
    if (b == e) {
      if (!a.accumulate_wte) zero_row(out, c);
      return;
    }
    if (!a.accumulate_wte) {
      zero_row(out, c);
      for (int64_t i = b; i < e; ++i) accumulate_row(a.dy + positions[i] * c, out, c);
      return;
    }
    std::vector<float> sum(c, 0.0f);
    for (int64_t i = b; i < e; ++i) accumulate_row(a.dy + positions[i] * c, sum.data(), c);
    accumulate_row(sum.data(), out, c);
  });
  parallel_items(a.context, a.n * a.t * c, [&](int64_t t) {
    float* out = a.dwpe + t * c;
    zero_row(out, c);
    if (t >= a.t) return;
    for (int64_t n = 0; n < a.n; ++n) accumulate_row(a.dy + (n * a.t + t) * c, out, c);
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
  // dgamma and dbeta first: dx may overwrite dy.
  constexpr int64_t kBlock = 64;  // columns per work item
  parallel_items((c + kBlock - 1) / kBlock, rows * c * 2, [&](int64_t blk) {
    double acc_g[kBlock], acc_b[kBlock];
    const int64_t begin = blk * kBlock;
    layer_norm_dparams(a.x, a.dy, a.mean, a.rstd, rows, c, begin, std::min(c, begin + kBlock),
                       acc_g, acc_b, a.dgamma, a.dbeta);
  });
  parallel_items(rows, rows * c * 3, [&](int64_t r) {
    layer_norm_dx_row(a.x + r * c, a.dy + r * c, a.gamma, c, a.mean[r], a.rstd[r], a.dx + r * c);
  });
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

void run(PlanCache&, const SumOfSquares& a) { not_yet(a); }
void run(PlanCache&, const ClipByNorm& a) { not_yet(a); }

}  // namespace ferry::cpu
