// Hugging Face's LlamaForCausalLM (transformers/models/llama/modeling_llama.py): pre-RMSNorm
// blocks, q/k/v/o projections without biases, rotary embeddings, grouped-query attention, a SwiGLU
// MLP, a final RMSNorm and an LM head tied to the token embedding or not. Parameters come out in
// its state_dict order and names (a tied lm_head.weight is model.embed_tokens.weight, stored once).
#include <fmt/format.h>

#include "trainer/model/zoo/models.h"

namespace ferry::zoo {

TensorId build_llama(GraphBuilder& b, const TransformerSizes& s) {
  // _init_weights: N(0, initializer_range = 0.02) for every Linear and the Embedding; RMSNorm 1.
  const ParamInit normal{ParamInit::Kind::kNormal, 0.02f};
  const bool tied = s.tie_embeddings.value_or(false);
  const float eps = static_cast<float>(s.norm_eps);
  const int64_t d = s.width / s.heads;
  TensorId wte = kNoTensor;
  TensorId x = b.token_embedding("model.embed_tokens", "model.embed_tokens.weight", s.vocab,
                                 s.width, normal, tied, &wte);  // (N*T, C)
  for (int64_t i = 0; i < s.layers; ++i) {
    const std::string l = fmt::format("model.layers.{}", i);
    TensorId h = b.rms_norm(x, l + ".input_layernorm", eps);
    const TensorId q = b.projection(h, l + ".self_attn.q_proj", s.heads * d, normal);
    const TensorId k = b.projection(h, l + ".self_attn.k_proj", s.kv_heads * d, normal);
    const TensorId v = b.projection(h, l + ".self_attn.v_proj", s.kv_heads * d, normal);
    h = b.rope_qkv(q, k, v, l + ".self_attn.rotary_emb", s.heads, s.kv_heads,
                   static_cast<float>(s.rope_theta));     // (N*T, 3 * heads * D)
    h = b.attention(h, l + ".self_attn", s.heads, 0.0f);  // (N*T, heads * D)
    h = b.projection(h, l + ".self_attn.o_proj", s.width, normal);
    x = b.add(x, h, l + ".add");
    TensorId m = b.rms_norm(x, l + ".post_attention_layernorm", eps);
    const TensorId gate = b.projection(m, l + ".mlp.gate_proj", s.ffn, normal);
    const TensorId up = b.projection(m, l + ".mlp.up_proj", s.ffn, normal);
    m = b.swiglu(gate, up, l + ".mlp.act_fn");  // (N*T, ffn)
    m = b.projection(m, l + ".mlp.down_proj", s.width, normal);
    x = b.add(x, m, l + ".add_1");
  }
  x = b.rms_norm(x, "model.norm", eps);
  if (tied) return b.tied_linear(x, "lm_head", wte);   // (N*T, vocab)
  return b.projection(x, "lm_head", s.vocab, normal);  // (N*T, vocab)
}

}  // namespace ferry::zoo
