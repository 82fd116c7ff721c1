// Argument checks of the transformer kernels on the CUDA backend, run on the host before any
// launch (ConfigError naming the kernel, as device/kernel_checks.h). Invariant: the rules are
// PyTorch's, backend-neutral; they live here only until the CPU backend's check_embedding,
// check_layer_norm and check_attention land in device/kernel_checks.h.
// TODO(transformers): call device/kernel_checks.h's check_embedding, check_layer_norm and
// check_attention instead once the CPU kernels are merged, so both backends throw one message.
#pragma once

#include "device/kernels.h"

namespace ferry::cuda {

// Positive batch, positions, width and vocabulary.
void check_embedding_forward(const EmbeddingForward& a);
// As the forward, and wpe's rows (context) at least T.
void check_embedding_backward(const EmbeddingBackward& a);
// Rows at least 0, a positive width, eps at least 0 (NaN is not).
void check_layer_norm(const LayerNormGeom& g, const char* what);
// Positive sizes, the width a multiple of the heads, dropout a probability in [0, 1].
void check_attention(const AttentionGeom& g, const char* what);

}  // namespace ferry::cuda
