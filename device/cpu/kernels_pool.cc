// Pooling: forward on oneDNN when its semantics equal PyTorch's for the geometry, plain loops
// otherwise; backward (PyTorch's first-maximum rule, found from x) and adaptive average pooling
// as loops, one (n, c) plane per work item so overlapping windows never race.
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include <fmt/format.h>

#include "device/cpu/cpu_kernels_impl.h"
#include "device/cpu/parallel.h"
#include "device/cpu/simd.h"

namespace ferry::cpu {
namespace {

void check(const PoolGeom& g, const char* what) {
  const bool ok = g.n >= 1 && g.c >= 1 && g.h >= 1 && g.w >= 1 && g.kh >= 1 && g.kw >= 1 &&
                  g.stride_h >= 1 && g.stride_w >= 1 && g.pad_h >= 0 && g.pad_w >= 0 &&
                  2 * g.pad_h <= g.kh && 2 * g.pad_w <= g.kw && g.out_h() >= 1 && g.out_w() >= 1;
  if (!ok) {
    throw ConfigError(
        fmt::format("{}: invalid pooling (N={} C={} H={} W={} kernel {}x{} stride {}x{} pad {}x{})",
                    what, g.n, g.c, g.h, g.w, g.kh, g.kw, g.stride_h, g.stride_w, g.pad_h, g.pad_w),
        "sizes and strides must be positive, padding at most half the kernel (as in PyTorch), "
        "and the kernel no larger than the padded input");
  }
}

// The right padding oneDNN needs for `out` windows: at least the nominal padding, more in
// ceil mode when the last window runs past it.
int64_t right_pad(int64_t in, int64_t k, int64_t s, int64_t p, int64_t out) {
  return std::max(p, (out - 1) * s + k - in - p);
}

// Whether oneDNN's pooling computes exactly PyTorch's result for g: max pooling and average
// pooling without padding in the divisor always do; with padding in the divisor oneDNN divides
// by the whole kernel, PyTorch by the part inside the padded input, so only when every window
// ends inside it.
bool onednn_matches(const PoolGeom& g) {
  if (g.kind == PoolKind::kMax || !g.count_include_pad) return true;
  return right_pad(g.h, g.kh, g.stride_h, g.pad_h, g.out_h()) <= g.pad_h &&
         right_pad(g.w, g.kw, g.stride_w, g.pad_w, g.out_w()) <= g.pad_w;
}

// The forward primitive, or none when oneDNN does not match or does not take the geometry.
struct PoolPlan {
  std::optional<PrimitivePlan> plan;
};

std::shared_ptr<const PoolPlan> forward_plan(PlanCache& plans, const PoolGeom& g) {
  const PlanKey k =
      make_key({kernel_kind<PoolForward>(), static_cast<int64_t>(g.kind), g.n, g.c, g.h, g.w, g.kh,
                g.kw, g.stride_h, g.stride_w, g.pad_h, g.pad_w, g.ceil_mode, g.count_include_pad});
  return plans.plan<PoolPlan>(k, [&] {
    PoolPlan result;
    if (!onednn_matches(g)) return result;
    const auto src = plain_desc({g.n, g.c, g.h, g.w});
    const auto dst = plain_desc({g.n, g.c, g.out_h(), g.out_w()});
    const auto alg = g.kind == PoolKind::kMax ? dnnl::algorithm::pooling_max
                     : g.count_include_pad    ? dnnl::algorithm::pooling_avg_include_padding
                                              : dnnl::algorithm::pooling_avg_exclude_padding;
    const dnnl::memory::dims pad_r{right_pad(g.h, g.kh, g.stride_h, g.pad_h, g.out_h()),
                                   right_pad(g.w, g.kw, g.stride_w, g.pad_w, g.out_w())};
    try {
      // No Workspace in PoolForward: oneDNN owns the scratchpad (library mode).
      PrimitivePlan plan(/*user_scratchpad=*/false);
      const dnnl::pooling_forward::desc desc(dnnl::prop_kind::forward_inference, alg, src, dst,
                                             {g.stride_h, g.stride_w}, {g.kh, g.kw},
                                             {g.pad_h, g.pad_w}, pad_r);
      const dnnl::pooling_forward::primitive_desc pd(desc, plan.attr(), cpu_engine());
      plan.add(DNNL_ARG_SRC, false, src, pd.src_desc());
      plan.add(DNNL_ARG_DST, true, dst, pd.dst_desc());
      plan.finish(dnnl::pooling_forward(pd), pd.scratchpad_desc());
      result.plan = std::move(plan);
    } catch (const dnnl::error&) {
      // oneDNN rejects some legal PyTorch geometries; the loops handle every one.
    }
    return result;
  });
}

// Window bounds along one axis, PyTorch's way: [start, end) clipped to the input, and the
// window's extent within the padded input (for count_include_pad).
struct Window {
  int64_t start, end, padded;
};

Window window(int64_t o, int64_t in, int64_t k, int64_t s, int64_t p) {
  int64_t start = o * s - p;
  int64_t padded_end = std::min(start + k, in + p);
  Window win{std::max<int64_t>(start, 0), std::min(padded_end, in), padded_end - start};
  return win;
}

// The index in the plane of the window's maximum: the first in row-major order, NaN winning as
// in PyTorch (a NaN replaces the maximum, later NaNs replace it again). For the forward loops,
// which run only for geometries oneDNN does not take; the backward uses the vectorized forms
// below.
int64_t window_argmax(const float* plane, int64_t w, const Window& wh, const Window& ww) {
  float best = -std::numeric_limits<float>::infinity();
  int64_t best_idx = wh.start * w + ww.start;
  for (int64_t ih = wh.start; ih < wh.end; ++ih) {
    const float* row = plane + ih * w;
    for (int64_t iw = ww.start; iw < ww.end; ++iw) {
      const float v = row[iw];
      const bool take = (v > best) | (v != v);
      best = take ? v : best;
      best_idx = take ? ih * w + iw : best_idx;
    }
  }
  return best_idx;
}

// The windows of every output row and column, computed once per launch.
struct Windows {
  std::vector<Window> rows, cols;
  explicit Windows(const PoolGeom& g) {
    for (int64_t i = 0; i < g.out_h(); ++i)
      rows.push_back(window(i, g.h, g.kh, g.stride_h, g.pad_h));
    for (int64_t j = 0; j < g.out_w(); ++j)
      cols.push_back(window(j, g.w, g.kw, g.stride_w, g.pad_w));
  }
};

// Note [Max pool backward across a plane of windows]
// Finding each window's first maximum with scalar compares is branchy and slow on random data.
// Instead the K = kh * kw window elements of every output of a plane are staged as K rows of
// the plane's outputs (-inf where a window leaves the input, rows padded to whole blocks), and
// the running maximum and its window position are updated for a block of outputs at once with
// selects, which vectorize. The rule is PyTorch's: a later element wins only when it is strictly
// greater or NaN.

inline constexpr int64_t kArgmaxBlock = 16;

// For each output j < n (a multiple of kArgmaxBlock): over the k staged rows of n values,
// best[j] and arg[j] (the winning window position).
FERRY_SIMD_CLONES void argmax_rows(const float* stage, int64_t k, int64_t n, float* best,
                                   int32_t* arg) {
  for (int64_t e = 0; e < k; ++e) {
    const int32_t pos = static_cast<int32_t>(e);
    for (int64_t b = 0; b < n; b += kArgmaxBlock) {
      const float* v = stage + e * n + b;
      float* bb = best + b;
      int32_t* ab = arg + b;
      for (int64_t l = 0; l < kArgmaxBlock; ++l) {
        const bool take = (v[l] > bb[l]) | (v[l] != v[l]);
        bb[l] = take ? v[l] : bb[l];
        ab[l] = take ? pos : ab[l];
      }
    }
  }
}

// dx (H, W) of one plane, zeroed by the caller, receives dy (OH, OW) at each window's first
// maximum in x (H, W).
void max_pool_backward_plane(const PoolGeom& g, const Windows& windows, const float* x,
                             const float* dy, float* dx) {
  const int64_t oh = g.out_h(), ow = g.out_w(), k = g.kh * g.kw;
  const int64_t n = align_up(oh * ow, kArgmaxBlock);
  thread_local std::vector<float> stage, best;
  thread_local std::vector<int32_t> arg;
  constexpr float kLowest = -std::numeric_limits<float>::infinity();
  stage.assign(k * n, kLowest);
  best.assign(n, kLowest);
  arg.assign(n, 0);
  for (int64_t i = 0; i < oh; ++i) {
    const Window& wh = windows.rows[i];
    const int64_t top = i * g.stride_h - g.pad_h;  // window origin, may be in the padding
    for (int64_t ih = wh.start; ih < wh.end; ++ih) {
      const float* row = x + ih * g.w;
      for (int64_t j = 0; j < ow; ++j) {
        const Window& ww = windows.cols[j];
        const int64_t left = j * g.stride_w - g.pad_w;
        float* out = stage.data() + ((ih - top) * g.kw + (ww.start - left)) * n + i * ow + j;
        for (int64_t iw = ww.start; iw < ww.end; ++iw, out += n) *out = row[iw];
      }
    }
    // PyTorch starts from the window's first element inside the input.
    for (int64_t j = 0; j < ow; ++j) {
      const int64_t left = j * g.stride_w - g.pad_w;
      arg[i * ow + j] =
          static_cast<int32_t>((wh.start - top) * g.kw + (windows.cols[j].start - left));
    }
  }
  argmax_rows(stage.data(), k, n, best.data(), arg.data());
  // Window position -> offset from the window's origin in the plane (no division per output).
  thread_local std::vector<int64_t> offset;
  offset.resize(k);
  for (int64_t e = 0; e < k; ++e) offset[e] = (e / g.kw) * g.w + e % g.kw;
  for (int64_t i = 0; i < oh; ++i) {
    const int64_t origin = (i * g.stride_h - g.pad_h) * g.w - g.pad_w;
    for (int64_t j = 0; j < ow; ++j) {
      dx[origin + j * g.stride_w + offset[arg[i * ow + j]]] += dy[i * ow + j];
    }
  }
}

// Whether g is 2x2 windows at stride 2 without padding that all lie inside the input (VGG's
// pooling): each input element then belongs to at most one window.
bool is_tiled_2x2(const PoolGeom& g) {
  return g.kh == 2 && g.kw == 2 && g.stride_h == 2 && g.stride_w == 2 && g.pad_h == 0 &&
         g.pad_w == 0 && 2 * g.out_h() <= g.h && 2 * g.out_w() <= g.w;
}

// PyTorch's first-maximum rule for one 2x2 window (a b / c d), as selects only so that loops
// over windows vectorize: t_k says element k replaces the running maximum (strictly greater, or
// NaN); the last replacement is the first maximum, and the gradient is routed back to it.
[[gnu::always_inline]] inline void route_2x2(float a, float b, float c, float d, float grad,
                                             float& ga, float& gb, float& gc, float& gd) {
  float best = a;
  const bool t1 = (b > best) | (b != b);
  best = t1 ? b : best;
  const bool t2 = (c > best) | (c != c);
  best = t2 ? c : best;
  const bool t3 = (d > best) | (d != d);
  gd = t3 ? grad : 0.0f;
  grad = t3 ? 0.0f : grad;
  gc = t2 ? grad : 0.0f;
  grad = t2 ? 0.0f : grad;
  gb = t1 ? grad : 0.0f;
  ga = t1 ? 0.0f : grad;
}

// Tiled 2x2 windows along one output row: x0, x1 the two input rows, d0, d1 their gradients
// (written, not accumulated).
FERRY_SIMD_CLONES void max_pool_backward_2x2_row(const float* x0, const float* x1, const float* dy,
                                                 float* d0, float* d1, int64_t ow) {
  for (int64_t j = 0; j < ow; ++j) {
    route_2x2(x0[2 * j], x0[2 * j + 1], x1[2 * j], x1[2 * j + 1], dy[j], d0[2 * j], d0[2 * j + 1],
              d1[2 * j], d1[2 * j + 1]);
  }
}

// Tiled 2x2 max pooling backward of a plane with short rows (OW < 16): windows are staged 16 at
// a time across rows into local blocks, so the routing runs as whole vectors.
FERRY_SIMD_CLONES void max_pool_backward_2x2_short_rows(const float* x, const float* dy, float* dx,
                                                        int64_t oh, int64_t ow, int64_t w) {
  constexpr int kBlock = 16;
  const int64_t n = oh * ow;
  int64_t i = 0, j = 0;  // the output of q0
  for (int64_t q0 = 0; q0 < n; q0 += kBlock) {
    float a[kBlock] = {}, b[kBlock] = {}, c[kBlock] = {}, d[kBlock] = {}, g[kBlock] = {};
    float ga[kBlock], gb[kBlock], gc[kBlock], gd[kBlock];
    int64_t at[kBlock];
    const int m = static_cast<int>(std::min<int64_t>(kBlock, n - q0));
    for (int l = 0; l < m; ++l) {
      at[l] = 2 * i * w + 2 * j;
      a[l] = x[at[l]], b[l] = x[at[l] + 1], c[l] = x[at[l] + w], d[l] = x[at[l] + w + 1];
      g[l] = dy[q0 + l];
      if (++j == ow) {
        j = 0;
        ++i;
      }
    }
    for (int l = 0; l < kBlock; ++l)
      route_2x2(a[l], b[l], c[l], d[l], g[l], ga[l], gb[l], gc[l], gd[l]);
    for (int l = 0; l < m; ++l) {
      dx[at[l]] = ga[l], dx[at[l] + 1] = gb[l], dx[at[l] + w] = gc[l], dx[at[l] + w + 1] = gd[l];
    }
  }
}

// Tiled 2x2 max pooling backward of one plane: dx (H, W) from x (H, W) and dy (OH, OW).
void max_pool_backward_2x2_plane(const PoolGeom& g, const float* x, const float* dy, float* dx) {
  const int64_t oh = g.out_h(), ow = g.out_w();
  if (2 * oh < g.h || 2 * ow < g.w) std::memset(dx, 0, sizeof(float) * g.h * g.w);
  if (ow < 16) {
    max_pool_backward_2x2_short_rows(x, dy, dx, oh, ow, g.w);
    return;
  }
  for (int64_t i = 0; i < oh; ++i) {
    const int64_t row = 2 * i * g.w;
    max_pool_backward_2x2_row(x + row, x + row + g.w, dy + i * ow, dx + row, dx + row + g.w, ow);
  }
}

float avg_divisor(const PoolGeom& g, const Window& wh, const Window& ww) {
  const int64_t count =
      g.count_include_pad ? wh.padded * ww.padded : (wh.end - wh.start) * (ww.end - ww.start);
  return static_cast<float>(count);
}

void pool_forward_loops(const PoolForward& a) {
  const PoolGeom& g = a.g;
  const int64_t oh = g.out_h(), ow = g.out_w();
  const Windows windows(g);
  parallel_items(g.n * g.c, g.n * g.c * g.h * g.w, [&](int64_t p) {
    const float* x = a.x + p * g.h * g.w;
    float* y = a.y + p * oh * ow;
    for (int64_t i = 0; i < oh; ++i) {
      const Window& wh = windows.rows[i];
      for (int64_t j = 0; j < ow; ++j) {
        const Window& ww = windows.cols[j];
        if (g.kind == PoolKind::kMax) {
          y[i * ow + j] = x[window_argmax(x, g.w, wh, ww)];
          continue;
        }
        float sum = 0.0f;
        for (int64_t ih = wh.start; ih < wh.end; ++ih) {
          for (int64_t iw = ww.start; iw < ww.end; ++iw) sum += x[ih * g.w + iw];
        }
        y[i * ow + j] = sum / avg_divisor(g, wh, ww);
      }
    }
  });
}

void check_adaptive(int64_t n, int64_t c, int64_t h, int64_t w, int64_t oh, int64_t ow,
                    const char* what) {
  if (n < 1 || c < 1 || h < 1 || w < 1 || oh < 1 || ow < 1) {
    throw ConfigError(
        fmt::format("{}: invalid shape N={} C={} H={} W={} output {}x{}", what, n, c, h, w, oh, ow),
        "every size must be positive");
  }
}

// Adaptive pooling's cell [start, end) along one axis.
int64_t cell_start(int64_t o, int64_t in, int64_t out) { return (o * in) / out; }
int64_t cell_end(int64_t o, int64_t in, int64_t out) { return ((o + 1) * in + out - 1) / out; }

}  // namespace

void run(PlanCache& plans, const PoolForward& a) {
  check(a.g, "pool_forward");
  auto plan = forward_plan(plans, a.g);
  if (plan->plan) {
    plan->plan->execute({{DNNL_ARG_SRC, a.x}, {DNNL_ARG_DST, a.y}}, Workspace{}, "pool_forward");
  } else {
    pool_forward_loops(a);
  }
}

void run(PlanCache&, const PoolBackward& a) {
  const PoolGeom& g = a.g;
  check(g, "pool_backward");
  const int64_t oh = g.out_h(), ow = g.out_w();
  const Windows windows(g);
  const bool tiled_2x2 = g.kind == PoolKind::kMax && is_tiled_2x2(g);
  parallel_items(g.n * g.c, g.n * g.c * g.h * g.w, [&](int64_t p) {
    const float* x = a.x + p * g.h * g.w;
    const float* dy = a.dy + p * oh * ow;
    float* dx = a.dx + p * g.h * g.w;
    if (tiled_2x2) {
      max_pool_backward_2x2_plane(g, x, dy, dx);
      return;
    }
    std::memset(dx, 0, sizeof(float) * g.h * g.w);
    if (g.kind == PoolKind::kMax) {
      max_pool_backward_plane(g, windows, x, dy, dx);
      return;
    }
    for (int64_t i = 0; i < oh; ++i) {
      const Window& wh = windows.rows[i];
      for (int64_t j = 0; j < ow; ++j) {
        const Window& ww = windows.cols[j];
        const float grad = dy[i * ow + j] / avg_divisor(g, wh, ww);
        for (int64_t ih = wh.start; ih < wh.end; ++ih) {
          for (int64_t iw = ww.start; iw < ww.end; ++iw) dx[ih * g.w + iw] += grad;
        }
      }
    }
  });
}

void run(PlanCache&, const AdaptiveAvgPoolForward& a) {
  check_adaptive(a.n, a.c, a.h, a.w, a.oh, a.ow, "adaptive_avg_pool_forward");
  parallel_items(a.n * a.c, a.n * a.c * a.h * a.w, [&](int64_t p) {
    const float* x = a.x + p * a.h * a.w;
    float* y = a.y + p * a.oh * a.ow;
    for (int64_t i = 0; i < a.oh; ++i) {
      const int64_t h0 = cell_start(i, a.h, a.oh), h1 = cell_end(i, a.h, a.oh);
      for (int64_t j = 0; j < a.ow; ++j) {
        const int64_t w0 = cell_start(j, a.w, a.ow), w1 = cell_end(j, a.w, a.ow);
        float sum = 0.0f;
        for (int64_t ih = h0; ih < h1; ++ih) {
          for (int64_t iw = w0; iw < w1; ++iw) sum += x[ih * a.w + iw];
        }
        y[i * a.ow + j] = sum / static_cast<float>((h1 - h0) * (w1 - w0));
      }
    }
  });
}

void run(PlanCache&, const AdaptiveAvgPoolBackward& a) {
  check_adaptive(a.n, a.c, a.h, a.w, a.oh, a.ow, "adaptive_avg_pool_backward");
  parallel_items(a.n * a.c, a.n * a.c * a.h * a.w, [&](int64_t p) {
    const float* dy = a.dy + p * a.oh * a.ow;
    float* dx = a.dx + p * a.h * a.w;
    std::memset(dx, 0, sizeof(float) * a.h * a.w);
    for (int64_t i = 0; i < a.oh; ++i) {
      const int64_t h0 = cell_start(i, a.h, a.oh), h1 = cell_end(i, a.h, a.oh);
      for (int64_t j = 0; j < a.ow; ++j) {
        const int64_t w0 = cell_start(j, a.w, a.ow), w1 = cell_end(j, a.w, a.ow);
        const float grad = dy[i * a.ow + j] / static_cast<float>((h1 - h0) * (w1 - w0));
        for (int64_t ih = h0; ih < h1; ++ih) {
          for (int64_t iw = w0; iw < w1; ++iw) dx[ih * a.w + iw] += grad;
        }
      }
    }
  });
}

}  // namespace ferry::cpu
