// Host side of the CUDA backend's stateless kernels: the argument checks the CPU backend runs
// (device/kernel_checks.h), CUDA's own limits, then the launch (kernel_ops.h). Nothing here waits
// for the device; a check that needs device data (a label out of range) is reported through the
// result instead (NaN loss).
#include "device/cuda/cuda_ops.h"

#include <cstdint>

#include <fmt/format.h>

#include "common/error.h"
#include "device/cuda/cuda_check.h"
#include "device/cuda/elementwise.h"
#include "device/cuda/kernel_ops.h"
#include "device/cuda/llama_ops.h"
#include "device/cuda/transformer_ops.h"
#include "device/kernel_checks.h"

namespace ferry::cuda {
namespace {

PoolShape pool_shape(const PoolGeom& g) {
  PoolShape s;
  s.max = g.kind == PoolKind::kMax;
  s.planes = g.n * g.c;
  s.h = g.h;
  s.w = g.w;
  s.oh = g.out_h();
  s.ow = g.out_w();
  s.kh = g.kh;
  s.kw = g.kw;
  s.stride_h = g.stride_h;
  s.stride_w = g.stride_w;
  s.pad_h = g.pad_h;
  s.pad_w = g.pad_w;
  s.count_include_pad = g.count_include_pad;
  return s;
}

// The scratch of a reducing kernel, checked after its arguments: CudaKernels made without a
// device (for planning) have none.
const ReductionScratch& checked(const ReductionScratch& scratch, const char* what) {
  if (scratch.ptr == nullptr) {
    throw UnsupportedError(
        fmt::format("{}: CUDA kernels made without a device have no reduction scratch", what),
        "launch through the CUDA device's kernels (create_device)");
  }
  return scratch;
}

// The shape of a checked geometry, within the batch norm kernels' 32-bit channel index.
BatchNormShape bn_shape(const BatchNormGeom& g, const char* what) {
  if (g.n * g.hw > int64_t{UINT32_MAX}) {
    throw UnsupportedError(
        fmt::format("{}: {} values per channel (N={} H*W={}) exceed the CUDA kernel's 32-bit "
                    "channel index",
                    what, g.n * g.hw, g.n, g.hw),
        "lower data.batch_size");
  }
  return {g.n, g.c, g.hw, g.eps};
}

// bn_shape, within the reduction scratch's per-channel statistics (training and backward).
BatchNormShape bn_reduce_shape(const BatchNormGeom& g, const char* what) {
  if (g.c > kReductionChannels) {
    throw UnsupportedError(
        fmt::format("{}: {} channels exceed the CUDA batch norm kernel's {} (its reduction "
                    "scratch)",
                    what, g.c, kReductionChannels),
        "use fewer channels per batch norm layer, or set device.backend=cpu");
  }
  return bn_shape(g, what);
}

// The storage dtype of a kernel's bf16-eligible operands: kF32 or kBF16 (Note [Storage dtype of
// a kernel] in device/kernels.h); anything else is refused by name.
DType storage(DType dtype, const char* what) {
  if (dtype != DType::kF32 && dtype != DType::kBF16) {
    throw UnsupportedError(
        fmt::format("{}: the CUDA kernels store {} as fp32 or bf16 only", what, dtype_name(dtype)),
        "set device.precision to fp32 or bf16");
  }
  return dtype;
}

}  // namespace

void run(const PoolForward& a, cudaStream_t stream) {
  check_pool_geom(a.g, "pool_forward");
  launch_pool_forward(pool_shape(a.g), a.x, a.y, storage(a.dtype, "pool_forward"), stream);
}

void run(const PoolBackward& a, cudaStream_t stream) {
  check_pool_geom(a.g, "pool_backward");
  FERRY_ASSERT(a.g.kind != PoolKind::kMax || a.x != nullptr, "max pool backward needs x");
  launch_pool_backward(pool_shape(a.g), a.x, a.dy, a.dx, storage(a.dtype, "pool_backward"), stream);
}

void run(const AdaptiveAvgPoolForward& a, cudaStream_t stream) {
  check_adaptive_avg_pool(a.n, a.c, a.h, a.w, a.oh, a.ow, "adaptive_avg_pool_forward");
  launch_adaptive_avg_pool_forward(a.n * a.c, a.h, a.w, a.oh, a.ow, a.x, a.y,
                                   storage(a.dtype, "adaptive_avg_pool_forward"), stream);
}

void run(const AdaptiveAvgPoolBackward& a, cudaStream_t stream) {
  check_adaptive_avg_pool(a.n, a.c, a.h, a.w, a.oh, a.ow, "adaptive_avg_pool_backward");
  launch_adaptive_avg_pool_backward(a.n * a.c, a.h, a.w, a.oh, a.ow, a.dy, a.dx,
                                    storage(a.dtype, "adaptive_avg_pool_backward"), stream);
}

void run(const BatchNormForwardTraining& a, cudaStream_t stream, const ReductionScratch& scratch) {
  check_batch_norm_training_geom(a.g);
  const BatchNormShape s = bn_reduce_shape(a.g, "batch_norm_forward_training");
  launch_batch_norm_forward_training(s, a.momentum, a.x, a.gamma, a.beta, a.y, a.running_mean,
                                     a.running_var, a.save_mean, a.save_var,
                                     storage(a.dtype, "batch_norm_forward_training"),
                                     checked(scratch, "batch_norm_forward_training"), stream);
}

void run(const BatchNormForwardInference& a, cudaStream_t stream) {
  check_batch_norm_geom(a.g, "batch_norm_forward_inference");
  const BatchNormShape s = bn_shape(a.g, "batch_norm_forward_inference");
  launch_batch_norm_forward_inference(s, a.x, a.gamma, a.beta, a.running_mean, a.running_var, a.y,
                                      storage(a.dtype, "batch_norm_forward_inference"), stream);
}

void run(const BatchNormBackward& a, cudaStream_t stream, const ReductionScratch& scratch) {
  check_batch_norm_geom(a.g, "batch_norm_backward");
  const BatchNormShape s = bn_reduce_shape(a.g, "batch_norm_backward");
  launch_batch_norm_backward(s, a.x, a.dy, a.gamma, a.save_mean, a.save_var, a.dx, a.dgamma,
                             a.dbeta, storage(a.dtype, "batch_norm_backward"),
                             checked(scratch, "batch_norm_backward"), stream);
}

void run(const ReluForward& a, cudaStream_t stream) {
  check_element_count(a.n, "relu_forward");
  launch_relu_forward(a.n, a.x, a.y, storage(a.dtype, "relu_forward"), stream);
}

void run(const ReluBackward& a, cudaStream_t stream) {
  check_element_count(a.n, "relu_backward");
  launch_relu_backward(a.n, a.y, a.dy, a.dx, storage(a.dtype, "relu_backward"), stream);
}

void run(const AddForward& a, cudaStream_t stream) {
  check_element_count(a.n, "add_forward");
  launch_add(a.n, a.a, a.b, a.y, storage(a.dtype, "add_forward"), stream);
}

void run(const Accumulate& a, cudaStream_t stream) {
  check_element_count(a.n, "accumulate");
  launch_accumulate(a.n, a.x, a.y, storage(a.dtype, "accumulate"), stream);
}

void run(const CopyDevice& a, cudaStream_t stream) {
  if (a.bytes == 0) return;
  CUDA_CHECK(cudaMemcpyAsync(a.dst, a.src, a.bytes, cudaMemcpyDeviceToDevice, stream));
}

void run(const Fill& a, cudaStream_t stream) {
  check_element_count(a.n, "fill");
  launch_fill(a.y, a.n, a.value, storage(a.dtype, "fill"), stream);
}

void run(const Scale& a, cudaStream_t stream) {
  check_element_count(a.n, "scale");
  launch_scale(a.y, a.n, a.alpha, storage(a.dtype, "scale"), stream);
}

void run(const DropoutForward& a, cudaStream_t stream) {
  check_dropout_forward(a);
  launch_dropout_forward(a.n, a.p, a.seed, a.offset, a.x, a.y, a.mask,
                         storage(a.dtype, "dropout_forward"), stream);
}

void run(const DropoutBackward& a, cudaStream_t stream) {
  check_element_count(a.n, "dropout_backward");
  launch_dropout_backward(a.n, a.p, a.dy, a.mask, a.dx, storage(a.dtype, "dropout_backward"),
                          stream);
}

void run(const SoftmaxCrossEntropyForward& a, cudaStream_t stream,
         const ReductionScratch& scratch) {
  check_softmax_cross_entropy(a.n, a.k, "softmax_cross_entropy_forward");
  launch_softmax_cross_entropy_forward(
      a.n, a.k, a.logits, a.labels, a.loss, a.probs, a.correct,
      loss_divisor(a.divisor, a.n, "softmax_cross_entropy_forward"),
      storage(a.dtype, "softmax_cross_entropy_forward"),
      checked(scratch, "softmax_cross_entropy_forward"), stream);
}

void run(const SoftmaxCrossEntropyBackward& a, cudaStream_t stream) {
  check_softmax_cross_entropy(a.n, a.k, "softmax_cross_entropy_backward");
  const float factor =
      a.scale / static_cast<float>(loss_divisor(a.divisor, a.n, "softmax_cross_entropy_backward"));
  launch_softmax_cross_entropy_backward(a.n, a.k, factor, a.probs, a.labels, a.dlogits,
                                        storage(a.dtype, "softmax_cross_entropy_backward"), stream);
}

void run(const SgdUpdate& a, cudaStream_t stream) {
  check_sgd_update(a);
  launch_sgd_update(a.n, a.lr, a.momentum, a.weight_decay, a.nesterov, a.param, a.grad,
                    a.momentum_buf, stream);
}

// The scalars are the CPU backend's (adamw_scalars), so both update from the same floats.
void run(const AdamWUpdate& a, cudaStream_t stream) {
  check_adamw_update(a);
  launch_adamw_update(a.n, adamw_scalars(a), a.param, a.grad, a.m, a.v, stream);
}

// ---- transformers ----------------------------------------------------------------------------

void run(const EmbeddingForward& a, cudaStream_t stream) {
  check_embedding_forward(a);
  launch_embedding_forward(a.n, a.t, a.c, a.tokens, a.segments, a.wte, a.wpe, a.y,
                           storage(a.dtype, "embedding_forward"), stream);
}

void run(const EmbeddingBackward& a, cudaStream_t stream) {
  check_embedding_backward(a);
  launch_embedding_backward(a.n, a.t, a.c, a.vocab, a.context, a.tokens, a.segments, a.dy, a.dwte,
                            a.dwpe, a.accumulate_wte, storage(a.dtype, "embedding_backward"),
                            stream);
}

void run(const LayerNormForward& a, cudaStream_t stream) {
  check_layer_norm_forward(a);
  launch_layer_norm_forward(a.g.rows, a.g.c, a.g.eps, a.x, a.gamma, a.beta, a.y, a.mean, a.rstd,
                            storage(a.dtype, "layer_norm_forward"), stream);
}

void run(const LayerNormBackward& a, cudaStream_t stream, const ReductionScratch& scratch) {
  if (a.g.c > kLayerNormMaxColumns) {
    throw UnsupportedError(
        fmt::format("layer_norm_backward: {} columns exceed the CUDA kernel's {} (its reduction "
                    "scratch)",
                    a.g.c, kLayerNormMaxColumns),
        "use a narrower model, or set device.backend=cpu");
  }
  check_layer_norm_backward(a);
  launch_layer_norm_backward(a.g.rows, a.g.c, a.x, a.dy, a.gamma, a.mean, a.rstd, a.dx, a.dgamma,
                             a.dbeta, storage(a.dtype, "layer_norm_backward"),
                             checked(scratch, "layer_norm_backward"), stream);
}

void run(const GeluForward& a, cudaStream_t stream) {
  check_gelu_forward(a);
  launch_gelu_forward(a.n, a.x, a.y, storage(a.dtype, "gelu_forward"), stream);
}

void run(const GeluBackward& a, cudaStream_t stream) {
  check_gelu_backward(a);
  launch_gelu_backward(a.n, a.x, a.dy, a.dx, storage(a.dtype, "gelu_backward"), stream);
}

void run(const SumOfSquares& a, cudaStream_t stream, const ReductionScratch& scratch) {
  check_element_count(a.n, "sum_of_squares");
  launch_sum_of_squares(a.n, a.x, a.out, checked(scratch, "sum_of_squares"), stream);
}

void run(const ClipByNorm& a, cudaStream_t stream) {
  check_element_count(a.n, "clip_by_norm");
  launch_clip_by_norm(a.n, a.max_norm, a.sum_sq, a.y, stream);
}

namespace {
// The fused kernels' tiles hold at most kFlashMaxHead columns per row.
void check_flash_head(const AttentionGeom& g, const char* what) {
  if (g.head_dim() > kFlashMaxHead) {
    throw UnsupportedError(fmt::format("{}: head width {} exceeds the CUDA fused kernel's {}", what,
                                       g.head_dim(), kFlashMaxHead),
                           "set model.attention=naive, or use device.backend=cpu");
  }
}
}  // namespace

void run(const FlashAttentionForward& a, cudaStream_t stream) {
  check_flash_attention_forward(a);
  check_flash_head(a.g, "flash_attention_forward");
  launch_flash_attention_forward(a.g.n, a.g.t, a.g.heads, a.g.c, a.training ? a.g.dropout : 0.0f,
                                 a.seed, a.segments, a.qkv, a.y, a.lse,
                                 storage(a.dtype, "flash_attention_forward"), stream);
}

void run(const FlashAttentionBackward& a, cudaStream_t stream) {
  check_flash_attention_backward(a);
  check_flash_head(a.g, "flash_attention_backward");
  launch_flash_attention_backward(a.g.n, a.g.t, a.g.heads, a.g.c, a.g.dropout, a.seed, a.segments,
                                  a.qkv, a.y, a.lse, a.dy, a.dqkv,
                                  storage(a.dtype, "flash_attention_backward"), stream);
}

// ---- Llama -----------------------------------------------------------------------------------

void run(const RmsNormForward& a, cudaStream_t stream) {
  check_rms_norm_forward(a);
  launch_rms_norm_forward(a.g.rows, a.g.c, a.g.eps, a.x, a.weight, a.y, a.rstd,
                          storage(a.dtype, "rms_norm_forward"), stream);
}

void run(const RmsNormBackward& a, cudaStream_t stream, const ReductionScratch& scratch) {
  if (a.g.c > kRmsNormMaxColumns) {
    throw UnsupportedError(
        fmt::format("rms_norm_backward: {} columns exceed the CUDA kernel's {} (its reduction "
                    "scratch)",
                    a.g.c, kRmsNormMaxColumns),
        "use a narrower model, or set device.backend=cpu");
  }
  check_rms_norm_backward(a);
  launch_rms_norm_backward(a.g.rows, a.g.c, a.x, a.dy, a.weight, a.rstd, a.dx, a.dweight,
                           storage(a.dtype, "rms_norm_backward"),
                           checked(scratch, "rms_norm_backward"), stream);
}

void run(const RopeQkvForward& a, cudaStream_t stream) {
  check_rope_qkv_forward(a);
  const RopeGeom& g = a.g;
  launch_rope_qkv_forward(g.n, g.t, g.heads, g.kv_heads, g.head_dim, g.theta, a.q, a.k, a.v,
                          a.segments, a.qkv, storage(a.dtype, "rope_qkv_forward"), stream);
}

void run(const RopeQkvBackward& a, cudaStream_t stream) {
  check_rope_qkv_backward(a);
  const RopeGeom& g = a.g;
  launch_rope_qkv_backward(g.n, g.t, g.heads, g.kv_heads, g.head_dim, g.theta, a.dqkv, a.segments,
                           a.dq, a.dk, a.dv, storage(a.dtype, "rope_qkv_backward"), stream);
}

void run(const SwigluForward& a, cudaStream_t stream) {
  check_swiglu_forward(a);
  launch_swiglu_forward(a.n, a.gate, a.up, a.y, storage(a.dtype, "swiglu_forward"), stream);
}

void run(const SwigluBackward& a, cudaStream_t stream) {
  check_swiglu_backward(a);
  launch_swiglu_backward(a.n, a.gate, a.up, a.dy, a.dgate, a.dup,
                         storage(a.dtype, "swiglu_backward"), stream);
}

}  // namespace ferry::cuda
