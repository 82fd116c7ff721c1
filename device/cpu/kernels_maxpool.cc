// Max pooling, forward and backward, with PyTorch's rule: a window's value and gradient target
// is its first maximum in row-major order, found from x, NaN winning. One (n, c) plane per work
// item, so overlapping windows never race. See Note [Max pooling without oneDNN].
#include <cstring>
#include <limits>
#include <vector>

#include "device/cpu/cpu_kernels_impl.h"
#include "device/cpu/parallel.h"
#include "device/cpu/pool_windows.h"
#include "device/cpu/simd.h"

// Note [Max pooling without oneDNN]
// oneDNN's max pooling drops NaN (max(1, NaN, 3, 2) = 3) where PyTorch propagates it, so a
// diverged run would look healthy; and its backward needs the forward's workspace, which
// PoolForward does not have. Finding a first maximum with scalar compares is branchy and slow
// on random data, so both passes update a running maximum for a block of windows at once with
// selects, which vectorize: 2x2 stride-2 windows (VGG) straight from the rows, any other
// geometry through a staging of each window element as a row of the plane's outputs.

namespace ferry::cpu {
namespace {

constexpr float kLowest = -std::numeric_limits<float>::infinity();

// Whether `v` replaces the running maximum `best` (PyTorch: strictly greater, or NaN).
[[gnu::always_inline]] inline bool replaces(float v, float best) { return (v > best) | (v != v); }

// ---- 2x2 windows at stride 2, all inside the input ------------------------------------------

bool is_tiled_2x2(const PoolGeom& g) {
  return g.kh == 2 && g.kw == 2 && g.stride_h == 2 && g.stride_w == 2 && g.pad_h == 0 &&
         g.pad_w == 0 && 2 * g.out_h() <= g.h && 2 * g.out_w() <= g.w;
}

// One window (a b / c d): its maximum, and dy routed to its first maximum. t_k says element k
// replaces the running maximum; the last replacement is the first maximum. Selects only.
[[gnu::always_inline]] inline float max_2x2(float a, float b, float c, float d) {
  float best = a;
  best = replaces(b, best) ? b : best;
  best = replaces(c, best) ? c : best;
  return replaces(d, best) ? d : best;
}

[[gnu::always_inline]] inline void route_2x2(float a, float b, float c, float d, float grad,
                                             float& ga, float& gb, float& gc, float& gd) {
  float best = a;
  const bool t1 = replaces(b, best);
  best = t1 ? b : best;
  const bool t2 = replaces(c, best);
  best = t2 ? c : best;
  const bool t3 = replaces(d, best);
  gd = t3 ? grad : 0.0f;
  grad = t3 ? 0.0f : grad;
  gc = t2 ? grad : 0.0f;
  grad = t2 ? 0.0f : grad;
  gb = t1 ? grad : 0.0f;
  ga = t1 ? 0.0f : grad;
}

// One output row from input rows x0, x1.
FERRY_SIMD_CLONES void forward_2x2_row(const float* x0, const float* x1, float* y, int64_t ow) {
  for (int64_t j = 0; j < ow; ++j) {
    y[j] = max_2x2(x0[2 * j], x0[2 * j + 1], x1[2 * j], x1[2 * j + 1]);
  }
}

// One output row's gradients into rows d0, d1 (written, not accumulated).
FERRY_SIMD_CLONES void backward_2x2_row(const float* x0, const float* x1, const float* dy,
                                        float* d0, float* d1, int64_t ow) {
  for (int64_t j = 0; j < ow; ++j) {
    route_2x2(x0[2 * j], x0[2 * j + 1], x1[2 * j], x1[2 * j + 1], dy[j], d0[2 * j], d0[2 * j + 1],
              d1[2 * j], d1[2 * j + 1]);
  }
}

// Planes with short rows (OW < kBlock): windows are staged kBlock at a time across rows into
// local blocks so the selects run as whole vectors. dy and dx are null in the forward pass, y in
// the backward pass.
constexpr int kBlock = 16;

FERRY_SIMD_CLONES void short_rows_2x2(const float* x, int64_t oh, int64_t ow, int64_t w, float* y,
                                      const float* dy, float* dx) {
  const int64_t n = oh * ow;
  int64_t i = 0, j = 0;  // the output at q0
  for (int64_t q0 = 0; q0 < n; q0 += kBlock) {
    float a[kBlock] = {}, b[kBlock] = {}, c[kBlock] = {}, d[kBlock] = {}, g[kBlock] = {};
    int64_t at[kBlock];
    const int m = static_cast<int>(std::min<int64_t>(kBlock, n - q0));
    for (int l = 0; l < m; ++l) {
      at[l] = 2 * i * w + 2 * j;
      a[l] = x[at[l]];
      b[l] = x[at[l] + 1];
      c[l] = x[at[l] + w];
      d[l] = x[at[l] + w + 1];
      if (dy) g[l] = dy[q0 + l];
      if (++j == ow) {
        j = 0;
        ++i;
      }
    }
    if (y) {
      float best[kBlock];
      for (int l = 0; l < kBlock; ++l) best[l] = max_2x2(a[l], b[l], c[l], d[l]);
      for (int l = 0; l < m; ++l) y[q0 + l] = best[l];
      continue;
    }
    float ga[kBlock], gb[kBlock], gc[kBlock], gd[kBlock];
    for (int l = 0; l < kBlock; ++l) {
      route_2x2(a[l], b[l], c[l], d[l], g[l], ga[l], gb[l], gc[l], gd[l]);
    }
    for (int l = 0; l < m; ++l) {
      dx[at[l]] = ga[l];
      dx[at[l] + 1] = gb[l];
      dx[at[l] + w] = gc[l];
      dx[at[l] + w + 1] = gd[l];
    }
  }
}

void forward_2x2_plane(const PoolGeom& g, const float* x, float* y) {
  const int64_t oh = g.out_h(), ow = g.out_w();
  if (ow < kBlock) {
    short_rows_2x2(x, oh, ow, g.w, y, nullptr, nullptr);
    return;
  }
  for (int64_t i = 0; i < oh; ++i) {
    forward_2x2_row(x + 2 * i * g.w, x + (2 * i + 1) * g.w, y + i * ow, ow);
  }
}

void backward_2x2_plane(const PoolGeom& g, const float* x, const float* dy, float* dx) {
  const int64_t oh = g.out_h(), ow = g.out_w();
  // A leftover last row or column belongs to no window.
  if (2 * oh < g.h || 2 * ow < g.w) std::memset(dx, 0, sizeof(float) * g.h * g.w);
  if (ow < kBlock) {
    short_rows_2x2(x, oh, ow, g.w, nullptr, dy, dx);
    return;
  }
  for (int64_t i = 0; i < oh; ++i) {
    const int64_t row = 2 * i * g.w;
    backward_2x2_row(x + row, x + row + g.w, dy + i * ow, dx + row, dx + row + g.w, ow);
  }
}

// ---- any geometry ----------------------------------------------------------------------------

// For each output q < n (n a multiple of kBlock): over the k staged rows of n values, best[q] and
// arg[q] (the winning window position) are updated in order.
FERRY_SIMD_CLONES void argmax_rows(const float* stage, int64_t k, int64_t n, float* best,
                                   int32_t* arg) {
  for (int64_t e = 0; e < k; ++e) {
    const int32_t pos = static_cast<int32_t>(e);
    for (int64_t b = 0; b < n; b += kBlock) {
      const float* v = stage + e * n + b;
      float* bb = best + b;
      int32_t* ab = arg + b;
      for (int64_t l = 0; l < kBlock; ++l) {
        const bool take = replaces(v[l], bb[l]);
        bb[l] = take ? v[l] : bb[l];
        ab[l] = take ? pos : ab[l];
      }
    }
  }
}

// The first maximum of every window of one plane x (H, W): value in best[q] and window position
// (r * kw + c) in arg[q], q = i * OW + j. Window elements outside the input are staged as -inf,
// which never replaces; the scan starts, as PyTorch's, at the window's first element inside.
struct PlaneArgmax {
  std::vector<float> stage, best;
  std::vector<int32_t> arg;

  void run(const PoolGeom& g, const Windows& windows, const float* x) {
    const int64_t oh = g.out_h(), ow = g.out_w(), k = g.kh * g.kw;
    const int64_t n = align_up(oh * ow, kBlock);
    stage.assign(k * n, kLowest);
    best.assign(n, kLowest);
    arg.assign(n, 0);
    for (int64_t i = 0; i < oh; ++i) {
      const Window& wh = windows.rows[i];
      const int64_t top = i * g.stride_h - g.pad_h;  // window origin, may lie in the padding
      for (int64_t ih = wh.start; ih < wh.end; ++ih) {
        const float* row = x + ih * g.w;
        for (int64_t j = 0; j < ow; ++j) {
          const Window& ww = windows.cols[j];
          const int64_t left = j * g.stride_w - g.pad_w;
          float* out = stage.data() + ((ih - top) * g.kw + (ww.start - left)) * n + i * ow + j;
          for (int64_t iw = ww.start; iw < ww.end; ++iw, out += n) *out = row[iw];
        }
      }
      for (int64_t j = 0; j < ow; ++j) {
        const int64_t left = j * g.stride_w - g.pad_w;
        arg[i * ow + j] =
            static_cast<int32_t>((wh.start - top) * g.kw + (windows.cols[j].start - left));
      }
    }
    argmax_rows(stage.data(), k, n, best.data(), arg.data());
  }
};

}  // namespace

void max_pool_forward(const PoolForward& a) {
  const PoolGeom& g = a.g;
  const int64_t in = g.h * g.w, out = g.out_h() * g.out_w();
  const bool tiled = is_tiled_2x2(g);
  const Windows windows(g);
  parallel_items(g.n * g.c, g.n * g.c * in, [&](int64_t p) {
    const float* x = a.x + p * in;
    float* y = a.y + p * out;
    if (tiled) {
      forward_2x2_plane(g, x, y);
      return;
    }
    thread_local PlaneArgmax argmax;
    argmax.run(g, windows, x);
    std::memcpy(y, argmax.best.data(), sizeof(float) * out);
  });
}

void max_pool_backward(const PoolBackward& a) {
  const PoolGeom& g = a.g;
  const int64_t in = g.h * g.w, oh = g.out_h(), ow = g.out_w();
  const bool tiled = is_tiled_2x2(g);
  const Windows windows(g);
  // Window position -> offset from the window's origin in the plane.
  std::vector<int64_t> offset(g.kh * g.kw);
  for (int64_t e = 0; e < g.kh * g.kw; ++e) offset[e] = (e / g.kw) * g.w + e % g.kw;
  parallel_items(g.n * g.c, g.n * g.c * in, [&](int64_t p) {
    const float* x = a.x + p * in;
    const float* dy = a.dy + p * oh * ow;
    float* dx = a.dx + p * in;
    if (tiled) {
      backward_2x2_plane(g, x, dy, dx);
      return;
    }
    thread_local PlaneArgmax argmax;
    argmax.run(g, windows, x);
    std::memset(dx, 0, sizeof(float) * in);
    for (int64_t i = 0; i < oh; ++i) {
      const int64_t origin = (i * g.stride_h - g.pad_h) * g.w - g.pad_w;
      for (int64_t j = 0; j < ow; ++j) {
        dx[origin + j * g.stride_w + offset[argmax.arg[i * ow + j]]] += dy[i * ow + j];
      }
    }
  });
}

}  // namespace ferry::cpu
