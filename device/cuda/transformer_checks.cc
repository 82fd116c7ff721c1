// The transformer kernels' argument checks (transformer_checks.h).
#include "device/cuda/transformer_checks.h"

#include <fmt/format.h>

#include "common/error.h"

namespace ferry::cuda {
namespace {

void check_embedding_sizes(int64_t n, int64_t t, int64_t c, int64_t vocab, const char* what) {
  if (n < 1 || t < 1 || c < 1 || vocab < 1) {
    throw ConfigError(
        fmt::format("{}: N={} T={} C={} vocab={} must all be at least 1", what, n, t, c, vocab),
        "check the model's sequence length, width and vocabulary size");
  }
}

}  // namespace

void check_embedding_forward(const EmbeddingForward& a) {
  check_embedding_sizes(a.n, a.t, a.c, a.vocab, "embedding_forward");
}

void check_embedding_backward(const EmbeddingBackward& a) {
  check_embedding_sizes(a.n, a.t, a.c, a.vocab, "embedding_backward");
  if (a.context < a.t) {
    throw ConfigError(
        fmt::format("embedding_backward: T={} positions exceed the {} rows of wpe", a.t, a.context),
        "set the sequence length at most the model's context");
  }
}

void check_layer_norm(const LayerNormGeom& g, const char* what) {
  if (g.rows < 0 || g.c < 1 || !(g.eps >= 0.0f)) {
    throw ConfigError(fmt::format("{}: rows={} C={} eps={} (rows at least 0, C at least 1, eps "
                                  "at least 0)",
                                  what, g.rows, g.c, g.eps),
                      "check the layer norm's width and eps");
  }
}

void check_attention(const AttentionGeom& g, const char* what) {
  if (g.n < 1 || g.t < 1 || g.heads < 1 || g.c < 1 || g.c % g.heads != 0) {
    throw ConfigError(fmt::format("{}: N={} T={} heads={} C={} (all at least 1, C a multiple of "
                                  "the heads)",
                                  what, g.n, g.t, g.heads, g.c),
                      "set the model's width to a multiple of its attention heads");
  }
  if (!(g.dropout >= 0.0f && g.dropout <= 1.0f)) {
    throw ConfigError(fmt::format("{}: dropout p = {} is not a probability", what, g.dropout),
                      "set the attention dropout probability in [0, 1]");
  }
}

}  // namespace ferry::cuda
