// The attention core on cuBLAS. Note [Row-major products on cuBLAS] (linear_cublas.cc): a
// row-major (R, C) matrix with row stride L is the column-major (C x R) matrix with leading
// dimension L, so head h of q in qkv (T rows of D, row stride 3C, starting at column h D) is the
// column-major D x T matrix Q^T at qkv + h D, ld 3C; heads are a batch of stride D. Each product
// below is written as the column-major product it computes.
//
// Note [Attention's workspace]
// After cuBLAS's scratch (256-byte aligned): the forward with dropout holds P' = dropout(P)
// (N, heads, T, T), since probs must keep P for the backward; the backward holds dP' / dS
// (N, heads, T, T) and, with dropout, P' rebuilt from probs and mask for dV. These grow as T^2:
// GPT-2 small at N = 8, T = 1024 needs 400 MB per buffer.
//
// Note [Attention in bf16]
// In bf16 storage (qkv, y, probs, dy, dqkv bf16) the products are cuBLAS GEMMs on bf16 inputs
// with fp32 accumulation (CUBLAS_COMPUTE_32F, tensor cores). The scores S and the gradient dP'
// come out in fp32 into the workspace, so the softmax and its backward read fp32 as in fp32
// storage; P, P' and dS are stored bf16 (probs, and workspace buffers) because they are inputs
// of the next products, which take one input type. The workspace then holds, after cuBLAS's
// scratch: forward, the fp32 scores and, with dropout, the bf16 P'; backward, the fp32 dP', the
// bf16 dS and, with dropout, the bf16 P' rebuilt. fp32 storage runs the SGEMMs as before.
#include "device/cuda/attention_cublas.h"

#include <cublas_v2.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include <fmt/format.h>

#include "common/error.h"
#include "device/cuda/cuda_check.h"
#include "device/cuda/transformer_ops.h"
#include "device/dtype.h"
#include "device/kernel_checks.h"

namespace ferry::cuda {

namespace {

uint64_t aligned(uint64_t bytes) { return CublasHandle::aligned(bytes); }

// The backend-neutral rules, then cuBLAS's int dimensions.
void check(const AttentionGeom& g, const char* what) {
  check_attention_geom(g, what);
  if (g.t > INT_MAX || 3 * g.c > INT_MAX || g.heads > INT_MAX) {
    throw UnsupportedError(fmt::format("{}: T={} C={} heads={} exceed cuBLAS's int dimensions",
                                       what, g.t, g.c, g.heads),
                           "lower the sequence length");
  }
}

int i32(int64_t v) { return static_cast<int>(v); }

// Elements of the (N, heads, T, T) scores, and of one batch row's heads.
int64_t score_count(const AttentionGeom& g) { return g.n * g.heads * g.t * g.t; }
uint64_t score_bytes(const AttentionGeom& g, DType dtype = DType::kF32) {
  return aligned(static_cast<uint64_t>(score_count(g)) * dtype_size(dtype));
}

bool forward_drops(const AttentionForward& a) { return a.training && a.g.dropout > 0.0f; }
bool backward_drops(const AttentionBackward& a) { return a.g.dropout > 0.0f; }
bool bf16(DType dtype) { return dtype == DType::kBF16; }

// The kernel's storage dtype, kF32 or kBF16 (anything else is refused by name).
DType storage(DType dtype, const char* what) {
  if (dtype != DType::kF32 && dtype != DType::kBF16) {
    throw UnsupportedError(fmt::format("{}: the CUDA attention stores {} as fp32 or bf16 only",
                                       what, dtype_name(dtype)),
                           "set device.precision to fp32 or bf16");
  }
  return dtype;
}

float* after(const Workspace& ws, uint64_t offset) {
  return reinterpret_cast<float*>(static_cast<char*>(ws.ptr) + offset);
}

// Element `offset` of an array of `dtype` elements behind a float pointer.
template <typename T>
T* element(T* base, int64_t offset, DType dtype) {
  using Byte = std::conditional_t<std::is_const_v<T>, const char, char>;
  return reinterpret_cast<T*>(reinterpret_cast<Byte*>(base) + offset * dtype_size(dtype));
}

// C = alpha op(A) op(B) for each head of batch row n: one strided-batched GEMM over the heads.
// A and B hold `in` elements, C `out` elements (Note [Attention in bf16]).
struct HeadGemm {
  cublasOperation_t op_a, op_b;
  int m, n, k;
  float alpha;
  const float* a;
  int lda;
  long long stride_a;
  const float* b;
  int ldb;
  long long stride_b;
  float* c;
  int ldc;
  long long stride_c;
  DType in = DType::kF32, out = DType::kF32;
};

cudaDataType_t cuda_type(DType dtype) { return bf16(dtype) ? CUDA_R_16BF : CUDA_R_32F; }

void run_heads(cublasHandle_t h, const HeadGemm& p, int heads) {
  constexpr float kZero = 0.0f;
  if (p.in == DType::kF32 && p.out == DType::kF32) {
    CUBLAS_CHECK(cublasSgemmStridedBatched(h, p.op_a, p.op_b, p.m, p.n, p.k, &p.alpha, p.a, p.lda,
                                           p.stride_a, p.b, p.ldb, p.stride_b, &kZero, p.c, p.ldc,
                                           p.stride_c, heads));
    return;
  }
  CUBLAS_CHECK(cublasGemmStridedBatchedEx(
      h, p.op_a, p.op_b, p.m, p.n, p.k, &p.alpha, p.a, cuda_type(p.in), p.lda, p.stride_a, p.b,
      cuda_type(p.in), p.ldb, p.stride_b, &kZero, p.c, cuda_type(p.out), p.ldc, p.stride_c, heads,
      CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

// Workspace after cuBLAS's scratch (Note [Attention's workspace], Note [Attention in bf16]).
uint64_t forward_scratch(const AttentionForward& a) {
  const DType dt = storage(a.dtype, "attention_forward");
  if (!bf16(dt)) return forward_drops(a) ? score_bytes(a.g) : 0;
  return score_bytes(a.g) + (forward_drops(a) ? score_bytes(a.g, dt) : 0);
}

uint64_t backward_scratch(const AttentionBackward& a) {
  const DType dt = storage(a.dtype, "attention_backward");
  if (!bf16(dt)) return score_bytes(a.g) * (backward_drops(a) ? 2 : 1);
  return score_bytes(a.g) + score_bytes(a.g, dt) * (backward_drops(a) ? 2 : 1);
}

}  // namespace

CublasAttention::CublasAttention(const DeviceOptions& options) : blas_(options) {}

uint64_t CublasAttention::workspace_bytes(const AttentionForward& a) {
  check(a.g, "attention_forward");
  std::lock_guard lock(mutex_);
  return blas_.workspace() + forward_scratch(a);
}

uint64_t CublasAttention::workspace_bytes(const AttentionBackward& a) {
  check(a.g, "attention_backward");
  std::lock_guard lock(mutex_);
  return blas_.workspace() + backward_scratch(a);
}

// S = q k^T / sqrt(D) -> causal (segment-masked) softmax (-> dropout) -> y = P' v, per batch row
// over its heads.
void CublasAttention::launch(const AttentionForward& a, cudaStream_t stream) {
  check(a.g, "attention_forward");
  std::lock_guard lock(mutex_);
  const DType dt = storage(a.dtype, "attention_forward");
  const bool drops = forward_drops(a) && a.y != nullptr;  // probabilities alone: nothing drops
  if (drops && a.mask == nullptr) {
    throw ConfigError("attention_forward: training with dropout needs a mask",
                      "pass the (N, heads, T, T) mask buffer the backward reads");
  }
  const uint64_t blas = blas_.workspace();
  cublasHandle_t h = blas_.bind(stream, a.ws, blas + forward_scratch(a), "attention_forward");
  const AttentionGeom& g = a.g;
  const int t = i32(g.t), d = i32(g.head_dim()), ld_qkv = i32(3 * g.c), ld_y = i32(g.c);
  const long long tt = static_cast<long long>(g.t) * g.t;
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(g.head_dim())));
  // fp32: the scores in probs (in place); bf16: fp32 scores in the workspace.
  float* scores = bf16(dt) ? after(a.ws, blas) : a.probs;
  for (int64_t n = 0; n < g.n; ++n) {
    const float* q = element(a.qkv, n * g.t * 3 * g.c, dt);
    // S^T (T x T, ld T) = op_T(K^T) Q^T: row-major S.
    run_heads(h,
              {CUBLAS_OP_T, CUBLAS_OP_N, t, t, d, scale, element(q, g.c, dt), ld_qkv, d, q, ld_qkv,
               d, scores + n * g.heads * tt, t, tt, dt, DType::kF32},
              i32(g.heads));
  }
  float* dropped = nullptr;
  if (drops) dropped = after(a.ws, blas + (bf16(dt) ? score_bytes(g) : 0));
  launch_attention_softmax(g.n * g.heads * g.t, g.t, g.heads, a.segments, drops ? g.dropout : 0.0f,
                           a.seed, scores, a.probs, dropped, a.mask, dt, stream);
  if (a.y == nullptr) return;  // a recompute of the probabilities
  const float* p = drops ? dropped : a.probs;
  for (int64_t n = 0; n < g.n; ++n) {
    const float* v = element(a.qkv, n * g.t * 3 * g.c + 2 * g.c, dt);
    // Y^T (D x T, ld C) = V^T P'^T.
    run_heads(
        h,
        {CUBLAS_OP_N, CUBLAS_OP_N, d, t, t, 1.0f, v, ld_qkv, d, element(p, n * g.heads * tt, dt), t,
         tt, element(a.y, n * g.t * g.c, dt), ld_y, d, dt, dt},
        i32(g.heads));
  }
}

// dP' = dy v^T; dv = P'^T dy; dS = softmax_backward(dropout_backward(dP')); dq = dS k / sqrt(D);
// dk = dS^T q / sqrt(D). Every column of dqkv is written (beta 0).
void CublasAttention::launch(const AttentionBackward& a, cudaStream_t stream) {
  check(a.g, "attention_backward");
  std::lock_guard lock(mutex_);
  const DType dt = storage(a.dtype, "attention_backward");
  const bool drops = backward_drops(a);
  if (drops && a.mask == nullptr) {
    throw ConfigError("attention_backward: dropout needs the forward's mask",
                      "pass the mask attention_forward wrote");
  }
  const uint64_t blas = blas_.workspace();
  cublasHandle_t h = blas_.bind(stream, a.ws, blas + backward_scratch(a), "attention_backward");
  const AttentionGeom& g = a.g;
  const int t = i32(g.t), d = i32(g.head_dim()), ld_qkv = i32(3 * g.c), ld_y = i32(g.c);
  const long long tt = static_cast<long long>(g.t) * g.t;
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(g.head_dim())));
  // dP' (fp32) first; in bf16 dS gets its own bf16 buffer after it, then P' rebuilt.
  float* dscores = after(a.ws, blas);
  float* ds = bf16(dt) ? after(a.ws, blas + score_bytes(g)) : dscores;
  const uint64_t dropped_at = blas + score_bytes(g) + (bf16(dt) ? score_bytes(g, dt) : 0);
  for (int64_t n = 0; n < g.n; ++n) {
    const float* v = element(a.qkv, n * g.t * 3 * g.c + 2 * g.c, dt);
    // dP'^T (T x T, ld T) = op_T(V^T) dY^T: row-major dP' = dY V^T.
    run_heads(
        h,
        {CUBLAS_OP_T, CUBLAS_OP_N, t, t, d, 1.0f, v, ld_qkv, d, element(a.dy, n * g.t * g.c, dt),
         ld_y, d, dscores + n * g.heads * tt, t, tt, dt, DType::kF32},
        i32(g.heads));
  }
  const float* p = a.probs;
  if (drops) {
    float* dropped = after(a.ws, dropped_at);
    launch_attention_dropout_apply(score_count(g), g.dropout, a.probs, a.mask, dropped, dt, stream);
    p = dropped;
  }
  for (int64_t n = 0; n < g.n; ++n) {
    // dV^T (D x T, ld 3C) = dY^T op_T(P'^T): dV = P'^T dY.
    run_heads(h,
              {CUBLAS_OP_N, CUBLAS_OP_T, d, t, t, 1.0f, element(a.dy, n * g.t * g.c, dt), ld_y, d,
               element(p, n * g.heads * tt, dt), t, tt,
               element(a.dqkv, n * g.t * 3 * g.c + 2 * g.c, dt), ld_qkv, d, dt, dt},
              i32(g.heads));
  }
  launch_attention_softmax_backward(g.n * g.heads * g.t, g.t, g.heads, a.segments, g.dropout,
                                    a.probs, a.mask, dscores, ds, dt, stream);
  for (int64_t n = 0; n < g.n; ++n) {
    const float* q = element(a.qkv, n * g.t * 3 * g.c, dt);
    const float* k = element(q, g.c, dt);
    const float* dsn = element(ds, n * g.heads * tt, dt);
    float* dq = element(a.dqkv, n * g.t * 3 * g.c, dt);
    // dQ^T (D x T, ld 3C) = K^T dS^T: dQ = dS K.
    run_heads(
        h,
        {CUBLAS_OP_N, CUBLAS_OP_N, d, t, t, scale, k, ld_qkv, d, dsn, t, tt, dq, ld_qkv, d, dt, dt},
        i32(g.heads));
    // dK^T (D x T, ld 3C) = Q^T op_T(dS^T): dK = dS^T Q.
    run_heads(h,
              {CUBLAS_OP_N, CUBLAS_OP_T, d, t, t, scale, q, ld_qkv, d, dsn, t, tt,
               element(dq, g.c, dt), ld_qkv, d, dt, dt},
              i32(g.heads));
  }
}

}  // namespace ferry::cuda
