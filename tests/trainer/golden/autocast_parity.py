#!/usr/bin/python3
"""bf16 parity of ferry's CPU backend (device.precision=bf16) with PyTorch CPU autocast
(torch.autocast("cpu", dtype=torch.bfloat16), fp32 master weights), run by ctest as
autocast_parity_resnet (resnet18_cifar, SGD), autocast_parity_gpt (the zoo's gpt2 at a small
shape, against Hugging Face's GPT2LMHeadModel, AdamW) and autocast_parity_llama (the zoo's llama
with grouped-query attention and an untied head, against LlamaForCausalLM, AdamW). From the same
weights and batches:

1. the forward loss of the first batch within 1e-2 relative of autocast's;
2. every parameter's gradient on that batch with cosine similarity >= 0.999 to autocast's
   (ferry's gradient is w0 - w1 of one SGD step at lr 1, no momentum or decay: exact in fp32 up
   to one rounding of w1), where autocast's own gradient is that close to fp32's; elsewhere no
   farther from fp32's than 1.5 times autocast's distance (Note [Gradients where autocast itself
   is far from fp32]);
3. 20 optimizer steps (the Llama: 8) whose loss is within 2% of autocast's at every step;
4. ferry's bf16 run rounds: its gradients differ from ferry's own fp32 gradients (the same
   binary, bitwise equal if nothing were rounded) by more than 1e-4 in relative norm.
The tolerances are docs/precision.md's. Exits 77 (ctest: skipped) without torch (or transformers,
for the GPT and the Llama) or on a CPU without avx512_bf16.
"""
import argparse
import json
import math
import os
import shutil
import subprocess
import sys

from hf_common import run, windows, write_tokens

# Note [Gradients where autocast itself is far from fp32]
# The issue asks for cosine >= 0.999 between ferry's bf16 gradients and autocast's, per tensor.
# That holds for the GPT (lowest 0.99996). For resnet18_cifar it cannot: at initialisation the
# batch-norm backward cancels most of each gradient, so bf16 rounding of the activations and
# their gradients leaves PyTorch's own autocast gradients at cosine 0.86-0.97 from its fp32 ones
# in many conv and batch-norm tensors (layer2-layer4), and two correct bf16 implementations,
# rounding at different places, agree no better (ferry vs autocast: 0.97-0.98 there). Where
# autocast's gradient is within 0.999 of fp32's, ferry's must be within 0.999 of autocast's;
# elsewhere ferry's distance from the fp32 gradient, 1 - cosine, must be at most 1.5 times
# autocast's (measured: ferry 0.9398 vs autocast 0.9438 on layer3.0.bn2.bias, the worst ratio).
SKIP = 77
LOSS_RTOL, COSINE, STEP_RTOL, STEPS = 1e-2, 0.999, 0.02, 20
ANGLE_RATIO = 1.5  # Note [Gradients where autocast itself is far from fp32]
NOT_FP32 = 1e-4


def has_avx512_bf16():
    try:
        return any("avx512_bf16" in line.split() for line in open("/proc/cpuinfo")
                   if line.startswith("flags"))
    except OSError:
        return False


def resnet_case(args, torch, np):
    """resnet18_cifar on 32x32 CIFAR-10 records, batch 16."""
    import torch.nn as nn
    import torchvision
    batch = 16
    torch.manual_seed(0)
    model = torchvision.models.resnet18(num_classes=10)  # the zoo's resnet18_cifar:
    model.conv1 = nn.Conv2d(3, 64, 3, stride=1, padding=1, bias=False)  # 3x3 stem, stride 1
    nn.init.kaiming_normal_(model.conv1.weight, mode="fan_out", nonlinearity="relu")
    model.maxpool = nn.Identity()  # and no first max-pool (scripts/zoo_reference.py)
    rng = np.random.default_rng(0)
    # A learnable task, so that 20 steps move the loss: each class's images are its own random
    # template half-blended with noise.
    templates = rng.integers(0, 256, size=(10, 3 * 32 * 32))
    labels = rng.integers(0, 10, size=batch * STEPS)
    noise = rng.integers(0, 256, size=(batch * STEPS, 3 * 32 * 32))
    records = np.zeros((batch * STEPS, 1 + 3 * 32 * 32), dtype=np.uint8)
    records[:, 0] = labels
    records[:, 1:] = (templates[labels] + noise) // 2
    data = os.path.join(args.dir, "train.bin")
    records.tofile(data)  # CIFAR-10 binary: a label byte, then 3072 pixel bytes (C, H, W)
    images = torch.tensor(records[:, 1:].astype(np.float32) / 255.0).reshape(-1, 3, 32, 32)
    labels = torch.tensor(records[:, 0].astype(np.int64))
    batches = [(images[s * batch:(s + 1) * batch], labels[s * batch:(s + 1) * batch])
               for s in range(STEPS)]

    def loss_of(m, b):
        return torch.nn.functional.cross_entropy(m(b[0]).float(), b[1])

    ferry = ["model.name=resnet18_cifar", "data.source=cifar10", f"data.path={data}",
             f"data.batch_size={batch}"]
    optim = (["optim.name=sgd", "optim.lr=0.003", "optim.momentum=0.9",
              "optim.weight_decay=5e-4", "optim.decay=all"],
             lambda params: torch.optim.SGD(params, lr=0.003, momentum=0.9, weight_decay=5e-4))
    return model, batches, loss_of, ferry, optim, None


def successor_task(args, torch, np, vocab, seq, batch, steps):
    """The language models' learnable task: the next token is a fixed permutation of the last
    one, 9 times in 10. Writes the token file ferry reads; returns its path, `steps` batches of
    `batch` windows of `seq` (inputs, targets), and the fp32 cross-entropy of a model's logits."""
    rng = np.random.default_rng(0)
    successor = rng.permutation(vocab)
    tokens = [int(rng.integers(0, vocab))]
    for _ in range(batch * steps * seq):
        tokens.append(int(successor[tokens[-1]]) if rng.random() < 0.9
                      else int(rng.integers(0, vocab)))
    data = os.path.join(args.dir, "train.bin")
    write_tokens(data, tokens)
    rows = windows(tokens, seq)
    batches = []
    for s in range(steps):
        r = rows[s * batch:(s + 1) * batch]
        batches.append((torch.tensor([x for x, _ in r]), torch.tensor([y for _, y in r])))

    def loss_of(m, b):
        logits = m(b[0]).logits.float()
        return torch.nn.functional.cross_entropy(logits.reshape(-1, vocab), b[1].reshape(-1))
    return data, batches, loss_of


def adamw_decaying_matrices(torch):
    """AdamW at lr 3e-3, weight decay 0.1 on matrices only, clipped at norm 1: ferry's overrides
    and PyTorch's optimizer for them."""
    def adamw(params):
        params = list(params)
        return torch.optim.AdamW([{"params": [p for p in params if p.dim() >= 2],
                                   "weight_decay": 0.1},
                                  {"params": [p for p in params if p.dim() < 2],
                                   "weight_decay": 0.0}], lr=3e-3)
    return (["optim.name=adamw", "optim.lr=3e-3", "optim.weight_decay=0.1",
             "optim.decay=matrices", "optim.clip_norm=1.0"], adamw)


def gpt_case(args, torch, np):
    """Hugging Face GPT2LMHeadModel, 2 layers, width 128, 4 heads, vocab 256, 4 x 64 tokens."""
    from transformers import GPT2Config, GPT2LMHeadModel
    layers, heads, width, vocab, context, seq, batch = 2, 4, 128, 256, 64, 64, 4
    torch.manual_seed(0)
    config = GPT2Config(n_layer=layers, n_head=heads, n_embd=width, vocab_size=vocab,
                        n_positions=context, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    model = GPT2LMHeadModel(config)
    data, batches, loss_of = successor_task(args, torch, np, vocab, seq, batch, STEPS)

    ferry = ["model.name=gpt2", f"model.layers={layers}", f"model.heads={heads}",
             f"model.width={width}", f"model.vocab={vocab}", f"model.context={context}",
             "data.source=tokens", f"data.path={data}", f"data.seq_len={seq}",
             f"data.batch_size={batch}"]
    optim = adamw_decaying_matrices(torch)
    return model, batches, loss_of, ferry, optim, 1.0


def llama_case(args, torch, np):
    """Hugging Face LlamaForCausalLM, 2 layers, width 64, 4 heads over 2 KV heads, SwiGLU 128,
    an untied head, vocab 256, 4 x 32 tokens, 8 AdamW steps (a few CPU-seconds)."""
    from transformers import LlamaConfig, LlamaForCausalLM
    layers, heads, kv, width, ffn, vocab, context, seq, batch, steps = (
        2, 4, 2, 64, 128, 256, 64, 32, 4, 8)
    config = LlamaConfig(vocab_size=vocab, hidden_size=width, intermediate_size=ffn,
                         num_hidden_layers=layers, num_attention_heads=heads,
                         num_key_value_heads=kv, max_position_embeddings=context,
                         rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=False,
                         attention_bias=False, mlp_bias=False)
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    with torch.no_grad():  # RMSNorm weights away from 1, as llama_parity.py moves them
        for name, p in model.named_parameters():
            if p.dim() == 1:
                p.add_(torch.randn_like(p) * 0.1)
    data, batches, loss_of = successor_task(args, torch, np, vocab, seq, batch, steps)

    ferry = ["model.name=llama", f"model.layers={layers}", f"model.heads={heads}",
             f"model.kv_heads={kv}", f"model.width={width}", f"model.ffn={ffn}",
             f"model.vocab={vocab}", f"model.context={context}", "model.rope_theta=10000",
             "model.tie_embeddings=false", "data.source=tokens", f"data.path={data}",
             f"data.seq_len={seq}", f"data.batch_size={batch}"]
    optim = adamw_decaying_matrices(torch)
    return model, batches, loss_of, ferry, optim, 1.0


def torch_reference(torch, model, batches, loss_of, make_optim, clip, autocast):
    """PyTorch from `model`'s weights (left unchanged): the first batch's loss and gradients,
    and the loss of each of the optimizer steps, under bf16 autocast or in fp32."""
    import copy
    m = copy.deepcopy(model)
    m.train()
    opt = make_optim(m.parameters())
    losses, grads = [], None
    for b in batches:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            loss = loss_of(m, b)
        opt.zero_grad()
        loss.backward()
        if grads is None:
            grads = {n: p.grad.detach().double().clone() for n, p in m.named_parameters()}
        if clip:
            torch.nn.utils.clip_grad_norm_(m.parameters(), clip)
        opt.step()
        losses.append(loss.item())
    return losses, grads


def cosine(a, b):
    na, nb = a.norm().item(), b.norm().item()
    if na == 0 and nb == 0:
        return 1.0
    return (a.flatten() @ b.flatten()).item() / max(na * nb, 1e-300)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--trainer", required=True)
    parser.add_argument("--dir", required=True)
    parser.add_argument("--model", choices=["resnet", "gpt", "llama"], required=True)
    parser.add_argument("--precision", default="bf16", choices=["bf16", "fp32"],
                        help="ferry's device.precision (fp32: a check of the script itself)")
    args = parser.parse_args()
    try:
        import numpy as np
        import torch
        from safetensors.torch import load_file, save_file
        if args.model in ("gpt", "llama"):
            import transformers  # noqa: F401
        else:
            import torchvision  # noqa: F401
    except ImportError as e:
        print(f"SKIP: {e}; scripts/setup.sh installs torch, torchvision and transformers")
        return SKIP
    if args.precision == "bf16" and not has_avx512_bf16():
        print("SKIP: this CPU has no avx512_bf16 (ferry refuses device.precision=bf16 on it)")
        return SKIP
    shutil.rmtree(args.dir, ignore_errors=True)
    os.makedirs(args.dir)
    torch.set_num_threads(2)
    print(f"torch {torch.__version__}, ferry device.precision={args.precision}")
    case = {"resnet": resnet_case, "gpt": gpt_case, "llama": llama_case}[args.model]
    model, batches, loss_of, ferry_keys, (optim_keys, make_optim), clip = case(args, torch, np)
    steps = len(batches)

    # The same weights for both: ferry reads PyTorch's state_dict names (the zoo's parity). A tied
    # head (GPT-2's lm_head.weight) is the embedding's tensor: ferry reads it once, by that name.
    weights = os.path.join(args.dir, "init.safetensors")
    head = getattr(model, "lm_head", None)
    tied = head is not None and head.weight is model.get_input_embeddings().weight
    state = {n: t.detach().contiguous() for n, t in model.state_dict().items()
             if not n.endswith("num_batches_tracked") and not n.endswith(".attn.bias")
             and not n.endswith(".attn.masked_bias") and not (tied and n == "lm_head.weight")}
    save_file(state, weights)
    cfg = os.path.join(args.dir, "run.yaml")
    with open(cfg, "w") as f:
        f.write("# written by autocast_parity.py\n")
    common = [*ferry_keys, f"model.init_from={weights}", "data.shuffle=false",
              "device.backend=cpu", "device.threads=2", f"device.precision={args.precision}",
              "run.log_every=1"]

    def ferry_train(name, steps, keys):
        run_dir = os.path.join(args.dir, name)
        run([args.trainer, "train", cfg, *common, *keys, f"run.dir={run_dir}",
             f"run.steps={steps}", f"checkpoint.every={steps}"], stdout=subprocess.DEVNULL)
        losses = [json.loads(line)["loss"]
                  for line in open(os.path.join(run_dir, "metrics.jsonl"))]
        ckpt = os.path.join(run_dir, "checkpoints", f"step_{steps}.safetensors")
        return losses, load_file(ckpt)

    ref_losses, ref_grads = torch_reference(torch, model, batches, loss_of, make_optim, clip, True)
    fp32_losses, fp32_grads = torch_reference(torch, model, batches[:1], loss_of, make_optim,
                                              clip, False)
    failures = []

    # 1, 2 and 4: one SGD step at lr 1 gives the loss and the gradients of the first batch.
    gradient_step = ["optim.name=sgd", "optim.lr=1", "optim.momentum=0", "optim.weight_decay=0"]
    losses, stepped = ferry_train("gradients", 1, gradient_step)
    loss0 = losses[0]
    print(f"first loss: ferry {loss0:.7f}  autocast {ref_losses[0]:.7f}  "
          f"fp32 {fp32_losses[0]:.7f}")
    if abs(loss0 - ref_losses[0]) > LOSS_RTOL * abs(ref_losses[0]):
        failures.append(f"first loss {loss0} vs autocast's {ref_losses[0]}")
    if args.precision == "bf16":
        _, stepped32 = ferry_train("gradients_fp32", 1, gradient_step + ["device.precision=fp32"])
        apart = max(((stepped[n].double() - stepped32[n].double()).norm() /
                     max((state[n].double() - stepped32[n].double()).norm(), 1e-30)).item()
                    for n in ref_grads if n in state)
        print(f"ferry bf16 against ferry fp32 gradients: largest relative distance {apart:.2e}")
        if apart <= NOT_FP32:
            failures.append(f"bf16 gradients within {apart:.2e} of fp32's: nothing rounded?")
    worst, worst_name = 1.0, ""
    for name, g in ref_grads.items():
        if name not in state:
            continue  # a tied lm_head.weight: its gradient is the embedding's
        ours = state[name].double() - stepped[name].double()
        c = cosine(ours, g)
        if c < worst:
            worst, worst_name = c, name
        floor, c32 = cosine(g, fp32_grads[name]), cosine(ours, fp32_grads[name])
        print(f"  {name}: cosine to autocast {c:.6f}, to fp32 {c32:.6f}; autocast to fp32 "
              f"{floor:.6f}")
        if floor >= COSINE and c < COSINE:
            failures.append(f"{name}: gradient cosine {c:.6f} < {COSINE} "
                            f"(to fp32's: {c32:.6f}; autocast's to fp32's: {floor:.6f})")
        if floor < COSINE and 1 - c32 > ANGLE_RATIO * (1 - floor):
            failures.append(f"{name}: gradient cosine to fp32's {c32:.6f}, farther than "
                            f"{ANGLE_RATIO} x autocast's distance (its cosine {floor:.6f})")
    print(f"gradients: {len(ref_grads)} tensors, lowest cosine {worst:.6f} ({worst_name})")

    # 3. Twenty steps (the Llama: 8) of the run's optimizer.
    losses, _ = ferry_train("train", steps, optim_keys)
    if len(losses) != steps:
        failures.append(f"{len(losses)} logged losses, expected {steps}")
    for i, (a, b) in enumerate(zip(losses, ref_losses)):
        rel = abs(a - b) / abs(b)
        print(f"step {i + 1:2d}: ferry {a:.6f}  autocast {b:.6f}  ({rel:.2e})")
        if rel > STEP_RTOL:
            failures.append(f"step {i + 1} loss {a} vs autocast's {b}")

    for f in failures:
        print("FAIL:", f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
