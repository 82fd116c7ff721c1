// Argument checks every backend runs on the host before it launches a kernel, so that a bad
// argument throws the same typed error with the same message on every backend. Invariant: these
// are the backend-neutral rules (PyTorch's); a backend adds only its own library's limits after.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "device/kernels.h"

namespace ferry {

// Every argument check throws ConfigError, naming `what` (the kernel, as kernel_name() spells
// it) and the offending sizes.

// An elementwise kernel's element count: at least 0.
void check_element_count(int64_t n, const char* what);
// The element count, and p a probability in [0, 1] (NaN is not).
void check_dropout_forward(const DropoutForward& a);

// "N=.. C=.. H=.. W=.. K=.. RxS stride .. pad .. groups ..", for messages about a convolution.
std::string conv_geom_text(const ConvGeom& g);
// Positive sizes and strides, channels divisible by groups, and the kernel no larger than the
// padded input (PyTorch's rule; out_h() alone would round a negative span up under a stride).
void check_conv_geom(const ConvGeom& g, const char* what);
// Positive rows and feature counts.
void check_linear_geom(const LinearGeom& g, const char* what);

// PyTorch's pooling rules: positive sizes and strides, padding at most half the kernel, and at
// least one output row and column.
void check_pool_geom(const PoolGeom& g, const char* what);
// Adaptive average pooling: every size positive.
void check_adaptive_avg_pool(int64_t n, int64_t c, int64_t h, int64_t w, int64_t oh, int64_t ow,
                             const char* what);

// Every dimension of a batch norm input at least 1.
void check_batch_norm_geom(const BatchNormGeom& g, const char* what);
// check_batch_norm_geom, and at least two values per channel (else no variance to train on).
void check_batch_norm_training_geom(const BatchNormGeom& g);

// Softmax cross-entropy: positive rows and classes (labels are data, checked by the backend).
void check_softmax_cross_entropy(int64_t n, int64_t k, const char* what);
// What the loss's total is divided by: `divisor`, or n when it is 0 (SoftmaxCrossEntropyForward).
// ConfigError for a negative or non-finite divisor.
double loss_divisor(float divisor, int64_t n, const char* what);

// The element count, and a momentum buffer whenever momentum is set.
void check_sgd_update(const SgdUpdate& a);
// The element count, and steps counted from 1.
void check_adamw_update(const AdamWUpdate& a);

// Transformer kernels: positive sizes, every operand present (mask only when dropout draws one).
// Embedding: positive N, T, C and vocab; backward also context >= T.
void check_embedding_forward(const EmbeddingForward& a);
void check_embedding_backward(const EmbeddingBackward& a);
// Layer norm: positive rows and width, eps >= 0.
void check_layer_norm_geom(const LayerNormGeom& g, const char* what);
void check_layer_norm_forward(const LayerNormForward& a);
void check_layer_norm_backward(const LayerNormBackward& a);
void check_gelu_forward(const GeluForward& a);
void check_gelu_backward(const GeluBackward& a);
// Attention: positive sizes, C divisible by the heads, dropout in [0, 1).
void check_attention_geom(const AttentionGeom& g, const char* what);
void check_attention_forward(const AttentionForward& a);
void check_attention_backward(const AttentionBackward& a);
void check_flash_attention_forward(const FlashAttentionForward& a);
void check_flash_attention_backward(const FlashAttentionBackward& a);

// Not an argument error but a sizing one: UnsupportedError unless `ws` holds `need` bytes
// (nothing to check when need is 0). `geometry`, when given, is named in the message
// ("... of workspace for <geometry>").
void check_workspace(const Workspace& ws, uint64_t need, std::string_view what,
                     std::string_view geometry = {});

// Llama (kernels_llama.h): positive sizes, every operand present. RMSNorm also eps >= 0; rotary
// embeddings an even head width and kv_heads dividing heads; SwiGLU a count >= 0.
void check_rms_norm_forward(const RmsNormForward& a);
void check_rms_norm_backward(const RmsNormBackward& a);
void check_rope_geom(const RopeGeom& g, const char* what);
void check_rope_qkv_forward(const RopeQkvForward& a);
void check_rope_qkv_backward(const RopeQkvBackward& a);
void check_swiglu_forward(const SwigluForward& a);
void check_swiglu_backward(const SwigluBackward& a);

}  // namespace ferry
