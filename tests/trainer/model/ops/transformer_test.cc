// The transformer ops' planner view (trainer/model/ops/transformer.cc): what the attention core
// saves for backward under model.attention=naive and fused, seen through the lowered tape and its
// liveness as the memory planner sees it, and what its backward costs.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>

#include "device/cpu/cpu_kernels.h"
#include "prefetch/liveness.h"
#include "prefetch/plan.h"
#include "trainer/exec/lower.h"
#include "trainer/model/zoo/zoo.h"

namespace ferry {
namespace {

// One gpt2 block (width 768, 12 heads) over one row of t tokens.
Graph gpt2_layer(int64_t t, bool fused) {
  TransformerSizes sizes{.layers = 1, .context = 4096};
  sizes.fused_attention = fused;
  return build_token_model("gpt2", 1, t, sizes);
}

// The saved activations (produced in forward, read in backward) of block 0, in bytes.
uint64_t saved_block_bytes(const Graph& g) {
  static cpu::CpuKernels kernels(1);
  const Lowered lowered = lower_graph(g, kernels, true);
  const Liveness live = analyse_liveness(lowered.tape);
  uint64_t bytes = 0;
  for (int t : saved_tensors(lowered.tape, live, false)) {
    const TapeTensor& tensor = lowered.tape.tensors[static_cast<size_t>(t)];
    if (tensor.name.rfind("transformer.h.0.", 0) == 0) bytes += tensor.bytes;
  }
  return bytes;
}

const Node& attention_node(const Graph& g) {
  for (const Node& n : g.nodes()) {
    if (n.name == "transformer.h.0.attn") return n;
  }
  throw std::runtime_error("no attention node");
}

// The planned saved-activation bytes of one gpt2 block: the fused core replaces the (12, T, T)
// probabilities by (12, T) log-sum-exps, so at T = 4096 the block saves at most a quarter of
// what the naive core's does (issue 29's must-hold; printed for the docs).
TEST(AttentionOp, FusedSavesAtMostAQuarterOfNaiveAtT4096) {
  for (int64_t t : {1024, 4096}) {
    const uint64_t naive = saved_block_bytes(gpt2_layer(t, false));
    const uint64_t fused = saved_block_bytes(gpt2_layer(t, true));
    std::printf(
        "gpt2 block 0, batch 1, T=%lld: saved activations naive %.1f MiB, fused %.1f MiB "
        "(%.3f)\n",
        static_cast<long long>(t), naive / 1048576.0, fused / 1048576.0,
        static_cast<double>(fused) / static_cast<double>(naive));
    // Exactly the probabilities traded for the log-sum-exps.
    EXPECT_EQ(naive - fused, 12 * t * t * sizeof(float) - 12 * t * sizeof(float));
    if (t == 4096) EXPECT_LE(4 * fused, naive);
  }
}

// The fused backward recomputes q k^T and the exponentials: its FLOPs say so; the forward's
// are the naive core's. Both rebuild what a recompute needs.
TEST(AttentionOp, FusedBackwardCostsTheRecomputedScores) {
  const Graph naive = gpt2_layer(256, false), fused = gpt2_layer(256, true);
  const OpCost a = attention_node(naive).op->cost(), b = attention_node(fused).op->cost();
  const double scores = 12.0 * 256 * 256, d = 64;
  EXPECT_EQ(b.forward_flops, a.forward_flops);
  EXPECT_EQ(b.backward_flops, a.backward_flops + 2 * scores * d + 5 * scores);
  EXPECT_EQ(attention_node(naive).op->rebuilt_outputs(), 2u);   // the probabilities alone
  EXPECT_EQ(attention_node(fused).op->rebuilt_outputs(), ~0u);  // y and the log-sum-exp
  static cpu::CpuKernels kernels(1);
  EXPECT_EQ(attention_node(fused).op->workspace_bytes(kernels, Pass::kForward, true), 0u);
  EXPECT_EQ(attention_node(fused).op->workspace_bytes(kernels, Pass::kBackward, true), 0u);
  EXPECT_GT(attention_node(naive).op->workspace_bytes(kernels, Pass::kBackward, true), 0u);
}

}  // namespace
}  // namespace ferry
