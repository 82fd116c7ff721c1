// The backend-neutral kernel argument checks (kernel_checks.h): one message per rule, whichever
// backend runs the kernel.
#include "device/kernel_checks.h"

#include <fmt/format.h>

#include "common/bytes.h"
#include "common/error.h"

namespace ferry {

void check_workspace(const Workspace& ws, uint64_t need, std::string_view what,
                     std::string_view geometry) {
  if (need > 0 && (ws.ptr == nullptr || ws.bytes < need)) {
    throw UnsupportedError(
        fmt::format("{} needs {} bytes ({}) of workspace{}{}, was given {} bytes", what, need,
                    format_bytes(need), geometry.empty() ? "" : " for ", geometry,
                    ws.ptr != nullptr ? ws.bytes : 0),
        "size args.ws with Kernels::workspace_bytes(args) and allocate it on the device");
  }
}

void check_element_count(int64_t n, const char* what) {
  if (n < 0) {
    throw ConfigError(fmt::format("{}: negative element count {}", what, n),
                      "pass the tensor's element count");
  }
}

void check_dropout_forward(const DropoutForward& a) {
  check_element_count(a.n, "dropout_forward");
  if (!(a.p >= 0.0f && a.p <= 1.0f)) {
    throw ConfigError(fmt::format("dropout_forward: p = {} is not a probability", a.p),
                      "set the dropout probability in [0, 1]");
  }
}

std::string conv_geom_text(const ConvGeom& g) {
  return fmt::format("N={} C={} H={} W={} K={} {}x{} stride {}x{} pad {}x{} groups {}", g.n, g.c,
                     g.h, g.w, g.k, g.r, g.s, g.stride_h, g.stride_w, g.pad_h, g.pad_w, g.groups);
}

void check_conv_geom(const ConvGeom& g, const char* what) {
  const bool ok = g.n >= 1 && g.c >= 1 && g.h >= 1 && g.w >= 1 && g.k >= 1 && g.r >= 1 &&
                  g.s >= 1 && g.stride_h >= 1 && g.stride_w >= 1 && g.pad_h >= 0 && g.pad_w >= 0 &&
                  g.groups >= 1 && g.c % g.groups == 0 && g.k % g.groups == 0 && g.out_h() >= 1 &&
                  g.out_w() >= 1 && g.h + 2 * g.pad_h >= g.r && g.w + 2 * g.pad_w >= g.s;
  if (!ok) {
    throw ConfigError(fmt::format("{}: invalid convolution ({})", what, conv_geom_text(g)),
                      "sizes and strides must be positive, channels divisible by groups, and "
                      "the kernel no larger than the padded input");
  }
}

void check_linear_geom(const LinearGeom& g, const char* what) {
  if (g.m < 1 || g.k < 1 || g.n < 1) {
    throw ConfigError(fmt::format("{}: invalid shape M={} K={} N={}", what, g.m, g.k, g.n),
                      "batch rows and feature counts must be positive");
  }
}

void check_pool_geom(const PoolGeom& g, const char* what) {
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

void check_adaptive_avg_pool(int64_t n, int64_t c, int64_t h, int64_t w, int64_t oh, int64_t ow,
                             const char* what) {
  if (n < 1 || c < 1 || h < 1 || w < 1 || oh < 1 || ow < 1) {
    throw ConfigError(
        fmt::format("{}: invalid shape N={} C={} H={} W={} output {}x{}", what, n, c, h, w, oh, ow),
        "every size must be positive");
  }
}

void check_batch_norm_geom(const BatchNormGeom& g, const char* what) {
  if (g.n < 1 || g.c < 1 || g.hw < 1) {
    throw ConfigError(fmt::format("{}: bad shape N={} C={} HW={}", what, g.n, g.c, g.hw),
                      "every dimension of a batch norm input must be at least 1");
  }
}

void check_batch_norm_training_geom(const BatchNormGeom& g) {
  check_batch_norm_geom(g, "batch_norm_forward_training");
  if (g.n * g.hw < 2) {
    throw ConfigError(fmt::format("batch_norm_forward_training: one value per channel (N={}, "
                                  "H*W={}) has no variance",
                                  g.n, g.hw),
                      "train with a batch size above 1 or use the layer in eval mode");
  }
}

void check_softmax_cross_entropy(int64_t n, int64_t k, const char* what) {
  if (n < 1 || k < 1) {
    throw ConfigError(fmt::format("{}: invalid shape N={} K={}", what, n, k),
                      "rows and classes must be positive");
  }
}

void check_sgd_update(const SgdUpdate& a) {
  check_element_count(a.n, "sgd_update");
  if (a.momentum != 0.0f && a.momentum_buf == nullptr) {
    throw ConfigError("sgd_update: momentum is set but there is no momentum buffer",
                      "allocate the optimizer state before the first step");
  }
}

void check_adamw_update(const AdamWUpdate& a) {
  check_element_count(a.n, "adamw_update");
  if (a.step < 1) {
    throw ConfigError(fmt::format("adamw_update: step {} (steps count from 1)", a.step),
                      "pass the number of this update, starting at 1");
  }
}

}  // namespace ferry
