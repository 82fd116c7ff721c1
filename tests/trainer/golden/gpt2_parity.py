#!/usr/bin/python3
"""GPT-2 parity of ferry's CPU backend with Hugging Face transformers (run by ctest).

1. A random GPT2LMHeadModel (dropout 0) is saved by save_pretrained(safe_serialization=True);
   `trainer eval` with model.init_from on it gives Hugging Face's mean token loss over every full
   window of a token file within 1e-5 relative, and the perplexity exp(loss).
2. 20 training steps (AdamW, decay on matrices only, clip_norm 1.0, windows in file order) give
   Hugging Face's per-step losses within 1e-4 relative.
3. ferry's last checkpoint loads into GPT2LMHeadModel.load_state_dict(strict=False) with only
   lm_head.weight (tied) missing, and gives the loss `trainer eval` reports on it.
4. Documents (data.documents, padded per batch, and data.pack): `trainer eval` of Hugging Face's
   weights on a file of documents gives the loss of Hugging Face's padded batches (right
   padding, attention_mask, labels -100) within 1e-5 relative.
Exits 77 (ctest: skipped) without torch or transformers.
"""
import argparse
import json
import math
import os
import shutil
import sys

from hf_common import close, mean_loss, run, windows, write_tokens

SKIP = 77
LAYERS, HEADS, WIDTH, VOCAB, CONTEXT = 2, 4, 64, 96, 32
SEQ, BATCH, STEPS = 16, 4, 20
LR, WD, CLIP = 3e-3, 0.1, 1.0


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--trainer", required=True)
    parser.add_argument("--dir", required=True)
    args = parser.parse_args()
    try:
        import numpy as np
        import torch
        import transformers
        from safetensors.torch import load_file
        from transformers import GPT2Config, GPT2LMHeadModel
    except ImportError as e:
        print(f"SKIP: {e}; scripts/setup.sh installs transformers for /usr/bin/python3")
        return SKIP
    shutil.rmtree(args.dir, ignore_errors=True)
    os.makedirs(args.dir)
    print(f"transformers {transformers.__version__}, torch {torch.__version__}")
    torch.manual_seed(0)
    torch.set_num_threads(2)
    rng = np.random.default_rng(0)
    train = [int(t) for t in rng.integers(0, VOCAB, size=BATCH * STEPS * SEQ + 1)]
    val = [int(t) for t in rng.integers(0, VOCAB, size=7 * SEQ + 5)]  # 7 full windows + a tail
    write_tokens(os.path.join(args.dir, "train.bin"), train)
    write_tokens(os.path.join(args.dir, "val.bin"), val)

    config = GPT2Config(n_layer=LAYERS, n_head=HEADS, n_embd=WIDTH, vocab_size=VOCAB,
                        n_positions=CONTEXT, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    model = GPT2LMHeadModel(config)
    hf_dir = os.path.join(args.dir, "hf")
    model.save_pretrained(hf_dir, safe_serialization=True)
    weights = os.path.join(hf_dir, "model.safetensors")
    common = [f"model.name=gpt2", f"model.layers={LAYERS}", f"model.heads={HEADS}",
              f"model.width={WIDTH}", f"model.vocab={VOCAB}", f"model.context={CONTEXT}",
              "data.source=tokens", f"data.seq_len={SEQ}", f"data.batch_size={BATCH}",
              "device.backend=cpu", "device.threads=2"]
    cfg = os.path.join(args.dir, "gpt.yaml")
    with open(cfg, "w") as f:
        f.write("# written by gpt2_parity.py\n")

    failures = []

    def ferry_eval(weights_file, name):
        """`trainer eval` of `weights_file` on val.bin into run dir `name`: its eval.json."""
        run_dir = os.path.join(args.dir, name)
        run([args.trainer, "eval", cfg, *common, f"model.init_from={weights_file}",
             f"data.path={os.path.join(args.dir, 'val.bin')}", f"run.dir={run_dir}"])
        return json.load(open(os.path.join(run_dir, "eval.json")))

    # 1. Evaluation of Hugging Face's weights.
    ours = ferry_eval(weights, "eval_hf")
    ref = mean_loss(model, val, SEQ)
    print(f"eval loss: ferry {ours['loss']:.8f}  hugging face {ref:.8f}")
    if not close(ours["loss"], ref, 1e-5):
        failures.append(f"eval loss {ours['loss']} vs {ref}")
    if not close(ours["perplexity"], math.exp(ref), 1e-5):
        failures.append(f"perplexity {ours['perplexity']} vs {math.exp(ref)}")

    # 2. Twenty training steps from the same weights.
    run_dir = os.path.join(args.dir, "train")
    run([args.trainer, "train", cfg, *common, f"model.init_from={weights}",
         f"data.path={os.path.join(args.dir, 'train.bin')}", "data.shuffle=false",
         f"run.dir={run_dir}", f"run.steps={STEPS}", "run.log_every=1", "optim.name=adamw",
         f"optim.lr={LR}", f"optim.weight_decay={WD}", "optim.decay=matrices",
         f"optim.clip_norm={CLIP}", f"checkpoint.every={STEPS}"])
    losses = [json.loads(line)["loss"] for line in open(os.path.join(run_dir, "metrics.jsonl"))]
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": WD},
                             {"params": no_decay, "weight_decay": 0.0}], lr=LR)
    import torch.nn.functional as F
    batches = windows(train, SEQ)
    ref_losses = []
    for step in range(STEPS):
        rows = batches[step * BATCH:(step + 1) * BATCH]
        x = torch.tensor([r[0] for r in rows])
        y = torch.tensor([r[1] for r in rows])
        logits = model(x).logits
        loss = F.cross_entropy(logits.reshape(-1, VOCAB), y.reshape(-1))
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
        opt.step()
        ref_losses.append(loss.item())
    for i, (a, b) in enumerate(zip(losses, ref_losses)):
        print(f"step {i + 1:2d}: ferry {a:.7f}  hugging face {b:.7f}")
        if not close(a, b, 1e-4):
            failures.append(f"step {i + 1} loss {a} vs {b}")
    if len(losses) != STEPS:
        failures.append(f"{len(losses)} logged losses, expected {STEPS}")

    # 3. ferry's checkpoint in Hugging Face.
    ckpt = os.path.join(run_dir, "checkpoints", f"step_{STEPS}.safetensors")
    state = load_file(ckpt)
    trained = GPT2LMHeadModel(config)
    result = trained.load_state_dict(state, strict=False)
    print(f"missing keys: {result.missing_keys}")
    if result.missing_keys != ["lm_head.weight"]:
        failures.append(f"missing keys {result.missing_keys}")
    trained.tie_weights()
    ours = ferry_eval(ckpt, "eval_ferry")
    ref = mean_loss(trained, val, SEQ)
    print(f"checkpoint eval loss: ferry {ours['loss']:.8f}  hugging face {ref:.8f}")
    if not close(ours["loss"], ref, 1e-5):
        failures.append(f"checkpoint eval loss {ours['loss']} vs {ref}")

    # 4. Documents of changing length, padded per batch and packed, against padded batches.
    docs_path = os.path.join(args.dir, "docs.bin")
    eot = VOCAB - 1
    docs = []
    for length in rng.integers(1, 2 * SEQ, size=22):  # some longer than SEQ: cut there
        docs.append([eot] + [int(t) for t in rng.integers(0, VOCAB - 1, size=int(length))])
    write_tokens(docs_path, [t for d in docs for t in d] + [eot])
    saved = GPT2LMHeadModel.from_pretrained(hf_dir)  # `model` has trained since
    saved.eval()
    total, count = 0.0, 0
    for first in range(0, len(docs), BATCH):  # file order, as `trainer eval` reads them
        # Document d's window: its separator, its tokens and the next separator, cut at SEQ + 1
        # tokens: SEQ predicted positions at most.
        rows = [(d + [eot])[:SEQ + 1] for d in docs[first:first + BATCH]]
        width = max(len(r) for r in rows)
        ids = torch.tensor([r + [eot] * (width - len(r)) for r in rows])
        mask = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows])
        labels = torch.tensor([r + [-100] * (width - len(r)) for r in rows])
        with torch.no_grad():
            loss = saved(input_ids=ids, attention_mask=mask, labels=labels).loss.item()
        predicted = sum(len(r) - 1 for r in rows)
        total += loss * predicted
        count += predicted
    ref = total / count
    for name, keys in (("eval_documents", ["data.documents=true", "data.len_bucket=4"]),
                       ("eval_packed", ["data.documents=true", "data.pack=true"])):
        run_dir = os.path.join(args.dir, name)
        run([args.trainer, "eval", cfg, *common, *keys, f"model.init_from={weights}",
             f"data.path={docs_path}", f"run.dir={run_dir}"])
        ours = json.load(open(os.path.join(run_dir, "eval.json")))
        print(f"{name} loss: ferry {ours['loss']:.8f}  hugging face {ref:.8f} "
              f"({ours['tokens']} / {count} tokens)")
        if not close(ours["loss"], ref, 1e-5) or ours["tokens"] != count:
            failures.append(f"{name} loss {ours['loss']} vs {ref}, tokens {ours['tokens']} vs "
                            f"{count}")

    for f in failures:
        print("FAIL:", f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
