// Plain float64 references of every CPU kernel, written for clarity (direct loops over the
// definitions in device/kernels.h), against which the fp32 kernels and finite differences are
// checked. Invariant: no reference shares code with the kernels it checks.
#pragma once

#include <cstdint>
#include <vector>

#include "device/kernels.h"

namespace ferry::ref {

using Vec = std::vector<double>;

// ---- convolution: x (N, C, H, W), w (K, C/g, R, S), y (N, K, OH, OW) ----
Vec conv_forward(const ConvGeom& g, const Vec& x, const Vec& w, const Vec* bias);
Vec conv_backward_data(const ConvGeom& g, const Vec& dy, const Vec& w);
// Returns dw; fills dbias (K) when given.
Vec conv_backward_weights(const ConvGeom& g, const Vec& x, const Vec& dy, Vec* dbias);

// ---- linear: x (M, K), w (N, K), y (M, N) ----
Vec linear_forward(const LinearGeom& g, const Vec& x, const Vec& w, const Vec* bias);
Vec linear_backward_data(const LinearGeom& g, const Vec& dy, const Vec& w);
Vec linear_backward_weights(const LinearGeom& g, const Vec& x, const Vec& dy, Vec* dbias);

// ---- pooling ----
Vec pool_forward(const PoolGeom& g, const Vec& x);
// Max: each dy to the first maximum (row-major) of its window in x (the last NaN if any).
Vec pool_backward(const PoolGeom& g, const Vec& x, const Vec& dy);
Vec adaptive_avg_pool_forward(int64_t n, int64_t c, int64_t h, int64_t w, int64_t oh, int64_t ow,
                              const Vec& x);
Vec adaptive_avg_pool_backward(int64_t n, int64_t c, int64_t h, int64_t w, int64_t oh, int64_t ow,
                               const Vec& dy);

// ---- batch norm: x (N, C, HW) ----
struct BatchNormResult {
  Vec y, mean, var;  // var is the biased batch variance
};
BatchNormResult batch_norm_train(const BatchNormGeom& g, const Vec& x, const Vec& gamma,
                                 const Vec& beta);
Vec batch_norm_infer(const BatchNormGeom& g, const Vec& x, const Vec& gamma, const Vec& beta,
                     const Vec& mean, const Vec& var);
struct BatchNormGrads {
  Vec dx, dgamma, dbeta;
};
BatchNormGrads batch_norm_backward(const BatchNormGeom& g, const Vec& x, const Vec& dy,
                                   const Vec& gamma);

// ---- loss ----
struct SoftmaxCeResult {
  double loss = 0;
  Vec probs;
  int correct = 0;
};
SoftmaxCeResult softmax_ce(int64_t n, int64_t k, const Vec& logits,
                           const std::vector<int32_t>& labels);

// ---- transformers ----
// y (N, T, C) = wte[tokens] + wpe[p], p = t, or t - segments[n, t] with `segments` (Note
// [Segments of a packed row] in device/kernels.h).
Vec embedding_forward(int64_t n, int64_t t, int64_t c, const std::vector<int32_t>& tokens,
                      const Vec& wte, const Vec& wpe,
                      const std::vector<int32_t>* segments = nullptr);
struct EmbeddingGrads {
  Vec dwte, dwpe;  // (vocab, C), (context, C)
};
EmbeddingGrads embedding_backward(int64_t n, int64_t t, int64_t c, int64_t vocab, int64_t context,
                                  const std::vector<int32_t>& tokens, const Vec& dy,
                                  const std::vector<int32_t>* segments = nullptr);

struct LayerNormResult {
  Vec y, mean, rstd;
};
LayerNormResult layer_norm_forward(const LayerNormGeom& g, const Vec& x, const Vec& gamma,
                                   const Vec& beta);
struct LayerNormGrads {
  Vec dx, dgamma, dbeta;
};
LayerNormGrads layer_norm_backward(const LayerNormGeom& g, const Vec& x, const Vec& dy,
                                   const Vec& gamma);

Vec gelu_forward(const Vec& x);
Vec gelu_backward(const Vec& x, const Vec& dy);

// Causal attention on qkv (N, T, 3C): y (N, T, C) and probs P (N, H, T, T). With `mask`
// (N, H, T, T), P' = mask ? P / (1 - dropout) : 0 feeds y. With `segments` (N, T), query i of row
// n sees keys [segments[n, i], i] only.
struct AttentionResult {
  Vec y, probs;
};
AttentionResult attention_forward(const AttentionGeom& g, const Vec& qkv,
                                  const std::vector<uint8_t>* mask,
                                  const std::vector<int32_t>* segments = nullptr);
// dqkv (N, T, 3C).
Vec attention_backward(const AttentionGeom& g, const Vec& qkv, const Vec& dy,
                       const std::vector<uint8_t>* mask,
                       const std::vector<int32_t>* segments = nullptr);

// ---- optimizers (one step, in place), written as torch.optim's code reads ----
// `first_step`: torch sets buf = d on the first step instead of momentum * buf + d.
void sgd_step(Vec& p, const Vec& grad, Vec& buf, double lr, double momentum, double wd,
              bool nesterov, bool first_step);
void adamw_step(Vec& p, const Vec& grad, Vec& m, Vec& v, double lr, double b1, double b2,
                double eps, double wd, int64_t step);

}  // namespace ferry::ref
