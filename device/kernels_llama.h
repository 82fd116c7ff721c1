// Kernel argument structs of the Llama family's layers (Hugging Face's LlamaForCausalLM): RMSNorm,
// rotary position embeddings fused with grouped-query attention's head repeat, and SwiGLU's gate.
// Included by kernels.h, whose conventions hold: row-major, device pointers, PyTorch's semantics.
#pragma once

#include <cstdint>

#include "device/dtype.h"

namespace ferry {

// LlamaRMSNorm over the last dimension: rows (M) of C values.
struct RmsNormGeom {
  int64_t rows = 1, c = 1;
  float eps = 1e-6f;
  bool operator==(const RmsNormGeom&) const = default;
};

// y = (x * rstd) * weight, rstd = 1 / sqrt(mean(x^2) + eps) per row (mean in float64), saved in
// rstd (rows) for backward.
struct RmsNormForward {
  RmsNormGeom g;
  const float* x = nullptr;
  const float* weight = nullptr;
  float* y = nullptr;
  float* rstd = nullptr;
  DType dtype = DType::kF32;  // Note [Storage dtype of a kernel] in kernels.h
};

// Gradients of RmsNormForward: dx = rstd * (g - xhat * mean(g * xhat)), g = dy * weight, xhat = x
// * rstd; dweight = the sum over rows of dy * xhat. Overwrites dx and dweight; dx may equal dy.
struct RmsNormBackward {
  RmsNormGeom g;
  const float* x = nullptr;
  const float* dy = nullptr;
  const float* weight = nullptr;
  const float* rstd = nullptr;
  float* dx = nullptr;
  float* dweight = nullptr;
  DType dtype = DType::kF32;  // Note [Storage dtype of a kernel] in kernels.h
};

// Note [Rotary embeddings into the attention's qkv]
// Llama's attention takes q (N*T, H*D), k and v (N*T, KV*D) from three projections. The rope_qkv
// kernel writes the (N*T, 3*H*D) qkv the attention core takes (kernels.h AttentionForward): q with
// rotary embeddings, k with rotary embeddings and each KV head repeated H/KV times (head h reads
// KV head h / (H/KV): transformers' repeat_kv), v repeated the same way. The rotation is Hugging
// Face's rotate_half: for i < D/2 and position p, angle = p * theta^(-2i/D) and
//   out[i] = x[i] cos - x[i + D/2] sin,  out[i + D/2] = x[i + D/2] cos + x[i] sin.
// The position p of row n*T + t is t, or t - segments[n, t] for packed documents (Note [Segments
// of a packed row]). As transformers computes them, the inverse frequency theta^(-2i/D) and the
// angle p * inv_freq are float32; their cosine and sine are taken in float64 and rounded once.
struct RopeGeom {
  int64_t n = 1, t = 1, heads = 1, kv_heads = 1, head_dim = 2;
  float theta = 10000.0f;
  int64_t q_width() const { return heads * head_dim; }
  int64_t kv_width() const { return kv_heads * head_dim; }
  bool operator==(const RopeGeom&) const = default;
};

struct RopeQkvForward {
  RopeGeom g;
  const float* q = nullptr;           // (N*T, H*D)
  const float* k = nullptr;           // (N*T, KV*D)
  const float* v = nullptr;           // (N*T, KV*D)
  float* qkv = nullptr;               // (N*T, 3*H*D)
  const int32_t* segments = nullptr;  // (N, T) or null
  DType dtype = DType::kF32;          // Note [Storage dtype of a kernel] in kernels.h
};

// The transpose: dq rotated back, dk rotated back and summed over each KV head's repeats (in
// increasing head order), dv summed the same way. Overwrites each non-null gradient.
struct RopeQkvBackward {
  RopeGeom g;
  const float* dqkv = nullptr;  // (N*T, 3*H*D)
  float* dq = nullptr;
  float* dk = nullptr;
  float* dv = nullptr;
  const int32_t* segments = nullptr;
  DType dtype = DType::kF32;  // Note [Storage dtype of a kernel] in kernels.h
};

// SwiGLU's gate (LlamaMLP): y = silu(gate) * up, silu(x) = x * sigmoid(x); n elements each.
struct SwigluForward {
  int64_t n = 0;
  const float* gate = nullptr;
  const float* up = nullptr;
  float* y = nullptr;
  DType dtype = DType::kF32;  // Note [Storage dtype of a kernel] in kernels.h
};

// dgate = dy * up * silu'(gate), dup = dy * silu(gate). Overwrites both; dgate may equal dy.
struct SwigluBackward {
  int64_t n = 0;
  const float* gate = nullptr;
  const float* up = nullptr;
  const float* dy = nullptr;
  float* dgate = nullptr;
  float* dup = nullptr;
  DType dtype = DType::kF32;  // Note [Storage dtype of a kernel] in kernels.h
};

}  // namespace ferry
