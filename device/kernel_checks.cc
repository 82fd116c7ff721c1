// The backend-neutral kernel argument checks (kernel_checks.h): one message per rule, whichever
// backend runs the kernel.
#include "device/kernel_checks.h"

#include <cmath>
#include <initializer_list>
#include <utility>

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

double loss_divisor(float divisor, int64_t n, const char* what) {
  if (!(divisor >= 0.0f) || !std::isfinite(divisor)) {
    throw ConfigError(fmt::format("{}: divisor {} is not a finite number >= 0", what, divisor),
                      "pass the labelled rows to average over, or 0 for every row");
  }
  return divisor > 0.0f ? static_cast<double>(divisor) : static_cast<double>(n);
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

namespace {

// ConfigError naming the first null operand of `what`.
void check_operands(const char* what,
                    std::initializer_list<std::pair<const char*, const void*>> operands) {
  for (const auto& [name, ptr] : operands) {
    if (ptr == nullptr) {
      throw ConfigError(fmt::format("{}: operand {} is null", what, name),
                        "bind every operand of the kernel to device memory");
    }
  }
}

}  // namespace

void check_embedding_forward(const EmbeddingForward& a) {
  if (a.n < 1 || a.t < 1 || a.c < 1 || a.vocab < 1) {
    throw ConfigError(fmt::format("embedding_forward: invalid shape N={} T={} C={} vocab={}", a.n,
                                  a.t, a.c, a.vocab),
                      "every size must be positive");
  }
  // wpe may be null: no position table (Llama).
  check_operands("embedding_forward", {{"tokens", a.tokens}, {"wte", a.wte}, {"y", a.y}});
}

void check_embedding_backward(const EmbeddingBackward& a) {
  if (a.n < 1 || a.t < 1 || a.c < 1 || a.vocab < 1 || a.context < a.t) {
    throw ConfigError(
        fmt::format("embedding_backward: invalid shape N={} T={} C={} vocab={} context={}", a.n,
                    a.t, a.c, a.vocab, a.context),
        "every size must be positive and the context at least T");
  }
  check_operands("embedding_backward", {{"tokens", a.tokens}, {"dy", a.dy}, {"dwte", a.dwte}});
}

void check_layer_norm_geom(const LayerNormGeom& g, const char* what) {
  if (g.rows < 1 || g.c < 1 || !(g.eps >= 0.0f)) {
    throw ConfigError(
        fmt::format("{}: invalid shape rows={} C={} eps={}", what, g.rows, g.c, g.eps),
        "rows and width must be positive and eps at least 0");
  }
}

void check_layer_norm_forward(const LayerNormForward& a) {
  check_layer_norm_geom(a.g, "layer_norm_forward");
  check_operands("layer_norm_forward", {{"x", a.x},
                                        {"gamma", a.gamma},
                                        {"beta", a.beta},
                                        {"y", a.y},
                                        {"mean", a.mean},
                                        {"rstd", a.rstd}});
}

void check_layer_norm_backward(const LayerNormBackward& a) {
  check_layer_norm_geom(a.g, "layer_norm_backward");
  check_operands("layer_norm_backward", {{"x", a.x},
                                         {"dy", a.dy},
                                         {"gamma", a.gamma},
                                         {"mean", a.mean},
                                         {"rstd", a.rstd},
                                         {"dx", a.dx},
                                         {"dgamma", a.dgamma},
                                         {"dbeta", a.dbeta}});
}

void check_gelu_forward(const GeluForward& a) {
  check_element_count(a.n, "gelu_forward");
  if (a.n > 0) check_operands("gelu_forward", {{"x", a.x}, {"y", a.y}});
}

void check_gelu_backward(const GeluBackward& a) {
  check_element_count(a.n, "gelu_backward");
  if (a.n > 0) check_operands("gelu_backward", {{"x", a.x}, {"dy", a.dy}, {"dx", a.dx}});
}

void check_attention_geom(const AttentionGeom& g, const char* what) {
  if (g.n < 1 || g.t < 1 || g.heads < 1 || g.c < 1 || g.c % g.heads != 0) {
    throw ConfigError(
        fmt::format("{}: invalid shape N={} T={} heads={} C={}", what, g.n, g.t, g.heads, g.c),
        "sizes must be positive and the width divisible by the heads");
  }
  if (!(g.dropout >= 0.0f && g.dropout < 1.0f)) {
    throw ConfigError(fmt::format("{}: dropout {} is not in [0, 1)", what, g.dropout),
                      "set the attention dropout probability in [0, 1)");
  }
}

void check_attention_forward(const AttentionForward& a) {
  check_attention_geom(a.g, "attention_forward");
  check_operands("attention_forward", {{"qkv", a.qkv}, {"probs", a.probs}});
  // A null y computes the probabilities alone: no dropout draw, no mask.
  if (a.y && a.training && a.g.dropout > 0.0f) {
    check_operands("attention_forward", {{"mask", a.mask}});
  }
}

void check_attention_backward(const AttentionBackward& a) {
  check_attention_geom(a.g, "attention_backward");
  check_operands("attention_backward",
                 {{"qkv", a.qkv}, {"probs", a.probs}, {"dy", a.dy}, {"dqkv", a.dqkv}});
  if (a.g.dropout > 0.0f) check_operands("attention_backward", {{"mask", a.mask}});
}

// Fused attention: y and lse may each be null (a recompute of the other), not both.
void check_flash_attention_forward(const FlashAttentionForward& a) {
  check_attention_geom(a.g, "flash_attention_forward");
  check_operands("flash_attention_forward", {{"qkv", a.qkv}});
  if (a.y == nullptr && a.lse == nullptr) {
    throw ConfigError("flash_attention_forward: neither y nor lse is given",
                      "pass the output, the log-sum-exp, or both");
  }
}

void check_flash_attention_backward(const FlashAttentionBackward& a) {
  check_attention_geom(a.g, "flash_attention_backward");
  check_operands("flash_attention_backward",
                 {{"qkv", a.qkv}, {"y", a.y}, {"lse", a.lse}, {"dy", a.dy}, {"dqkv", a.dqkv}});
}

namespace {

void check_rms_norm_geom(const RmsNormGeom& g, const char* what) {
  if (g.rows < 1 || g.c < 1 || !(g.eps >= 0.0f)) {
    throw ConfigError(
        fmt::format("{}: invalid shape rows={} C={} eps={}", what, g.rows, g.c, g.eps),
        "rows and width must be positive and eps at least 0");
  }
}

}  // namespace

void check_rms_norm_forward(const RmsNormForward& a) {
  check_rms_norm_geom(a.g, "rms_norm_forward");
  check_operands("rms_norm_forward",
                 {{"x", a.x}, {"weight", a.weight}, {"y", a.y}, {"rstd", a.rstd}});
}

void check_rms_norm_backward(const RmsNormBackward& a) {
  check_rms_norm_geom(a.g, "rms_norm_backward");
  check_operands("rms_norm_backward", {{"x", a.x},
                                       {"dy", a.dy},
                                       {"weight", a.weight},
                                       {"rstd", a.rstd},
                                       {"dx", a.dx},
                                       {"dweight", a.dweight}});
}

void check_rope_geom(const RopeGeom& g, const char* what) {
  if (g.n < 1 || g.t < 1 || g.heads < 1 || g.kv_heads < 1 || g.head_dim < 1) {
    throw ConfigError(fmt::format("{}: invalid shape N={} T={} heads={} kv_heads={} head_dim={}",
                                  what, g.n, g.t, g.heads, g.kv_heads, g.head_dim),
                      "every size must be positive");
  }
  if (g.heads % g.kv_heads != 0) {
    throw ConfigError(
        fmt::format("{}: kv_heads ({}) does not divide heads ({})", what, g.kv_heads, g.heads),
        "set model.kv_heads to a divisor of model.heads");
  }
  if (g.head_dim % 2 != 0) {
    throw ConfigError(
        fmt::format("{}: rotary embeddings need an even head width, got {}", what, g.head_dim),
        "pick model.width and model.heads so that width / heads is even");
  }
  if (!(g.theta > 0.0f)) {
    throw ConfigError(fmt::format("{}: rope theta {} is not positive", what, g.theta),
                      "set model.rope_theta above 0");
  }
}

void check_rope_qkv_forward(const RopeQkvForward& a) {
  check_rope_geom(a.g, "rope_qkv_forward");
  check_operands("rope_qkv_forward", {{"q", a.q}, {"k", a.k}, {"v", a.v}, {"qkv", a.qkv}});
}

void check_rope_qkv_backward(const RopeQkvBackward& a) {
  check_rope_geom(a.g, "rope_qkv_backward");
  check_operands("rope_qkv_backward", {{"dqkv", a.dqkv}});
}

void check_swiglu_forward(const SwigluForward& a) {
  check_element_count(a.n, "swiglu_forward");
  if (a.n > 0) check_operands("swiglu_forward", {{"gate", a.gate}, {"up", a.up}, {"y", a.y}});
}

void check_swiglu_backward(const SwigluBackward& a) {
  check_element_count(a.n, "swiglu_backward");
  if (a.n > 0) {
    check_operands(
        "swiglu_backward",
        {{"gate", a.gate}, {"up", a.up}, {"dy", a.dy}, {"dgate", a.dgate}, {"dup", a.dup}});
  }
}

}  // namespace ferry
