// The kernels a backend provides, as plain argument structs in one variant: ops fill a struct
// and launch it on a stream; backends dispatch on the type. Every pointer is device memory.
// Layouts are row-major: images (N, C, H, W), weights (K, C/groups, R, S), linear (out, in).
// Semantics follow PyTorch's, so a checkpoint and a loss curve mean the same in both.
#pragma once

#include <cstdint>
#include <string_view>
#include <variant>

#include "device/dtype.h"
#include "device/kernels_llama.h"
#include "device/kernels_optim.h"
#include "device/stream.h"

namespace ferry {

// Scratch memory a kernel may use while it runs; sized by Kernels::workspace_bytes().
struct Workspace {
  void* ptr = nullptr;
  uint64_t bytes = 0;
};

// Note [Storage dtype of a kernel]
// A kernel with a `dtype` field runs in fp32 storage (kF32, the default: every float operand is
// fp32) or in bf16 storage (kBF16, mixed precision: docs/precision.md). In bf16 the operands
// listed here hold bf16 values (their bit patterns, 2 bytes an element) behind the same pointer
// fields; every other float operand stays fp32; the math is fp32 (fp32 accumulation in the
// products, fp32 statistics, softmax, log-sum-exp and loss):
//  - conv / linear forward: x, w (the bf16 working copy of the weight), y; bias is fp32.
//    backward data: dy, w, dx. backward weights: x, dy; dw and dbias are fp32.
//  - pooling, adaptive pooling, ReLU, GELU, add, dropout: every float operand (the mask is u8).
//  - accumulate, fill, scale: x and y.
//  - batch norm: x, y, dy, dx; gamma, beta, the running and saved statistics and their
//    gradients are fp32. Layer norm: x, y, dy, dx; gamma, beta, mean, rstd and gradients fp32.
//  - softmax cross-entropy: logits, probs, dlogits; loss is fp32.
//  - embedding: y and dy; wte, wpe (the fp32 master weights), dwte, dwpe are fp32.
//  - attention: qkv, y, probs, dy, dqkv. Fused attention: qkv, y, dy, dqkv; lse is fp32.
//  - RMSNorm (kernels_llama.h): x, y, dy, dx; weight, rstd and dweight are fp32. Rotary qkv:
//    q, k, v, qkv, dqkv, dq, dk, dv. SwiGLU: gate, up, y, dy, dgate, dup.
// Kernels without the field (copy, the optimizers, gradient clipping) are fp32 (copy: bytes;
// ConvertFloats: its own from and to).
// Kernels::supports(kind, DType::kBF16) says whether a backend runs a kind in bf16 storage.

// ---- convolution -------------------------------------------------------------------------

struct ConvGeom {
  int64_t n = 1, c = 1, h = 1, w = 1;  // input (N, C, H, W)
  int64_t k = 1;                       // output channels
  int64_t r = 1, s = 1;                // kernel height, width; weight (K, C/groups, R, S)
  int64_t stride_h = 1, stride_w = 1;
  int64_t pad_h = 0, pad_w = 0;
  int64_t groups = 1;

  int64_t out_h() const { return (h + 2 * pad_h - r) / stride_h + 1; }
  int64_t out_w() const { return (w + 2 * pad_w - s) / stride_w + 1; }
  bool operator==(const ConvGeom&) const = default;
};

// y = conv(x, w) + bias. x (N, C, H, W), w (K, C/g, R, S), bias (K) or null, y (N, K, OH, OW).
struct ConvForward {
  ConvGeom g;
  const float* x = nullptr;
  const float* w = nullptr;
  const float* bias = nullptr;
  float* y = nullptr;
  Workspace ws;
  DType dtype = DType::kF32;  // Note [Storage dtype of a kernel]
};

// dx = conv_transpose(dy, w). Overwrites dx.
struct ConvBackwardData {
  ConvGeom g;
  const float* dy = nullptr;
  const float* w = nullptr;
  float* dx = nullptr;
  Workspace ws;
  DType dtype = DType::kF32;  // Note [Storage dtype of a kernel]
};

// dw = sum over the batch of x (*) dy; dbias = sum of dy over (N, OH, OW). Overwrites both;
// dbias may be null.
struct ConvBackwardWeights {
  ConvGeom g;
  const float* x = nullptr;
  const float* dy = nullptr;
  float* dw = nullptr;
  float* dbias = nullptr;
  Workspace ws;
  DType dtype = DType::kF32;  // Note [Storage dtype of a kernel]
};

// ---- fully connected ---------------------------------------------------------------------

struct LinearGeom {
  int64_t m = 1;  // batch rows
  int64_t k = 1;  // in features
  int64_t n = 1;  // out features
  // The weight is stored (K, N), in then out (Hugging Face's Conv1D, GPT-2's layout), instead of
  // nn.Linear's (N, K). Every formula below reads w^T for w when this is set.
  bool weight_in_out = false;
  bool operator==(const LinearGeom&) const = default;
};

// y (M, N) = x (M, K) * w^T, w (N, K), + bias (N) or null.
struct LinearForward {
  LinearGeom g;
  const float* x = nullptr;
  const float* w = nullptr;
  const float* bias = nullptr;
  float* y = nullptr;
  Workspace ws;
  DType dtype = DType::kF32;  // Note [Storage dtype of a kernel]
};

// dx (M, K) = dy (M, N) * w (N, K).
struct LinearBackwardData {
  LinearGeom g;
  const float* dy = nullptr;
  const float* w = nullptr;
  float* dx = nullptr;
  Workspace ws;
  DType dtype = DType::kF32;  // Note [Storage dtype of a kernel]
};

// dw (N, K) = dy^T * x; dbias (N) = column sums of dy, or null.
struct LinearBackwardWeights {
  LinearGeom g;
  const float* x = nullptr;
  const float* dy = nullptr;
  float* dw = nullptr;
  float* dbias = nullptr;
  Workspace ws;
  DType dtype = DType::kF32;  // Note [Storage dtype of a kernel]
};

// ---- pooling ------------------------------------------------------------------------------

enum class PoolKind : uint8_t { kMax, kAvg };

// PyTorch's MaxPool2d / AvgPool2d geometry. Padding counts as -inf for max; for avg it counts
// in the divisor when count_include_pad (PyTorch's default), never beyond the padded edge.
struct PoolGeom {
  PoolKind kind = PoolKind::kMax;
  int64_t n = 1, c = 1, h = 1, w = 1;
  int64_t kh = 1, kw = 1;
  int64_t stride_h = 1, stride_w = 1;
  int64_t pad_h = 0, pad_w = 0;
  bool ceil_mode = false;
  bool count_include_pad = true;

  int64_t out_h() const { return out_size(h, kh, stride_h, pad_h); }
  int64_t out_w() const { return out_size(w, kw, stride_w, pad_w); }
  // PyTorch's rule, with division rounding down (a kernel wider than the padded input gives no
  // window in floor mode, so check_pool_geom rejects it as PyTorch does).
  int64_t out_size(int64_t in, int64_t k, int64_t s, int64_t p) const {
    const int64_t span = in + 2 * p - k + (ceil_mode ? s - 1 : 0);
    int64_t out = (span >= 0 ? span / s : -((-span + s - 1) / s)) + 1;
    // The last window must start inside the input or the left padding.
    if (ceil_mode && (out - 1) * s >= in + p) --out;
    return out;
  }
  bool operator==(const PoolGeom&) const = default;
};

// x (N, C, H, W) -> y (N, C, OH, OW).
struct PoolForward {
  PoolGeom g;
  const float* x = nullptr;
  float* y = nullptr;
  DType dtype = DType::kF32;  // Note [Storage dtype of a kernel]
};

// Overwrites dx. Max: each dy goes to the first maximum of its window in row-major order
// (PyTorch's tie rule), found from x; y is the forward output. Avg: dy spread over the window.
struct PoolBackward {
  PoolGeom g;
  const float* x = nullptr;
  const float* y = nullptr;
  const float* dy = nullptr;
  float* dx = nullptr;
  DType dtype = DType::kF32;  // Note [Storage dtype of a kernel]
};

// PyTorch's AdaptiveAvgPool2d: output cell (i, j) averages rows [floor(i*H/OH), ceil((i+1)*H/OH))
// and the same for columns. x (N, C, H, W) -> y (N, C, OH, OW).
struct AdaptiveAvgPoolForward {
  int64_t n = 1, c = 1, h = 1, w = 1, oh = 1, ow = 1;
  const float* x = nullptr;
  float* y = nullptr;
  DType dtype = DType::kF32;  // Note [Storage dtype of a kernel]
};

struct AdaptiveAvgPoolBackward {
  int64_t n = 1, c = 1, h = 1, w = 1, oh = 1, ow = 1;
  const float* dy = nullptr;
  float* dx = nullptr;        // overwritten
  DType dtype = DType::kF32;  // Note [Storage dtype of a kernel]
};

// ---- batch normalisation -------------------------------------------------------------------

// Per channel over (N, H*W). x and y are (N, C, HW).
struct BatchNormGeom {
  int64_t n = 1, c = 1, hw = 1;
  float eps = 1e-5f;
  bool operator==(const BatchNormGeom&) const = default;
};

// y = (x - mean) / sqrt(var + eps) * gamma + beta with the batch's mean and biased variance,
// saved in save_mean / save_var (C). Running statistics are updated in place as PyTorch does:
// running = (1 - momentum) * running + momentum * stat, with the unbiased variance n/(n-1).
struct BatchNormForwardTraining {
  BatchNormGeom g;
  float momentum = 0.1f;
  const float* x = nullptr;
  const float* gamma = nullptr;
  const float* beta = nullptr;
  float* y = nullptr;
  float* running_mean = nullptr;
  float* running_var = nullptr;
  float* save_mean = nullptr;
  float* save_var = nullptr;
  DType dtype = DType::kF32;  // Note [Storage dtype of a kernel]
};

// y = (x - running_mean) / sqrt(running_var + eps) * gamma + beta.
struct BatchNormForwardInference {
  BatchNormGeom g;
  const float* x = nullptr;
  const float* gamma = nullptr;
  const float* beta = nullptr;
  const float* running_mean = nullptr;
  const float* running_var = nullptr;
  float* y = nullptr;
  DType dtype = DType::kF32;  // Note [Storage dtype of a kernel]
};

// Gradients of the training-mode forward. Overwrites dx, dgamma, dbeta.
struct BatchNormBackward {
  BatchNormGeom g;
  const float* x = nullptr;
  const float* dy = nullptr;
  const float* gamma = nullptr;
  const float* save_mean = nullptr;
  const float* save_var = nullptr;
  float* dx = nullptr;
  float* dgamma = nullptr;
  float* dbeta = nullptr;
  DType dtype = DType::kF32;  // Note [Storage dtype of a kernel]
};

// ---- elementwise ----------------------------------------------------------------------------

struct ReluForward {  // y = max(x, 0)
  int64_t n = 0;
  const float* x = nullptr;
  float* y = nullptr;
  DType dtype = DType::kF32;  // Note [Storage dtype of a kernel]
};

struct ReluBackward {  // dx = y > 0 ? dy : 0 (y is the forward output)
  int64_t n = 0;
  const float* y = nullptr;
  const float* dy = nullptr;
  float* dx = nullptr;
  DType dtype = DType::kF32;  // Note [Storage dtype of a kernel]
};

struct AddForward {  // y = a + b
  int64_t n = 0;
  const float* a = nullptr;
  const float* b = nullptr;
  float* y = nullptr;
  DType dtype = DType::kF32;  // Note [Storage dtype of a kernel]
};

struct Accumulate {  // y += x
  int64_t n = 0;
  const float* x = nullptr;
  float* y = nullptr;
  DType dtype = DType::kF32;  // Note [Storage dtype of a kernel]
};

struct CopyDevice {  // dst = src, device to device, non-overlapping
  uint64_t bytes = 0;
  const void* src = nullptr;
  void* dst = nullptr;
};

struct Fill {  // y[i] = value (float elements; NaN poisons)
  int64_t n = 0;
  float value = 0.0f;
  float* y = nullptr;
  DType dtype = DType::kF32;  // Note [Storage dtype of a kernel]
};

struct Scale {  // y *= alpha
  int64_t n = 0;
  float alpha = 1.0f;
  float* y = nullptr;
  DType dtype = DType::kF32;  // Note [Storage dtype of a kernel]
};

// Inverted dropout. Element i is kept when counter_uniform(seed, offset + i) >= p
// (device/counter_rng.h), so every backend draws the same mask. mask[i] is 1 or 0;
// y = keep ? x / (1 - p) : 0.
struct DropoutForward {
  int64_t n = 0;
  float p = 0.5f;
  uint64_t seed = 0;
  uint64_t offset = 0;
  const float* x = nullptr;
  float* y = nullptr;
  uint8_t* mask = nullptr;
  DType dtype = DType::kF32;  // Note [Storage dtype of a kernel]
};

struct DropoutBackward {  // dx = mask ? dy / (1 - p) : 0
  int64_t n = 0;
  float p = 0.5f;
  const float* dy = nullptr;
  const uint8_t* mask = nullptr;
  float* dx = nullptr;
  DType dtype = DType::kF32;  // Note [Storage dtype of a kernel]
};

// ---- loss ------------------------------------------------------------------------------------

// loss[0] = (sum over labelled rows of (logsumexp(logits_i) - logits_i[label_i])) / divisor,
// the sum in row order; probs = softmax(logits) (N, K), saved for backward; correct[0] (int32,
// may be null) = labelled rows whose first argmax equals the label. Labels are int32 below K; a
// negative label marks a row that is not labelled (a padding position: Note [Documents as rows]
// in trainer/data/documents.h): it adds exactly nothing to the loss, the count or the gradient.
// divisor 0 means N (the mean over rows when every row is labelled).
struct SoftmaxCrossEntropyForward {
  int64_t n = 1, k = 1;
  const float* logits = nullptr;
  const int32_t* labels = nullptr;
  float* loss = nullptr;
  float* probs = nullptr;
  int32_t* correct = nullptr;
  float divisor = 0.0f;
  DType dtype = DType::kF32;  // Note [Storage dtype of a kernel]
};

// dlogits = scale * (probs - onehot(label)) / divisor for labelled rows (divisor 0: N), exactly 0
// for rows whose label is negative. Overwrites dlogits.
struct SoftmaxCrossEntropyBackward {
  int64_t n = 1, k = 1;
  float scale = 1.0f;
  const float* probs = nullptr;
  const int32_t* labels = nullptr;
  float* dlogits = nullptr;
  float divisor = 0.0f;
  DType dtype = DType::kF32;  // Note [Storage dtype of a kernel]
};

// ---- transformers ---------------------------------------------------------------------------

// Note [Segments of a packed row]
// Packed documents (data.pack) share a row: segments (N, T) int32, when not null, holds for
// each position i of row n the first position of its document, 0 <= segments[n, i] <= i (so
// segments[n, i] = i starts a document, and positions of one document are contiguous). A
// position's place in its document, i - segments[n, i], is its position for the embedding, and
// attention lets query i see keys j in [segments[n, i], i] only: a block-diagonal causal mask,
// so each document is computed as if it were alone in its row. Null: one document per row
// (segments[n, i] = 0 everywhere: positions 0..T-1, the plain causal mask).

// GPT-2's input embedding: y[n, t, :] = wte[tokens[n, t], :] + wpe[p, :] with p = t - segments[n,
// t] (Note [Segments of a packed row]; p = t without segments). A null wpe (Llama: no position
// table) gives y[n, t, :] = wte[tokens[n, t], :]. Tokens are int32 in [0, vocab)
// (the loader checks them; a kernel may assume it).
struct EmbeddingForward {
  int64_t n = 1, t = 1;               // batch rows, positions
  int64_t c = 1;                      // width
  int64_t vocab = 1;                  // rows of wte
  const int32_t* tokens = nullptr;    // (N, T)
  const float* wte = nullptr;         // (vocab, C)
  const float* wpe = nullptr;         // (context >= T, C); only its first T rows are read
  float* y = nullptr;                 // (N, T, C)
  const int32_t* segments = nullptr;  // (N, T) or null
  DType dtype = DType::kF32;          // Note [Storage dtype of a kernel]
};

// dwte[v, :] = 0 + each dy[n, t, :] with tokens[n, t] == v, added one row at a time in
// increasing (n, t) order (no atomics: the same bits on every run and backend); rows of tokens
// that do not occur are 0. With accumulate_wte the rows are added onto dwte instead of onto 0
// (a tied LM head wrote it first), in the same order. dwpe[p, :] = 0 + each dy[n, t, :] whose
// position (EmbeddingForward) is p, in increasing (n, t) order (without segments: the sum over n
// of dy[n, p, :] in increasing n), for p < T (rows >= T: 0).
struct EmbeddingBackward {
  int64_t n = 1, t = 1, c = 1, vocab = 1;
  int64_t context = 1;  // rows of wpe (>= T)
  const int32_t* tokens = nullptr;
  const float* dy = nullptr;  // (N, T, C)
  float* dwte = nullptr;      // (vocab, C)
  float* dwpe = nullptr;      // (context, C); null: no position table
  bool accumulate_wte = false;
  const int32_t* segments = nullptr;  // (N, T) or null, as the forward's
  DType dtype = DType::kF32;          // Note [Storage dtype of a kernel]
};

// torch.nn.LayerNorm over the last dimension: rows (M) of C values.
struct LayerNormGeom {
  int64_t rows = 1, c = 1;
  float eps = 1e-5f;
  bool operator==(const LayerNormGeom&) const = default;
};

// y = (x - mean) * rstd * gamma + beta, mean and the biased variance per row, rstd =
// 1 / sqrt(var + eps); mean and rstd (rows) are saved for backward.
struct LayerNormForward {
  LayerNormGeom g;
  const float* x = nullptr;
  const float* gamma = nullptr;
  const float* beta = nullptr;
  float* y = nullptr;
  float* mean = nullptr;
  float* rstd = nullptr;
  DType dtype = DType::kF32;  // Note [Storage dtype of a kernel]
};

// Gradients of LayerNormForward. Overwrites dx, dgamma, dbeta (dgamma and dbeta summed over the
// rows). dx may equal dy (in place).
struct LayerNormBackward {
  LayerNormGeom g;
  const float* x = nullptr;
  const float* dy = nullptr;
  const float* gamma = nullptr;
  const float* mean = nullptr;
  const float* rstd = nullptr;
  float* dx = nullptr;
  float* dgamma = nullptr;
  float* dbeta = nullptr;
  DType dtype = DType::kF32;  // Note [Storage dtype of a kernel]
};

// GELU with the tanh approximation (nn.GELU(approximate="tanh"), GPT-2's "gelu_new"):
// y = 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))).
struct GeluForward {
  int64_t n = 0;
  const float* x = nullptr;
  float* y = nullptr;
  DType dtype = DType::kF32;  // Note [Storage dtype of a kernel]
};

struct GeluBackward {  // dx = dy * d/dx gelu(x); dx may equal dy
  int64_t n = 0;
  const float* x = nullptr;
  const float* dy = nullptr;
  float* dx = nullptr;
  DType dtype = DType::kF32;  // Note [Storage dtype of a kernel]
};

// GPT-2's causal self-attention core, between the fused QKV projection and the output
// projection. qkv (N, T, 3C) holds q, k and v side by side (each C wide, as c_attn writes them);
// head h is columns [h D, (h + 1) D) of each, D = C / heads.
struct AttentionGeom {
  int64_t n = 1, t = 1, heads = 1, c = 1;
  float dropout = 0.0f;  // attn_dropout's p on the probabilities (training only)
  int64_t head_dim() const { return c / heads; }
  bool operator==(const AttentionGeom&) const = default;
};

// Per (n, h): S = q k^T / sqrt(D) with S[i, j] masked for j > i and, with segments, for j <
// segments[n, i] (Note [Segments of a packed row]); P = softmax(S) by rows (masked entries
// exactly 0); probs = P (N, heads, T, T), saved for backward. In training with dropout,
// P' = dropout(P) as DropoutForward draws it over the (N, heads, T, T) elements (seed, offset 0),
// mask as there; otherwise P' = P and mask is unused (may be null). y[n, i, h D + d] = (P' v)[i,
// d], heads merged back to (N, T, C). A null y computes probs alone (a recompute that rebuilds the
// probabilities; it never drops, so P' is not needed).
struct AttentionForward {
  AttentionGeom g;
  bool training = true;
  uint64_t seed = 0;
  const float* qkv = nullptr;
  float* y = nullptr;
  float* probs = nullptr;
  uint8_t* mask = nullptr;
  Workspace ws;
  const int32_t* segments = nullptr;  // (N, T) or null
  DType dtype = DType::kF32;          // Note [Storage dtype of a kernel]
};

// Gradients of AttentionForward in training: dqkv (N, T, 3C), overwritten (the dq, dk and dv
// column blocks). Reads qkv, probs and (with dropout) mask.
struct AttentionBackward {
  AttentionGeom g;
  const float* qkv = nullptr;
  const float* probs = nullptr;
  const uint8_t* mask = nullptr;
  const float* dy = nullptr;  // (N, T, C)
  float* dqkv = nullptr;
  Workspace ws;
  const int32_t* segments = nullptr;  // (N, T) or null, as the forward's
  DType dtype = DType::kF32;          // Note [Storage dtype of a kernel]
};

// Note [Fused attention]
// The same attention as AttentionForward computed blockwise (FlashAttention-2's online softmax):
// per query row i, a running max and sum over key blocks, so the (T, T) probabilities are never
// stored beyond one tile. Saved for backward: y and lse (N, heads, T), the natural log of row
// i's softmax denominator over the scaled scores (lse = m + log sum_j exp(s_ij - m)); the
// backward recomputes P = exp(S - lse) tile by tile, with D_i = sum_d dy_id y_id. Dropout draws
// the naive kernel's mask (counter_uniform(seed, element of (N, heads, T, T))) in both passes, so
// nothing per score is stored. Equal to AttentionForward/Backward up to float rounding. The
// tiles' scratch is the kernels' own (a few tiles per thread): no workspace.
struct FlashAttentionForward {
  AttentionGeom g;
  bool training = true;
  uint64_t seed = 0;
  const float* qkv = nullptr;         // (N, T, 3C)
  float* y = nullptr;                 // (N, T, C), or null (a recompute of lse alone)
  float* lse = nullptr;               // (N, heads, T), or null (a recompute of y alone)
  const int32_t* segments = nullptr;  // (N, T) or null
  DType dtype = DType::kF32;          // Note [Storage dtype of a kernel]
};

// Gradients of FlashAttentionForward in training: dqkv (N, T, 3C), overwritten. Reads qkv, y,
// lse and dy; `seed` is the forward's (the dropout mask is drawn again).
struct FlashAttentionBackward {
  AttentionGeom g;
  uint64_t seed = 0;
  const float* qkv = nullptr;
  const float* y = nullptr;
  const float* lse = nullptr;
  const float* dy = nullptr;  // (N, T, C)
  float* dqkv = nullptr;
  const int32_t* segments = nullptr;  // (N, T) or null, as the forward's
  DType dtype = DType::kF32;          // Note [Storage dtype of a kernel]
};

// ---- conversion ------------------------------------------------------------------------------

// y[i] = x[i] converted from `from` to `to` (kF32 or kBF16; device/bf16.h's float_to_bf16 to
// narrow, exact to widen), for i < n. Makes the bf16 working copy of the weights once per update
// (Note [The bf16 working copy] in trainer/exec/parameter_store.h).
struct ConvertFloats {
  int64_t n = 0;
  DType from = DType::kF32;
  DType to = DType::kBF16;
  const void* x = nullptr;
  void* y = nullptr;
};

// ---- the launch interface ----------------------------------------------------------------------

using KernelArgs = std::variant<
    ConvForward, ConvBackwardData, ConvBackwardWeights, LinearForward, LinearBackwardData,
    LinearBackwardWeights, PoolForward, PoolBackward, AdaptiveAvgPoolForward,
    AdaptiveAvgPoolBackward, BatchNormForwardTraining, BatchNormForwardInference, BatchNormBackward,
    ReluForward, ReluBackward, AddForward, Accumulate, CopyDevice, Fill, Scale, DropoutForward,
    DropoutBackward, SoftmaxCrossEntropyForward, SoftmaxCrossEntropyBackward, SgdUpdate,
    AdamWUpdate, EmbeddingForward, EmbeddingBackward, LayerNormForward, LayerNormBackward,
    GeluForward, GeluBackward, AttentionForward, AttentionBackward, SumOfSquares, ClipByNorm,
    FlashAttentionForward, FlashAttentionBackward, RmsNormForward, RmsNormBackward, RopeQkvForward,
    RopeQkvBackward, SwigluForward, SwigluBackward, ConvertFloats>;

// Index of a kernel kind in KernelArgs, for supports() queries.
using KernelKind = size_t;
template <typename T>
constexpr KernelKind kernel_kind() {
  return KernelArgs(T{}).index();
}
std::string_view kernel_name(KernelKind kind);
inline std::string_view kernel_name(const KernelArgs& args) { return kernel_name(args.index()); }

class Kernels {
 public:
  virtual ~Kernels() = default;
  // Whether this backend runs `kind` on `dtype`; callers fall back on purpose, never by accident.
  virtual bool supports(KernelKind kind, DType dtype) const = 0;
  // Scratch bytes `args` needs in args.ws (0 for most kernels). Addresses in args are ignored,
  // but whether an optional operand (a bias) is null is part of the geometry.
  virtual uint64_t workspace_bytes(const KernelArgs& args) = 0;
  // Enqueues the kernel on `stream` (a compute stream of this backend's device).
  virtual void launch(const KernelArgs& args, Stream& stream) = 0;
};

}  // namespace ferry
