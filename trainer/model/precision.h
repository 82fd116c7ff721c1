// device.precision on a model graph: the storage dtype of every tensor, decided here and nowhere
// else (Note [Which tensors are bf16]). Invariant: Precision::kFp32 leaves the graph untouched.
#pragma once

#include "device/precision.h"
#include "trainer/model/graph.h"

namespace ferry {

// Note [Which tensors are bf16]
// device.precision bf16 is mixed precision as PyTorch autocast runs it, with Megatron's and
// apex O2's fp32 master weights. The rule, by tensor (TensorDesc::dtype after apply_precision):
//  bf16 (2 bytes an element):
//   - every floating activation: the outputs of convolutions, linear layers (Conv1D, the tied
//     LM head) and attention (autocast's lower-precision list: conv*, linear, matmul, bmm,
//     addmm, scaled_dot_product_attention), and of the ops that run in their input's dtype
//     (ReLU, GELU, SwiGLU, pooling, add, flatten, dropout, embedding, rotary qkv, batch, layer
//     and RMS norm's outputs),
//     attention's probabilities (N, H, T, T) included;
//   - the floating model input (images: converted once on upload, as autocast casts them at the
//     first convolution);
//   - the loss's saved probabilities (loss.probs: computed in fp32, stored bf16);
//   - every activation gradient (the lowering gives a gradient its activation's desc) and so
//     everything offload, prefetch and recompute move or rebuild: they move arena tensors.
//  fp32:
//   - parameters (the master weights), their gradients as accumulated and all-reduced (unless
//     comm.dtype bf16, which narrows only the wire), the optimizer state, buffers (batch norm's
//     running statistics);
//   - the statistics norms save for backward (batch norm's per-channel and layer norm's per-row
//     mean and inverse std, RMSNorm's per-row inverse rms: the aux of batchnorm2d, layernorm and
//     rmsnorm), and the outputs an op marks
//     as statistics (Op::statistic_outputs: fused attention's log-sum-exp);
//   - the loss and the other metrics.
//  Unchanged: integer and byte tensors (tokens, labels, segments, dropout and pooling masks).
// Math stays fp32 everywhere (fp32 accumulation in the products; norm statistics, softmax,
// log-sum-exp and the loss computed in fp32): this rule is about storage. The kernels read each
// operand's dtype from its desc (Note [Storage dtype of a kernel] in device/kernels.h); the
// tape, liveness, arena, offload bytes and the pinned host pool take bytes from the desc, so a
// bf16 tensor costs 2 bytes an element everywhere. A kernel's workspace is what the backend's
// Kernels says for the op's geometry.

// Rewrites the storage dtype of `graph`'s tensors for `precision` (no-op for kFp32).
void apply_precision(Graph& graph, Precision precision);

// Bytes of the tensors of `graph` (persistent ones excluded) with dtype `dtype`: the arena's
// share of that dtype before planning.
uint64_t activation_bytes(const Graph& graph, DType dtype);

}  // namespace ferry
