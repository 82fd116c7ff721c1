// Hugging Face's GPT2LMHeadModel (transformers/models/gpt2/modeling_gpt2.py): pre-LayerNorm
// blocks, fused QKV Conv1D, causal attention, GELU (tanh) MLP of 4x width, final LayerNorm and
// an LM head tied to the token embedding. Parameters come out in its state_dict order and names
// (lm_head.weight is the tied wte, stored once), with its initialisers.
#include <cmath>

#include <fmt/format.h>

#include "trainer/model/zoo/models.h"

namespace ferry::zoo {

TensorId build_gpt2(GraphBuilder& b, const TransformerSizes& s) {
  // _init_weights: N(0, 0.02) for Conv1D and Embedding weights, biases 0, LayerNorm (1, 0); each
  // block's residual projections (c_proj) N(0, 0.02 / sqrt(2 * layers)).
  const ParamInit normal{ParamInit::Kind::kNormal, 0.02f};
  const ParamInit residual{ParamInit::Kind::kNormal,
                           0.02f / std::sqrt(2.0f * static_cast<float>(s.layers))};
  const float p = static_cast<float>(s.dropout);
  TensorId wte = kNoTensor;
  TensorId x = b.embedding("transformer.embed", "transformer.wte.weight", "transformer.wpe.weight",
                           s.vocab, s.context, s.width, normal, /*tied=*/true, &wte);  // (N*T, C)
  if (p > 0) x = b.dropout(x, p, "transformer.drop");
  for (int64_t i = 0; i < s.layers; ++i) {
    const std::string h = fmt::format("transformer.h.{}", i);
    TensorId a = b.layer_norm(x, h + ".ln_1");
    a = b.conv1d(a, h + ".attn.c_attn", 3 * s.width, normal);  // (N*T, 3C)
    a = b.attention(a, h + ".attn", s.heads, p);               // (N*T, C)
    a = b.conv1d(a, h + ".attn.c_proj", s.width, residual);
    if (p > 0) a = b.dropout(a, p, h + ".attn.resid_dropout");
    x = b.add(x, a, h + ".add");
    TensorId m = b.layer_norm(x, h + ".ln_2");
    m = b.conv1d(m, h + ".mlp.c_fc", 4 * s.width, normal);  // (N*T, 4C)
    m = b.gelu(m, h + ".mlp.act");
    m = b.conv1d(m, h + ".mlp.c_proj", s.width, residual);
    if (p > 0) m = b.dropout(m, p, h + ".mlp.dropout");
    x = b.add(x, m, h + ".add_1");
  }
  x = b.layer_norm(x, "transformer.ln_f");
  return b.tied_linear(x, "lm_head", wte);  // (N*T, vocab)
}

}  // namespace ferry::zoo
