// Batch normalisation on plain NCHW: one channel per work item (statistics, then the normalised
// output while the channel is still in cache), sums in double in the CUDA kernels' order (Note
// [Batch norm's summation order]), so results depend on neither threads nor backend. Plain loops,
// not oneDNN: see Note [Batch norm without oneDNN].
#include <algorithm>
#include <cmath>

#include "device/batch_norm_order.h"
#include "device/cpu/cpu_kernels_impl.h"
#include "device/cpu/parallel.h"
#include "device/cpu/simd.h"
#include "device/kernel_checks.h"

// Note [Batch norm without oneDNN]
// On plain NCHW, oneDNN 2.6 runs batch norm with its generic ncsp implementation; measured on
// (64, 64, 32, 32), one thread, CPU time: 13.0 ms forward / 14.2 ms backward, against 5.3 / 6.3 ms
// for these loops (and 9.5 / 7.1 ms for PyTorch 1.13's own kernels). oneDNN's fast version needs
// blocked layouts, i.e. a reorder in and out, more traffic than the whole kernel. Each channel
// is read once from memory and then from cache, which is the bandwidth floor.

namespace ferry::cpu {
namespace {

// A channel of an (N, C, HW) tensor: `planes` runs of `hw` floats, `stride` apart. Sums follow
// Note [Batch norm's summation order] (device/batch_norm_order.h), as the CUDA kernels do, so
// both backends give the same bits; they depend on the shape and values only.

// Calls body(offset, lane, len) for the runs of chunk [begin, end) of a channel: `len`
// consecutive values at `offset` from the channel's first value, taken by lanes lane, lane + 1,
// ..., in the chunk's order.
template <typename Body>
void for_each_run(int64_t begin, int64_t end, int64_t hw, int64_t stride, const Body& body) {
  int64_t plane = begin / hw, i = begin - plane * hw;
  for (int64_t e = begin; e < end;) {
    const int64_t lane = (e - begin) % kBatchNormLanes;
    const int64_t len = std::min({kBatchNormLanes - lane, hw - i, end - e});
    body(plane * stride + i, lane, len);
    e += len;
    i += len;
    if (i == hw) {
      i = 0;
      ++plane;
    }
  }
}

// The lanes' pairwise tree; returns the chunk's sum.
double lane_tree(double* lanes) {
  for (int half = kBatchNormLanes / 2; half > 0; half /= 2) {
    for (int l = 0; l < half; ++l) lanes[l] += lanes[l + half];
  }
  return lanes[0];
}

FERRY_SIMD_CLONES void add_values(double* acc, const float* x, int64_t len) {
  for (int64_t t = 0; t < len; ++t) acc[t] += static_cast<double>(x[t]);
}

FERRY_SIMD_CLONES void add_sq_devs(double* acc, const float* x, int64_t len, double mean) {
  for (int64_t t = 0; t < len; ++t) {
    const double d = static_cast<double>(x[t]) - mean;
    acc[t] += d * d;
  }
}

FERRY_SIMD_CLONES void add_grads(double* a, double* b, const float* x, const float* dy, int64_t len,
                                 double mean) {
  for (int64_t t = 0; t < len; ++t) {
    const double g = static_cast<double>(dy[t]);
    a[t] += g;
    b[t] += g * (static_cast<double>(x[t]) - mean);
  }
}

// The sum over the channel of what add(acc + lane, offset, len) accumulates for each run of
// values, chunk by chunk in the shared order.
template <typename Add>
double chunked_sum(int64_t planes, int64_t stride, int64_t hw, const BatchNormSplit& split,
                   const Add& add) {
  const int64_t count = planes * hw;
  double total = 0.0;
  for (int64_t begin = 0; begin < count; begin += split.len) {
    double acc[kBatchNormLanes] = {};
    for_each_run(begin, std::min(count, begin + split.len), hw, stride,
                 [&](int64_t at, int64_t lane, int64_t len) { add(acc + lane, at, len); });
    total += lane_tree(acc);
  }
  return total;
}

// Returns the sum of the channel.
double channel_sum(const float* x, int64_t planes, int64_t stride, int64_t hw,
                   const BatchNormSplit& split) {
  return chunked_sum(planes, stride, hw, split,
                     [&](double* acc, int64_t at, int64_t len) { add_values(acc, x + at, len); });
}

// Returns the sum of (x - mean)^2 over the channel.
double channel_sq_dev(const float* x, int64_t planes, int64_t stride, int64_t hw, double mean,
                      const BatchNormSplit& split) {
  return chunked_sum(planes, stride, hw, split, [&](double* acc, int64_t at, int64_t len) {
    add_sq_devs(acc, x + at, len, mean);
  });
}

// Sums dy into *sum_dy and dy * (x - mean) into *sum_dyx over the channel.
void channel_grad_sums(const float* x, const float* dy, int64_t planes, int64_t stride, int64_t hw,
                       double mean, const BatchNormSplit& split, double* sum_dy, double* sum_dyx) {
  const int64_t count = planes * hw;
  double total_a = 0.0, total_b = 0.0;
  for (int64_t begin = 0; begin < count; begin += split.len) {
    double a[kBatchNormLanes] = {}, b[kBatchNormLanes] = {};
    for_each_run(begin, std::min(count, begin + split.len), hw, stride,
                 [&](int64_t at, int64_t lane, int64_t len) {
                   add_grads(a + lane, b + lane, x + at, dy + at, len, mean);
                 });
    total_a += lane_tree(a);
    total_b += lane_tree(b);
  }
  *sum_dy = total_a;
  *sum_dyx = total_b;
}

// y = (x - mean) * scale + shift over the channel.
FERRY_SIMD_CLONES void channel_normalize(const float* x, float* y, int64_t planes, int64_t stride,
                                         int64_t hw, float mean, float scale, float shift) {
  for (int64_t p = 0; p < planes; ++p, x += stride, y += stride) {
    for (int64_t i = 0; i < hw; ++i) y[i] = (x[i] - mean) * scale + shift;
  }
}

// dx = (dy - mean_dy - (x - mean) * k2) * k1 over the channel.
FERRY_SIMD_CLONES void channel_grad_input(const float* x, const float* dy, float* dx,
                                          int64_t planes, int64_t stride, int64_t hw, float mean,
                                          float mean_dy, float k1, float k2) {
  for (int64_t p = 0; p < planes; ++p, x += stride, dy += stride, dx += stride) {
    for (int64_t i = 0; i < hw; ++i) dx[i] = (dy[i] - mean_dy - (x[i] - mean) * k2) * k1;
  }
}

}  // namespace

void run(PlanCache&, const BatchNormForwardTraining& a) {
  const BatchNormGeom& g = a.g;
  check_batch_norm_training_geom(g);
  const int64_t count = g.n * g.hw;
  const double momentum = a.momentum;
  const double unbias = static_cast<double>(count) / static_cast<double>(count - 1);
  const BatchNormSplit split = batch_norm_split(count, g.c);
  parallel_items(g.c, g.n * g.c * g.hw, [&](int64_t c) {
    const float* x = a.x + c * g.hw;
    const int64_t stride = g.c * g.hw;
    const double mean = channel_sum(x, g.n, stride, g.hw, split) / static_cast<double>(count);
    const double var =
        channel_sq_dev(x, g.n, stride, g.hw, mean, split) / static_cast<double>(count);
    const double invstd = 1.0 / std::sqrt(var + static_cast<double>(g.eps));
    const float mean_f = static_cast<float>(mean);
    const float scale = static_cast<float>(static_cast<double>(a.gamma[c]) * invstd);
    const float shift = a.beta[c];
    channel_normalize(x, a.y + c * g.hw, g.n, stride, g.hw, mean_f, scale, shift);
    a.save_mean[c] = mean_f;
    a.save_var[c] = static_cast<float>(var);
    if (a.running_mean != nullptr) {
      a.running_mean[c] =
          static_cast<float>((1.0 - momentum) * a.running_mean[c] + momentum * mean);
    }
    if (a.running_var != nullptr) {
      a.running_var[c] =
          static_cast<float>((1.0 - momentum) * a.running_var[c] + momentum * var * unbias);
    }
  });
}

void run(PlanCache&, const BatchNormForwardInference& a) {
  const BatchNormGeom& g = a.g;
  check_batch_norm_geom(g, "batch_norm_forward_inference");
  parallel_items(g.c, g.n * g.c * g.hw, [&](int64_t c) {
    const double invstd =
        1.0 / std::sqrt(static_cast<double>(a.running_var[c]) + static_cast<double>(g.eps));
    const float scale = static_cast<float>(static_cast<double>(a.gamma[c]) * invstd);
    channel_normalize(a.x + c * g.hw, a.y + c * g.hw, g.n, g.c * g.hw, g.hw, a.running_mean[c],
                      scale, a.beta[c]);
  });
}

void run(PlanCache&, const BatchNormBackward& a) {
  const BatchNormGeom& g = a.g;
  check_batch_norm_geom(g, "batch_norm_backward");
  const double count = static_cast<double>(g.n * g.hw);
  const BatchNormSplit split = batch_norm_split(g.n * g.hw, g.c);
  parallel_items(g.c, 2 * g.n * g.c * g.hw, [&](int64_t c) {
    const double mean = a.save_mean[c];
    const double invstd =
        1.0 / std::sqrt(static_cast<double>(a.save_var[c]) + static_cast<double>(g.eps));
    const int64_t off = c * g.hw, stride = g.c * g.hw;
    double sum_dy = 0.0, sum_dyx = 0.0;
    channel_grad_sums(a.x + off, a.dy + off, g.n, stride, g.hw, mean, split, &sum_dy, &sum_dyx);
    a.dbeta[c] = static_cast<float>(sum_dy);
    a.dgamma[c] = static_cast<float>(sum_dyx * invstd);
    const float k1 = static_cast<float>(static_cast<double>(a.gamma[c]) * invstd);
    const float k2 = static_cast<float>(invstd * invstd * sum_dyx / count);
    const float mean_dy = static_cast<float>(sum_dy / count);
    channel_grad_input(a.x + off, a.dy + off, a.dx + off, g.n, stride, g.hw, a.save_mean[c],
                       mean_dy, k1, k2);
  });
}

}  // namespace ferry::cpu
