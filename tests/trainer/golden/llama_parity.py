#!/usr/bin/python3
"""Llama parity of ferry's CPU backend with Hugging Face's LlamaForCausalLM (run by ctest).

At two small shapes, one with grouped-query attention and an untied head, one tied without
grouping, from random weights moved away from their initial values (RMSNorm weights too):
1. `trainer eval` gives Hugging Face's mean token loss over every full window of a token file
   within 1e-5 relative: of the save_pretrained folder's model.safetensors with the sizes as keys
   (gqa), and of the folder itself, sharded, with no model key at all (tied).
2. 20 training steps (AdamW, decay on matrices only, clip_norm 1.0, windows in file order) give
   Hugging Face's per-step losses within 1e-4 relative: from the folder (gqa), from the file
   (tied).
3. `trainer export` of the last checkpoint loads in LlamaForCausalLM.from_pretrained and gives the
   loss `trainer eval` reports on the checkpoint, within 1e-5 relative.
4. Documents (data.documents padded per batch, and data.pack, where rotary positions restart
   at each document): `trainer eval` of the folder gives the loss of Hugging Face's right-padded
   batches (attention_mask, labels -100) within 1e-5 relative.
5. A GPT2LMHeadModel folder: `trainer eval` of the folder alone gives Hugging Face's loss, and
   `trainer export` of a trained checkpoint loads in GPT2LMHeadModel.from_pretrained with the
   same loss.
6. Bad folders are one error line each (exit 2): an architecture ferry does not train, a missing
   config field, a missing shard, a tensor of the wrong shape, a model key contradicting the
   folder.
Exits 77 (ctest: skipped) without torch or transformers.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys

from hf_common import close, mean_loss, run, windows, write_tokens

SKIP = 77
SEQ, BATCH, STEPS = 16, 4, 20
LR, WD, CLIP = 3e-3, 0.1, 1.0
VOCAB, CONTEXT = 96, 32
# name: layers, heads, kv_heads, width, ffn, tied, rope_theta
SHAPES = {
    "gqa": (2, 6, 2, 48, 80, False, 10000.0),
    "tied": (2, 4, 4, 64, 96, True, 500.0),
}


def llama_keys(shape):
    layers, heads, kv, width, ffn, tied, theta = shape
    return ["model.name=llama", f"model.layers={layers}", f"model.heads={heads}",
            f"model.kv_heads={kv}", f"model.width={width}", f"model.ffn={ffn}",
            f"model.vocab={VOCAB}", f"model.context={CONTEXT}", f"model.rope_theta={theta}",
            f"model.tie_embeddings={'true' if tied else 'false'}"]


def hf_model(shape, seed):
    """A random LlamaForCausalLM of `shape`, every weight moved away from its initial value."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    layers, heads, kv, width, ffn, tied, theta = shape
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=width, intermediate_size=ffn,
                         num_hidden_layers=layers, num_attention_heads=heads,
                         num_key_value_heads=kv, max_position_embeddings=CONTEXT,
                         rms_norm_eps=1e-5, rope_theta=theta, tie_word_embeddings=tied,
                         attention_bias=False, mlp_bias=False)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.add_(torch.randn_like(p) * (0.1 if p.dim() == 1 else 0.02))
    return config, model


def check_shape(args, name, shape, train, val, failures):
    import torch
    import torch.nn.functional as F
    from transformers import LlamaForCausalLM
    config, model = hf_model(shape, seed=len(name))
    hf_dir = os.path.join(args.dir, name, "hf")
    sharded = name == "tied"
    # Sharded: several model-0000k-of-0000n.safetensors and their index.
    model.save_pretrained(hf_dir, safe_serialization=True,
                          **({"max_shard_size": "40KB"} if sharded else {}))
    with open(os.path.join(hf_dir, "tokenizer.json"), "w") as f:  # export carries it along
        json.dump({"version": "1.0", "model": {"type": "WordLevel", "vocab": {"a": 0}}}, f)
    if sharded and not os.path.exists(os.path.join(hf_dir, "model.safetensors.index.json")):
        failures.append(f"{name}: save_pretrained wrote no shards")
    data = ["data.source=tokens", f"data.seq_len={SEQ}", f"data.batch_size={BATCH}",
            "device.backend=cpu", "device.threads=2"]
    single = hf_dir
    if sharded:  # the file keys read one unsharded model.safetensors
        single = os.path.join(args.dir, name, "hf_single")
        model.save_pretrained(single, safe_serialization=True)
    file_keys = llama_keys(shape) + data + [
        f"model.init_from={os.path.join(single, 'model.safetensors')}"]
    folder_keys = data + [f"model.init_from={hf_dir}"]  # the folder names the model
    eval_keys, train_keys = (folder_keys, file_keys) if sharded else (file_keys, folder_keys)
    cfg = os.path.join(args.dir, "llama.yaml")

    # 1. Evaluation of Hugging Face's weights.
    run_dir = os.path.join(args.dir, name, "eval")
    run([args.trainer, "eval", cfg, *eval_keys,
         f"data.path={os.path.join(args.dir, 'val.bin')}", f"run.dir={run_dir}"])
    ours = json.load(open(os.path.join(run_dir, "eval.json")))["loss"]
    ref = mean_loss(model, val, SEQ)
    print(f"{name}: eval loss: ferry {ours:.8f}  hugging face {ref:.8f}")
    if not close(ours, ref, 1e-5):
        failures.append(f"{name}: eval loss {ours} vs {ref}")

    # 2. Twenty AdamW steps from the same weights.
    run_dir = os.path.join(args.dir, name, "train")
    run([args.trainer, "train", cfg, *train_keys,
         f"data.path={os.path.join(args.dir, 'train.bin')}", "data.shuffle=false",
         f"run.dir={run_dir}", f"run.steps={STEPS}", "run.log_every=1", "optim.name=adamw",
         f"optim.lr={LR}", f"optim.weight_decay={WD}", "optim.decay=matrices",
         f"optim.clip_norm={CLIP}", f"checkpoint.every={STEPS}"])
    losses = [json.loads(line)["loss"] for line in open(os.path.join(run_dir, "metrics.jsonl"))]
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": WD},
                             {"params": no_decay, "weight_decay": 0.0}], lr=LR)
    batches = windows(train, SEQ)
    ref_losses = []
    for step in range(STEPS):
        rows = batches[step * BATCH:(step + 1) * BATCH]
        x = torch.tensor([r[0] for r in rows])
        y = torch.tensor([r[1] for r in rows])
        loss = F.cross_entropy(model(x).logits.reshape(-1, VOCAB), y.reshape(-1))
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
        opt.step()
        ref_losses.append(loss.item())
    for i, (a, b) in enumerate(zip(losses, ref_losses)):
        print(f"{name}: step {i + 1:2d}: ferry {a:.7f}  hugging face {b:.7f}")
        if not close(a, b, 1e-4):
            failures.append(f"{name}: step {i + 1} loss {a} vs {b}")
    if len(losses) != STEPS:
        failures.append(f"{name}: {len(losses)} logged losses, expected {STEPS}")

    # 3. The last checkpoint, exported, in transformers.
    ckpt = os.path.join(run_dir, "checkpoints", f"step_{STEPS}.safetensors")
    out = os.path.join(args.dir, name, "export")
    run([args.trainer, "export", ckpt, out])
    carried = os.path.exists(os.path.join(out, "tokenizer.json"))
    if carried != (train_keys == folder_keys):  # the run knows a tokenizer when it read the folder
        failures.append(f"{name}: export {'carried' if carried else 'left out'} tokenizer.json")
    exported = LlamaForCausalLM.from_pretrained(out)
    exported.eval()
    run_dir = os.path.join(args.dir, name, "eval_export")
    run([args.trainer, "eval", cfg, *data, f"model.init_from={ckpt}", *llama_keys(shape),
         f"data.path={os.path.join(args.dir, 'val.bin')}", f"run.dir={run_dir}"])
    ours = json.load(open(os.path.join(run_dir, "eval.json")))["loss"]
    ref = mean_loss(exported, val, SEQ)
    print(f"{name}: exported checkpoint: ferry {ours:.8f}  from_pretrained {ref:.8f}")
    if not close(ours, ref, 1e-5):
        failures.append(f"{name}: exported checkpoint loss {ours} vs {ref}")
    return hf_dir, data


def write_docs(args, rng):
    """Documents of 1 to 2*SEQ tokens, each led by the end-of-text token VOCAB - 1."""
    eot = VOCAB - 1
    docs = []
    for length in rng.integers(1, 2 * SEQ, size=22):
        docs.append([eot] + [int(t) for t in rng.integers(0, VOCAB - 1, size=int(length))])
    path = os.path.join(args.dir, "docs.bin")
    write_tokens(path, [t for d in docs for t in d] + [eot])
    return path, docs


def documents(args, hf_dir, data, docs_path, docs, failures):
    import torch
    from transformers import LlamaForCausalLM
    eot = VOCAB - 1
    model = LlamaForCausalLM.from_pretrained(hf_dir)
    model.eval()
    total, count = 0.0, 0
    for first in range(0, len(docs), BATCH):
        rows = [(d + [eot])[:SEQ + 1] for d in docs[first:first + BATCH]]
        width = max(len(r) for r in rows)
        ids = torch.tensor([r + [eot] * (width - len(r)) for r in rows])
        mask = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows])
        labels = torch.tensor([r + [-100] * (width - len(r)) for r in rows])
        with torch.no_grad():
            loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss.item()
        predicted = sum(len(r) - 1 for r in rows)
        total += loss * predicted
        count += predicted
    ref = total / count
    cfg = os.path.join(args.dir, "llama.yaml")
    for name, keys in (("eval_documents", ["data.documents=true", "data.len_bucket=4"]),
                       ("eval_packed", ["data.documents=true", "data.pack=true"])):
        run_dir = os.path.join(args.dir, "docs", name)
        run([args.trainer, "eval", cfg, *data, *keys, f"model.init_from={hf_dir}",
             f"data.path={docs_path}", f"run.dir={run_dir}"])
        ours = json.load(open(os.path.join(run_dir, "eval.json")))
        print(f"llama {name} loss: ferry {ours['loss']:.8f}  hugging face {ref:.8f} "
              f"({ours['tokens']} / {count} tokens)")
        if not close(ours["loss"], ref, 1e-5) or ours["tokens"] != count:
            failures.append(f"llama {name} loss {ours['loss']} vs {ref}, tokens "
                            f"{ours['tokens']} vs {count}")


def gpt2_folder(args, val, failures):
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(7)
    config = GPT2Config(n_layer=2, n_head=4, n_embd=32, vocab_size=VOCAB, n_positions=CONTEXT,
                        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    model = GPT2LMHeadModel(config)
    hf_dir = os.path.join(args.dir, "gpt2", "hf")
    model.save_pretrained(hf_dir, safe_serialization=True)
    cfg = os.path.join(args.dir, "llama.yaml")
    data = ["data.source=tokens", f"data.seq_len={SEQ}", f"data.batch_size={BATCH}",
            "device.backend=cpu", "device.threads=2"]
    run_dir = os.path.join(args.dir, "gpt2", "eval")
    run([args.trainer, "eval", cfg, *data, f"model.init_from={hf_dir}",
         f"data.path={os.path.join(args.dir, 'val.bin')}", f"run.dir={run_dir}"])
    ours = json.load(open(os.path.join(run_dir, "eval.json")))["loss"]
    ref = mean_loss(model, val, SEQ)
    print(f"gpt2 folder: eval loss: ferry {ours:.8f}  hugging face {ref:.8f}")
    if not close(ours, ref, 1e-5):
        failures.append(f"gpt2 folder: eval loss {ours} vs {ref}")
    run_dir = os.path.join(args.dir, "gpt2", "train")
    run([args.trainer, "train", cfg, *data, f"model.init_from={hf_dir}",
         f"data.path={os.path.join(args.dir, 'train.bin')}", f"run.dir={run_dir}", "run.steps=3",
         "optim.name=adamw", "optim.lr=0.003", "checkpoint.every=3"])
    ckpt = os.path.join(run_dir, "checkpoints", "step_3.safetensors")
    out = os.path.join(args.dir, "gpt2", "export")
    run([args.trainer, "export", ckpt, out])
    exported = GPT2LMHeadModel.from_pretrained(out)
    exported.eval()
    run_dir = os.path.join(args.dir, "gpt2", "eval_export")
    run([args.trainer, "eval", cfg, *data, f"model.init_from={out}",
         f"data.path={os.path.join(args.dir, 'val.bin')}", f"run.dir={run_dir}"])
    ours = json.load(open(os.path.join(run_dir, "eval.json")))["loss"]
    ref = mean_loss(exported, val, SEQ)
    print(f"gpt2 export: ferry {ours:.8f}  from_pretrained {ref:.8f}")
    if not close(ours, ref, 1e-5):
        failures.append(f"gpt2 export: loss {ours} vs {ref}")


def expect_refusal(args, cfg, keys, needle, failures):
    """`trainer eval` with `keys` exits 2 with one error line containing `needle`."""
    cmd = [args.trainer, "eval", cfg, *keys, f"run.dir={os.path.join(args.dir, 'refused')}"]
    print("+", " ".join(cmd), flush=True)
    p = subprocess.run(cmd, capture_output=True, text=True)
    errors = [line for line in p.stderr.splitlines() if line.startswith("error:")]
    print(f"  exit {p.returncode}: {errors}")
    if p.returncode != 2 or len(errors) != 1 or needle not in errors[0]:
        failures.append(f"expected exit 2 and one error naming {needle!r}, got {p.returncode}: "
                        f"{p.stderr.strip()}")


def bad_folders(args, hf_dir, data, failures):
    """Copies of a good folder, each broken one way."""
    cfg = os.path.join(args.dir, "llama.yaml")
    val = f"data.path={os.path.join(args.dir, 'val.bin')}"

    def broken(tag, edit_config=None, drop=None):
        d = os.path.join(args.dir, "bad", tag)
        shutil.copytree(hf_dir, d)
        if edit_config:
            path = os.path.join(d, "config.json")
            c = json.load(open(path))
            edit_config(c)
            json.dump(c, open(path, "w"))
        if drop:
            os.remove(os.path.join(d, drop))
        return d

    d = broken("arch", lambda c: c.update(architectures=["MistralForCausalLM"]))
    expect_refusal(args, cfg, data + [val, f"model.init_from={d}"],
                   "MistralForCausalLM, which ferry does not train (supported: LlamaForCausalLM, "
                   "GPT2LMHeadModel)", failures)
    d = broken("field", lambda c: c.pop("intermediate_size"))
    expect_refusal(args, cfg, data + [val, f"model.init_from={d}"], '"intermediate_size"',
                   failures)
    index = json.load(open(os.path.join(hf_dir, "model.safetensors.index.json")))
    shard = sorted(set(index["weight_map"].values()))[-1]
    d = broken("shard", drop=shard)
    expect_refusal(args, cfg, data + [val, f"model.init_from={d}"], f"shard '{shard}'", failures)
    d = broken("shape", lambda c: c.update(intermediate_size=c["intermediate_size"] + 8))
    expect_refusal(args, cfg, data + [val, f"model.init_from={d}"], "mlp.", failures)
    expect_refusal(args, cfg, data + [val, f"model.init_from={hf_dir}", "model.heads=2"],
                   "model.heads is 2", failures)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--trainer", required=True)
    parser.add_argument("--dir", required=True)
    args = parser.parse_args()
    try:
        import numpy as np
        import torch
        import transformers
        from transformers import LlamaForCausalLM  # noqa: F401
    except ImportError as e:
        print(f"SKIP: {e}; scripts/setup.sh installs transformers for /usr/bin/python3")
        return SKIP
    shutil.rmtree(args.dir, ignore_errors=True)
    os.makedirs(args.dir)
    print(f"transformers {transformers.__version__}, torch {torch.__version__}")
    torch.set_num_threads(2)
    rng = np.random.default_rng(0)
    train = [int(t) for t in rng.integers(0, VOCAB, size=BATCH * STEPS * SEQ + 1)]
    val = [int(t) for t in rng.integers(0, VOCAB, size=7 * SEQ + 5)]
    write_tokens(os.path.join(args.dir, "train.bin"), train)
    write_tokens(os.path.join(args.dir, "val.bin"), val)
    with open(os.path.join(args.dir, "llama.yaml"), "w") as f:
        f.write("# written by llama_parity.py\n")
    failures = []
    for name, shape in SHAPES.items():
        hf_dir, data = check_shape(args, name, shape, train, val, failures)
    docs_path, docs = write_docs(args, rng)
    documents(args, hf_dir, data, docs_path, docs, failures)
    gpt2_folder(args, val, failures)
    bad_folders(args, hf_dir, data, failures)  # the tied shape's sharded folder
    for f in failures:
        print("FAIL:", f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
