// Pooling entry points. Average pooling forward on oneDNN when its divisor equals PyTorch's for
// the geometry, loops otherwise; average backward and adaptive average pooling as loops, one
// (n, c) plane per work item; max pooling in kernels_maxpool.cc.
#include <cstring>

#include "device/cpu/cpu_kernels_impl.h"
#include "device/cpu/parallel.h"
#include "device/cpu/pool_windows.h"
#include "device/kernel_checks.h"

namespace ferry::cpu {
namespace {

// The right padding oneDNN needs for `out` windows: at least the nominal padding, more in
// ceil mode when the last window runs past it.
int64_t right_pad(int64_t in, int64_t k, int64_t s, int64_t p, int64_t out) {
  return std::max(p, (out - 1) * s + k - in - p);
}

// Whether oneDNN's average pooling computes exactly PyTorch's result for g: without padding in
// the divisor always; with it oneDNN divides by the whole kernel, PyTorch by the part inside the
// padded input, so only when every window ends inside it. (Max pooling never: oneDNN drops NaN.)
bool onednn_matches(const PoolGeom& g) {
  if (g.kind == PoolKind::kMax) return false;
  if (!g.count_include_pad) return true;
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
    const auto alg = g.count_include_pad ? dnnl::algorithm::pooling_avg_include_padding
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

float avg_divisor(const PoolGeom& g, const Window& wh, const Window& ww) {
  const int64_t count =
      g.count_include_pad ? wh.padded * ww.padded : (wh.end - wh.start) * (ww.end - ww.start);
  return static_cast<float>(count);
}

void avg_pool_forward_loops(const PoolForward& a) {
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
        float sum = 0.0f;
        for (int64_t ih = wh.start; ih < wh.end; ++ih) {
          for (int64_t iw = ww.start; iw < ww.end; ++iw) sum += x[ih * g.w + iw];
        }
        y[i * ow + j] = sum / avg_divisor(g, wh, ww);
      }
    }
  });
}

// Adaptive pooling's cell [start, end) along one axis.
int64_t cell_start(int64_t o, int64_t in, int64_t out) { return (o * in) / out; }
int64_t cell_end(int64_t o, int64_t in, int64_t out) { return ((o + 1) * in + out - 1) / out; }

}  // namespace

void run(PlanCache& plans, const PoolForward& a) {
  check_pool_geom(a.g, "pool_forward");
  if (a.g.kind == PoolKind::kMax) {
    max_pool_forward(a);
    return;
  }
  auto plan = forward_plan(plans, a.g);
  if (plan->plan) {
    plan->plan->execute({{DNNL_ARG_SRC, a.x}, {DNNL_ARG_DST, a.y}}, Workspace{}, "pool_forward");
  } else {
    avg_pool_forward_loops(a);
  }
}

void run(PlanCache&, const PoolBackward& a) {
  const PoolGeom& g = a.g;
  check_pool_geom(g, "pool_backward");
  if (g.kind == PoolKind::kMax) {
    max_pool_backward(a);
    return;
  }
  const int64_t oh = g.out_h(), ow = g.out_w();
  const Windows windows(g);
  parallel_items(g.n * g.c, g.n * g.c * g.h * g.w, [&](int64_t p) {
    const float* dy = a.dy + p * oh * ow;
    float* dx = a.dx + p * g.h * g.w;
    std::memset(dx, 0, sizeof(float) * g.h * g.w);
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
  check_adaptive_avg_pool(a.n, a.c, a.h, a.w, a.oh, a.ow, "adaptive_avg_pool_forward");
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
  check_adaptive_avg_pool(a.n, a.c, a.h, a.w, a.oh, a.ow, "adaptive_avg_pool_backward");
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
