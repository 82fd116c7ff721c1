// Host side of the CUDA backend's stateless kernels: argument checks with the CPU backend's
// errors, then the launch (kernel_ops.h). Nothing here waits for the device; a check that needs
// device data (a label out of range) is reported through the result instead (NaN loss).
#include "device/cuda/cuda_ops.h"

#include <cmath>
#include <cstdint>

#include <fmt/format.h>

#include "common/error.h"
#include "device/cuda/cuda_check.h"
#include "device/cuda/elementwise.h"
#include "device/cuda/kernel_ops.h"

namespace ferry::cuda {
namespace {

void check_n(int64_t n, const char* what) {
  if (n < 0) {
    throw ConfigError(fmt::format("{}: negative element count {}", what, n),
                      "pass the tensor's element count");
  }
}

void check_pool(const PoolGeom& g, const char* what) {
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

PoolShape pool_shape(const PoolGeom& g) {
  PoolShape s;
  s.max = g.kind == PoolKind::kMax;
  s.planes = g.n * g.c;
  s.h = g.h;
  s.w = g.w;
  s.oh = g.out_h();
  s.ow = g.out_w();
  s.kh = g.kh;
  s.kw = g.kw;
  s.stride_h = g.stride_h;
  s.stride_w = g.stride_w;
  s.pad_h = g.pad_h;
  s.pad_w = g.pad_w;
  s.count_include_pad = g.count_include_pad;
  return s;
}

void check_adaptive(int64_t n, int64_t c, int64_t h, int64_t w, int64_t oh, int64_t ow,
                    const char* what) {
  if (n < 1 || c < 1 || h < 1 || w < 1 || oh < 1 || ow < 1) {
    throw ConfigError(
        fmt::format("{}: invalid shape N={} C={} H={} W={} output {}x{}", what, n, c, h, w, oh, ow),
        "every size must be positive");
  }
}

BatchNormShape bn_shape(const BatchNormGeom& g, const char* what) {
  if (g.n < 1 || g.c < 1 || g.hw < 1) {
    throw ConfigError(fmt::format("{}: bad shape N={} C={} HW={}", what, g.n, g.c, g.hw),
                      "every dimension of a batch norm input must be at least 1");
  }
  if (g.n * g.hw > int64_t{UINT32_MAX}) {
    throw UnsupportedError(
        fmt::format("{}: {} values per channel (N={} H*W={}) exceed the CUDA kernel's 32-bit "
                    "channel index",
                    what, g.n * g.hw, g.n, g.hw),
        "lower data.batch_size");
  }
  return {g.n, g.c, g.hw, g.eps};
}

void check_loss(int64_t n, int64_t k, const char* what) {
  if (n < 1 || k < 1) {
    throw ConfigError(fmt::format("{}: invalid shape N={} K={}", what, n, k),
                      "rows and classes must be positive");
  }
}

}  // namespace

void run(const PoolForward& a, cudaStream_t stream) {
  check_pool(a.g, "pool_forward");
  launch_pool_forward(pool_shape(a.g), a.x, a.y, stream);
}

void run(const PoolBackward& a, cudaStream_t stream) {
  check_pool(a.g, "pool_backward");
  FERRY_ASSERT(a.g.kind != PoolKind::kMax || a.x != nullptr, "max pool backward needs x");
  launch_pool_backward(pool_shape(a.g), a.x, a.dy, a.dx, stream);
}

void run(const AdaptiveAvgPoolForward& a, cudaStream_t stream) {
  check_adaptive(a.n, a.c, a.h, a.w, a.oh, a.ow, "adaptive_avg_pool_forward");
  launch_adaptive_avg_pool_forward(a.n * a.c, a.h, a.w, a.oh, a.ow, a.x, a.y, stream);
}

void run(const AdaptiveAvgPoolBackward& a, cudaStream_t stream) {
  check_adaptive(a.n, a.c, a.h, a.w, a.oh, a.ow, "adaptive_avg_pool_backward");
  launch_adaptive_avg_pool_backward(a.n * a.c, a.h, a.w, a.oh, a.ow, a.dy, a.dx, stream);
}

void run(const BatchNormForwardTraining& a, cudaStream_t stream) {
  const BatchNormShape s = bn_shape(a.g, "batch_norm_forward_training");
  if (s.n * s.hw < 2) {
    throw ConfigError(fmt::format("batch_norm_forward_training: one value per channel (N={}, "
                                  "H*W={}) has no variance",
                                  s.n, s.hw),
                      "train with a batch size above 1 or use the layer in eval mode");
  }
  launch_batch_norm_forward_training(s, a.momentum, a.x, a.gamma, a.beta, a.y, a.running_mean,
                                     a.running_var, a.save_mean, a.save_var, stream);
}

void run(const BatchNormForwardInference& a, cudaStream_t stream) {
  const BatchNormShape s = bn_shape(a.g, "batch_norm_forward_inference");
  launch_batch_norm_forward_inference(s, a.x, a.gamma, a.beta, a.running_mean, a.running_var, a.y,
                                      stream);
}

void run(const BatchNormBackward& a, cudaStream_t stream) {
  const BatchNormShape s = bn_shape(a.g, "batch_norm_backward");
  launch_batch_norm_backward(s, a.x, a.dy, a.gamma, a.save_mean, a.save_var, a.dx, a.dgamma,
                             a.dbeta, stream);
}

void run(const ReluForward& a, cudaStream_t stream) {
  check_n(a.n, "relu_forward");
  launch_relu_forward(a.n, a.x, a.y, stream);
}

void run(const ReluBackward& a, cudaStream_t stream) {
  check_n(a.n, "relu_backward");
  launch_relu_backward(a.n, a.y, a.dy, a.dx, stream);
}

void run(const AddForward& a, cudaStream_t stream) {
  check_n(a.n, "add_forward");
  launch_add(a.n, a.a, a.b, a.y, stream);
}

void run(const Accumulate& a, cudaStream_t stream) {
  check_n(a.n, "accumulate");
  launch_accumulate(a.n, a.x, a.y, stream);
}

void run(const CopyDevice& a, cudaStream_t stream) {
  if (a.bytes == 0) return;
  CUDA_CHECK(cudaMemcpyAsync(a.dst, a.src, a.bytes, cudaMemcpyDeviceToDevice, stream));
}

void run(const Fill& a, cudaStream_t stream) {
  check_n(a.n, "fill");
  launch_fill(a.y, a.n, a.value, stream);
}

void run(const Scale& a, cudaStream_t stream) {
  check_n(a.n, "scale");
  launch_scale(a.y, a.n, a.alpha, stream);
}

void run(const DropoutForward& a, cudaStream_t stream) {
  check_n(a.n, "dropout_forward");
  if (!(a.p >= 0.0f && a.p <= 1.0f)) {
    throw ConfigError(fmt::format("dropout_forward: p = {} is not a probability", a.p),
                      "set the dropout probability in [0, 1]");
  }
  launch_dropout_forward(a.n, a.p, a.seed, a.offset, a.x, a.y, a.mask, stream);
}

void run(const DropoutBackward& a, cudaStream_t stream) {
  check_n(a.n, "dropout_backward");
  launch_dropout_backward(a.n, a.p, a.dy, a.mask, a.dx, stream);
}

void run(const SoftmaxCrossEntropyForward& a, cudaStream_t stream) {
  check_loss(a.n, a.k, "softmax_cross_entropy_forward");
  launch_softmax_cross_entropy_forward(a.n, a.k, a.logits, a.labels, a.loss, a.probs, a.correct,
                                       stream);
}

void run(const SoftmaxCrossEntropyBackward& a, cudaStream_t stream) {
  check_loss(a.n, a.k, "softmax_cross_entropy_backward");
  const float factor = a.scale / static_cast<float>(a.n);
  launch_softmax_cross_entropy_backward(a.n, a.k, factor, a.probs, a.labels, a.dlogits, stream);
}

void run(const SgdUpdate& a, cudaStream_t stream) {
  if (a.n < 0) throw ConfigError(fmt::format("sgd_update: negative element count {}", a.n));
  if (a.momentum != 0.0f && a.momentum_buf == nullptr) {
    throw ConfigError("sgd_update: momentum is set but there is no momentum buffer",
                      "allocate the optimizer state before the first step");
  }
  launch_sgd_update(a.n, a.lr, a.momentum, a.weight_decay, a.nesterov, a.param, a.grad,
                    a.momentum_buf, stream);
}

// The scalars as the CPU backend computes them (double, as Python does, then rounded).
void run(const AdamWUpdate& a, cudaStream_t stream) {
  if (a.n < 0) throw ConfigError(fmt::format("adamw_update: negative element count {}", a.n));
  if (a.step < 1) {
    throw ConfigError(fmt::format("adamw_update: step {} (steps count from 1)", a.step),
                      "pass the number of this update, starting at 1");
  }
  const double lr = a.lr, b1 = a.beta1, b2 = a.beta2;
  const double bias1 = 1.0 - std::pow(b1, static_cast<double>(a.step));
  const double bias2 = 1.0 - std::pow(b2, static_cast<double>(a.step));
  AdamScalars s;
  s.decay = static_cast<float>(1.0 - lr * static_cast<double>(a.weight_decay));
  s.beta1 = a.beta1;
  s.one_minus_beta1 = static_cast<float>(1.0 - b1);
  s.beta2 = a.beta2;
  s.one_minus_beta2 = static_cast<float>(1.0 - b2);
  s.bias2_sqrt = static_cast<float>(std::sqrt(bias2));
  s.eps = a.eps;
  s.neg_step_size = static_cast<float>(-(lr / bias1));
  launch_adamw_update(a.n, s, a.param, a.grad, a.m, a.v, stream);
}

}  // namespace ferry::cuda
