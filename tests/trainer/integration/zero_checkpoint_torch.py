#!/usr/bin/python3
"""A checkpoint of a sharded, host-optimizer run (memory.zero 2, memory.optimizer host, 4 ranks)
is one consolidated file that PyTorch reads: safetensors.torch loads it, every parameter has its
AdamW moments under today's names with its shape (finite, exp_avg_sq >= 0), and the weights load
into Hugging Face's GPT2LMHeadModel with only the tied head missing and give a finite loss.
Exits 77 (skipped) without torch, safetensors or transformers.
Usage: zero_checkpoint_torch.py CKPT LAYERS HEADS WIDTH VOCAB CONTEXT
"""
import math
import sys

SKIP = 77


def main():
    try:
        import torch
        from safetensors.torch import load_file
        from transformers import GPT2Config, GPT2LMHeadModel
    except ImportError as e:
        print(f"SKIP: {e}; scripts/setup.sh installs transformers for /usr/bin/python3")
        return SKIP
    ckpt = sys.argv[1]
    layers, heads, width, vocab, context = (int(a) for a in sys.argv[2:7])
    state = load_file(ckpt)
    params = {k: v for k, v in state.items() if k.startswith("transformer.")}
    assert params, f"no model tensors in {ckpt}: {sorted(state)[:8]}"
    for name, p in params.items():
        for slot in ("exp_avg", "exp_avg_sq"):
            key = f"optimizer.{slot}.{name}"
            assert key in state, f"{key} missing"
            m = state[key]
            assert m.shape == p.shape, (key, m.shape, p.shape)
            assert m.dtype == torch.float32, (key, m.dtype)
            assert torch.isfinite(m).all(), key
            if slot == "exp_avg_sq":
                assert (m >= 0).all(), key
        assert torch.isfinite(p).all(), name
    nonzero = sum(int(state[f"optimizer.exp_avg_sq.{n}"].count_nonzero()) for n in params)
    assert nonzero > 0, "the gathered moments are all zero"
    config = GPT2Config(n_layer=layers, n_head=heads, n_embd=width, vocab_size=vocab,
                        n_positions=context, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    model = GPT2LMHeadModel(config)
    result = model.load_state_dict(params, strict=False)
    assert result.missing_keys == ["lm_head.weight"], result.missing_keys
    assert not result.unexpected_keys, result.unexpected_keys
    model.tie_weights()
    model.eval()
    tokens = torch.arange(2 * context).remainder(vocab - 1).reshape(2, context)
    with torch.no_grad():
        loss = model(tokens, labels=tokens).loss.item()
    assert math.isfinite(loss), loss
    print(f"{ckpt}: {len(params)} parameters and their moments load in torch "
          f"{torch.__version__}; GPT2LMHeadModel loss {loss:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
