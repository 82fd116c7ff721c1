#!/usr/bin/python3
"""model.init_from on the Hugging Face GPT-2 files users meet (run by ctest as hf_weights).

Every tensor is accounted for both ways (Note [Every tensor accounted for] in
trainer/checkpoint/model_checkpoint.cc):
1. an untied head (tie_word_embeddings=False) is refused in one error naming lm_head.weight;
   a tied head stored twice (equal) loads, and so do older files' attention mask buffers;
2. a 2-layer file into model.layers=1 is refused naming transformer.h.1.* and counting the
   rest, and loads with model.init_ignore_unused=true; a 1-layer file into model.layers=2 is
   refused naming the missing tensor;
3. GPT2Model's names (no "transformer.") load and give Hugging Face's eval loss;
4. a BF16 file loads (widened exactly) and gives the loss of the same BF16 weights in F32.
Exits 77 (ctest: skipped) without torch or transformers.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys

SKIP = 77
HEADS, WIDTH, VOCAB, CONTEXT, SEQ = 2, 32, 64, 16, 8


def write_tokens(path, tokens):
    """llm.c's token file: 256 int32 (magic 20240520, version 1, count), then uint16 tokens."""
    import numpy as np
    header = np.zeros(256, dtype=np.int32)
    header[0], header[1], header[2] = 20240520, 1, len(tokens)
    with open(path, "wb") as f:
        f.write(header.tobytes())
        f.write(np.asarray(tokens, dtype=np.uint16).tobytes())


def mean_loss(model, tokens):
    """Mean token loss over every full window of SEQ tokens, as `trainer eval` reports it."""
    import torch
    import torch.nn.functional as F
    total, count = 0.0, 0
    with torch.no_grad():
        for k in range((len(tokens) - 1) // SEQ):
            x, y = tokens[k * SEQ:k * SEQ + SEQ], tokens[k * SEQ + 1:k * SEQ + SEQ + 1]
            logits = model(torch.tensor([x])).logits[0].double()
            total += F.cross_entropy(logits, torch.tensor(y), reduction="sum").item()
            count += len(y)
    return total / count


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--trainer", required=True)
    parser.add_argument("--dir", required=True)
    args = parser.parse_args()
    try:
        import numpy as np
        import torch
        from safetensors.torch import save_file
        from transformers import GPT2Config, GPT2LMHeadModel
    except ImportError as e:
        print(f"SKIP: {e}; scripts/setup.sh installs transformers for /usr/bin/python3")
        return SKIP
    shutil.rmtree(args.dir, ignore_errors=True)
    os.makedirs(args.dir)
    torch.manual_seed(0)
    torch.set_num_threads(1)
    val = [int(t) for t in np.random.default_rng(0).integers(0, VOCAB, size=5 * SEQ + 1)]
    val_path = os.path.join(args.dir, "val.bin")
    write_tokens(val_path, val)
    cfg = os.path.join(args.dir, "gpt.yaml")
    with open(cfg, "w") as f:
        f.write("# written by hf_weights.py\n")
    failures = []

    def config(layers, **kw):
        return GPT2Config(n_layer=layers, n_head=HEADS, n_embd=WIDTH, vocab_size=VOCAB,
                          n_positions=CONTEXT, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                          **kw)

    def save(model, name):
        out = os.path.join(args.dir, name)
        model.save_pretrained(out, safe_serialization=True)
        return os.path.join(out, "model.safetensors")

    def ferry_eval(weights, name, layers, *keys):
        """(exit code, output, eval.json or None) of `trainer eval` on `weights`."""
        run_dir = os.path.join(args.dir, "run_" + name)
        cmd = [args.trainer, "eval", cfg, "model.name=gpt2", f"model.layers={layers}",
               f"model.heads={HEADS}", f"model.width={WIDTH}", f"model.vocab={VOCAB}",
               f"model.context={CONTEXT}", "data.source=tokens", f"data.seq_len={SEQ}",
               "data.batch_size=2", "device.threads=1", f"data.path={val_path}",
               f"model.init_from={weights}", f"run.dir={run_dir}", *keys]
        print("+", " ".join(cmd), flush=True)
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        result = os.path.join(run_dir, "eval.json")
        return p.returncode, p.stdout, (json.load(open(result)) if p.returncode == 0 else None)

    def expect_error(name, code, output, *words):
        error = [line for line in output.splitlines() if line.startswith("error:")]
        print(f"{name}: exit {code}, {error}")
        if code != 2 or len(error) != 1 or not all(w in error[0] for w in words):
            failures.append(f"{name}: exit {code}, expected 2 and one error line naming {words}:\n"
                            f"{output}")

    def expect_loss(name, got, ref):
        print(f"{name}: ferry {got['loss'] if got else None}  hugging face {ref:.8f}")
        if not got or abs(got["loss"] - ref) > 1e-5 * abs(ref):
            failures.append(f"{name}: loss {got} vs {ref}")

    # 1. The head: untied is refused, tied stored twice loads.
    untied = GPT2LMHeadModel(config(1, tie_word_embeddings=False))
    code, out, _ = ferry_eval(save(untied, "untied"), "untied", 1)
    expect_error("untied head", code, out, "'lm_head.weight'", "untied")
    tied = GPT2LMHeadModel(config(1))
    state = {k: v.clone().contiguous() for k, v in tied.state_dict().items()}
    state["lm_head.weight"] = state["transformer.wte.weight"].clone()
    twice = os.path.join(args.dir, "tied_twice.safetensors")
    save_file(state, twice)
    code, out, got = ferry_eval(twice, "tied_twice", 1)
    expect_loss("tied head stored twice", got, mean_loss(tied, val))
    # Older Hugging Face files also store each block's causal-mask buffers: not "unused".
    state.pop("lm_head.weight")
    state["transformer.h.0.attn.bias"] = torch.tril(torch.ones(CONTEXT, CONTEXT)).view(
        1, 1, CONTEXT, CONTEXT)
    state["transformer.h.0.attn.masked_bias"] = torch.tensor(-1e4)
    masks = os.path.join(args.dir, "mask_buffers.safetensors")
    save_file(state, masks)
    code, out, got = ferry_eval(masks, "mask_buffers", 1)
    expect_loss("attn.bias and attn.masked_bias buffers", got, mean_loss(tied, val))

    # 2. Layers: unused tensors are refused (or skipped on request), missing ones refused.
    two = save(GPT2LMHeadModel(config(2)), "two_layers")
    code, out, _ = ferry_eval(two, "unused", 1)
    expect_error("2 layers into 1", code, out, "'transformer.h.1.", "and 11 others")
    code, out, got = ferry_eval(two, "ignored", 1, "model.init_ignore_unused=true")
    if code != 0 or got is None:
        failures.append(f"model.init_ignore_unused=true: exit {code}\n{out}")
    code, out, _ = ferry_eval(save(tied, "one_layer"), "missing", 2)
    expect_error("1 layer into 2", code, out, "'transformer.h.1.")

    # 3. GPT2Model's names: the same blocks without "transformer.".
    base = save(tied.transformer, "gpt2model")
    code, out, got = ferry_eval(base, "gpt2model", 1)
    expect_loss("GPT2Model layout", got, mean_loss(tied, val))

    # 4. BF16 weights: read as the F32 values they hold.
    half = GPT2LMHeadModel(config(1)).to(torch.bfloat16)
    code, out, got = ferry_eval(save(half, "bf16"), "bf16", 1)
    expect_loss("bf16 file", got, mean_loss(half.float(), val))

    for f in failures:
        print("FAIL:", f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
