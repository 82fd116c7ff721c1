// Factories for the ops GraphBuilder adds. Each op is built for fixed shapes; its pointer
// lists follow GraphBuilder's order (documented per factory).
#pragma once

#include <memory>

#include "device/kernels.h"
#include "trainer/model/op.h"

namespace ferry {

// inputs {x}; params {weight (K, C/g, R, S), bias (K) if bias}; outputs {y}.
std::unique_ptr<Op> make_conv2d(const ConvGeom& g, bool bias);
// inputs {x (M, K)}; params {weight (N, K), bias (N) if bias}; outputs {y (M, N)}.
std::unique_ptr<Op> make_linear(const LinearGeom& g, bool bias);
// inputs {x}; params {weight, bias} (C); buffers {running_mean, running_var, num_batches_tracked};
// aux {save_mean, save_var} (C); outputs {y}.
std::unique_ptr<Op> make_batch_norm(const BatchNormGeom& g, float momentum);
// inputs {x}; outputs {y}.
std::unique_ptr<Op> make_pool(const PoolGeom& g);
std::unique_ptr<Op> make_adaptive_avg_pool(const AdaptiveAvgPoolForward& shape);
std::unique_ptr<Op> make_relu(int64_t n);
std::unique_ptr<Op> make_flatten(int64_t n);
// aux {mask (n) u8}.
std::unique_ptr<Op> make_dropout(int64_t n, float p);
// inputs {a, b}; outputs {y}.
std::unique_ptr<Op> make_add(int64_t n);
// inputs {logits (N, K), labels (N) int32}; outputs {loss (), correct () int32}; aux {probs}.
std::unique_ptr<Op> make_softmax_cross_entropy(int64_t n, int64_t k);

// Transformers (transformer.cc). inputs {tokens (N, T) int32, segments (N, T) int32 when the
// documents are packed}; params {wte (vocab, C), wpe (context, C)}; outputs {y (N*T, C)}. `shape`
// gives n, t, c, vocab; tied: the LM head shares wte and writes its gradient first.
std::unique_ptr<Op> make_embedding(const EmbeddingForward& shape, int64_t context, bool tied);
// inputs {x (rows, C)}; params {weight, bias} (C); aux {mean, rstd} (rows); outputs {y}.
std::unique_ptr<Op> make_layer_norm(const LayerNormGeom& g);
// inputs {x}; outputs {y}.
std::unique_ptr<Op> make_gelu(int64_t n);
// inputs {qkv (N*T, 3C), segments (N, T) int32 when the documents are packed}; outputs {y (N*T,
// C), probs (N, heads, T, T)}; aux {mask (N, heads, T, T) u8} when dropout > 0. fused: outputs
// {y, lse (N, heads, T)}, no aux (Note [Fused attention] in device/kernels.h).
std::unique_ptr<Op> make_attention(const AttentionGeom& g, bool fused);

// Llama (llama.cc). inputs {tokens (N, T) int32}; params {wte (vocab, C)}; outputs {y (N*T, C)}:
// the token embedding without positions; tied as make_embedding.
std::unique_ptr<Op> make_token_embedding(const EmbeddingForward& shape, bool tied);
// inputs {x (rows, C)}; params {weight (C)}; aux {rstd (rows)}; outputs {y}.
std::unique_ptr<Op> make_rms_norm(const RmsNormGeom& g);
// inputs {q (N*T, H*D), k (N*T, KV*D), v (N*T, KV*D), segments (N, T) int32 when the documents are
// packed}; outputs {qkv (N*T, 3*H*D)}.
std::unique_ptr<Op> make_rope_qkv(const RopeGeom& g);
// inputs {gate, up}; outputs {y}.
std::unique_ptr<Op> make_swiglu(int64_t n);

}  // namespace ferry
