// Host entry points of the transformer kernels in transformer.cu (embedding, layer norm, GELU,
// gradient clipping), attention.cu (the attention core's softmax, causal mask and dropout
// between its cuBLAS products) and flash_attention.cu (the fused core). As kernel_ops.h: each
// enqueues on `stream` and returns, no float atomics, every reduction in an order fixed by the
// shape; arguments are checked by the caller.
// C++17 for nvcc.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "device/cuda/kernel_ops.h"

namespace ferry::cuda {

// ---- embedding (transformer.cu) --------------------------------------------------------------

// y (N*T, C) = wte[tokens] + wpe[p], p = t - segments[n, t] (t without segments), one thread
// per output element; a null wpe (Llama) adds nothing, and a null dwpe is not written.
void launch_embedding_forward(int64_t n, int64_t t, int64_t c, const int32_t* tokens,
                              const int32_t* segments, const float* wte, const float* wpe, float* y,
                              DType dtype, cudaStream_t stream);

// Note [Embedding backward without atomics]
// dwte: unless `accumulate`, dwte is zeroed first. Then vocabulary row v belongs to block
// v % grid; every block walks all N*T tokens in increasing (n, t) order and, for each token it
// owns, its threads add dy's row to dwte's row column by column. A row is written by one block
// only, in token order, so dwte[v] = ((dwte[v] + dy_first) + dy_second) + ... : the CPU
// backend's loop order, and the same bits for every grid. dwpe without segments: one thread per
// (t, c) adds dy over n in increasing n; rows [T, context) are zeroed. With segments, dwpe is
// zeroed and walked as dwte is, each token's row keyed by its position t - segments[n, t]: the
// same (n, t) order.
void launch_embedding_backward(int64_t n, int64_t t, int64_t c, int64_t vocab, int64_t context,
                               const int32_t* tokens, const int32_t* segments, const float* dy,
                               float* dwte, float* dwpe, bool accumulate, DType dtype,
                               cudaStream_t stream);

// ---- layer norm (transformer.cu) -------------------------------------------------------------

// One block per row (grid-stride over rows); the row's sums in double over kLayerNormLanes
// logical lanes and a fixed tree, so the order depends on C only.
void launch_layer_norm_forward(int64_t rows, int64_t c, float eps, const float* x,
                               const float* gamma, const float* beta, float* y, float* mean,
                               float* rstd, DType dtype, cudaStream_t stream);

// The most columns layer norm's backward reduces through the scratch (one partial per column
// and row chunk); wider rows are refused.
constexpr int64_t kLayerNormMaxColumns = kReductionPartials;

// dgamma and dbeta: the rows are cut into chunks by the shape alone, one partial per (chunk,
// column) into the reduction scratch, added in chunk order (Note [Deterministic multi-block
// reductions]); then dx per row as the forward. The column sums read dy before dx is written,
// so dx may equal dy. c <= kLayerNormMaxColumns.
void launch_layer_norm_backward(int64_t rows, int64_t c, const float* x, const float* dy,
                                const float* gamma, const float* mean, const float* rstd, float* dx,
                                float* dgamma, float* dbeta, DType dtype,
                                const ReductionScratch& scratch, cudaStream_t stream);

// ---- GELU, tanh approximation (transformer.cu) -----------------------------------------------

void launch_gelu_forward(int64_t n, const float* x, float* y, DType dtype, cudaStream_t stream);
// dx may equal dy.
void launch_gelu_backward(int64_t n, const float* x, const float* dy, float* dx, DType dtype,
                          cudaStream_t stream);

// ---- gradient clipping (transformer.cu) ------------------------------------------------------

// out[0] = sum of x[i]^2 in double: chunks fixed by n, lanes fixed inside a chunk, chunk
// partials added in order through `scratch` (Note [Deterministic multi-block reductions]).
void launch_sum_of_squares(int64_t n, const float* x, float* out, const ReductionScratch& scratch,
                           cudaStream_t stream);
// y *= min(1, max_norm / (sqrt(sum_sq[0]) + 1e-6)), sum_sq read on the device.
void launch_clip_by_norm(int64_t n, float max_norm, const float* sum_sq, float* y,
                         cudaStream_t stream);

// ---- attention core (attention.cu) ---------------------------------------------------------

// Rows of the (N, heads, T, T) score tensor: rows = N * heads * T, each T wide; row r is query
// position i = r % T of batch row r / (heads T), and element (r, j) is element r * T + j of the
// tensor (the dropout counter). `segments` (N, T), or null: each query's first key (Note
// [Segments of a packed row] in device/kernels.h).
//
// In place on `probs`: scores -> causal softmax (entries j > i, and j < the query's segment
// start, exactly 0). With keep < 1 (p = 1 - keep > 0), also dropped = DropoutForward(probs) at
// offset 0 (mask 1/0, kept / keep).
void launch_attention_softmax(int64_t rows, int64_t t, int64_t heads, const int32_t* segments,
                              float p, uint64_t seed, float* probs, float* dropped, uint8_t* mask,
                              cudaStream_t stream);
// The same from fp32 `scores` (overwritten: the exponentials are staged there) into `probs` and
// `dropped` of `dtype` (kBF16: rounded once from the fp32 softmax); kF32 with scores == probs is
// the in-place form above.
void launch_attention_softmax(int64_t rows, int64_t t, int64_t heads, const int32_t* segments,
                              float p, uint64_t seed, float* scores, float* probs, float* dropped,
                              uint8_t* mask, DType dtype, cudaStream_t stream);
// dropped = mask ? probs / (1 - p) : 0 (the forward's P', rebuilt for dV): fp32, or both of
// `dtype`.
void launch_attention_dropout_apply(int64_t count, float p, const float* probs, const uint8_t* mask,
                                    float* dropped, cudaStream_t stream);
void launch_attention_dropout_apply(int64_t count, float p, const float* probs, const uint8_t* mask,
                                    float* dropped, DType dtype, cudaStream_t stream);
// In place on `dprobs`: dP' -> dS = P (dP - rowsum(dP P)), dP = DropoutBackward(dP') when p > 0
// (mask may be null otherwise); masked entries 0. The 1/sqrt(D) is left to the products.
void launch_attention_softmax_backward(int64_t rows, int64_t t, int64_t heads,
                                       const int32_t* segments, float p, const float* probs,
                                       const uint8_t* mask, float* dprobs, cudaStream_t stream);
// The same with `probs` and dS (written to `dscores`) of `dtype`; dP' in `dprobs` stays fp32.
// kF32 with dscores == dprobs is the in-place form above.
void launch_attention_softmax_backward(int64_t rows, int64_t t, int64_t heads,
                                       const int32_t* segments, float p, const float* probs,
                                       const uint8_t* mask, float* dprobs, float* dscores,
                                       DType dtype, cudaStream_t stream);

// ---- fused attention core (flash_attention.cu) ------------------------------------------------

// Head widths the fused kernels take: up to kFlashSmallHead in tiles of 32 queries and keys, up
// to kFlashMaxHead in tiles of 16 (the tiles live in 48 KiB of static shared memory, in fp32 and
// in bf16: Note [Fused attention in bf16 on CUDA] in flash_attention.cu).
constexpr int kFlashSmallHead = 64;
constexpr int kFlashMaxHead = 128;

// FlashAttentionForward (Note [Fused attention] in device/kernels.h): y (N, T, C) and lse (N,
// heads, T), either may be null; dropout p > 0 draws the naive core's mask from `seed`. One block
// per query tile (grid-stride). qkv and y of `dtype` (kF32 or kBF16); lse fp32.
void launch_flash_attention_forward(int64_t n, int64_t t, int64_t heads, int64_t c, float dropout,
                                    uint64_t seed, const int32_t* segments, const float* qkv,
                                    float* y, float* lse, DType dtype, cudaStream_t stream);
// FlashAttentionBackward: dqkv overwritten; dK and dV by one block per key tile, then dq by one
// block per query tile, each recomputing the tile's probabilities. qkv, y, dy and dqkv of
// `dtype`; lse fp32.
void launch_flash_attention_backward(int64_t n, int64_t t, int64_t heads, int64_t c, float dropout,
                                     uint64_t seed, const int32_t* segments, const float* qkv,
                                     const float* y, const float* lse, const float* dy, float* dqkv,
                                     DType dtype, cudaStream_t stream);

}  // namespace ferry::cuda
