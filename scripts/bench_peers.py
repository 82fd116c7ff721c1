#!/usr/bin/env python3
"""ferry against its PyTorch peers on this machine, interleaved run by run, each run with the
machine's load (uptime) beside it: CNNs (bench_step_time vs bench_pytorch_step.py), GPTs
(bench_step_time vs bench_hf_gpt_step.py) and a Llama (vs bench_hf_llama_step.py). Prints the
peer's setup (torch, BLAS, threading), each run and a Markdown table of medians. Invariant: every figure printed was measured in this
invocation; nothing is copied from an earlier run.

With --bf16 (issue 28): ferry device.precision=bf16 against ferry fp32 and against PyTorch CPU
autocast bf16 (the same peer scripts with --autocast), for resnet18_cifar batch 64 and the GPT
6 x 384 at batch 8 x 256; the three arms interleaved, each run with its load.

Usage: scripts/bench_peers.py [--threads 2] [--reps 3] [--only cnn|gpt|llama] [--bf16] [--out DIR]
"""
import argparse
import json
import os
import random
import statistics
import struct
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PY = "/usr/bin/python3"


def load():
    return open("/proc/loadavg").read().split()[0]


def run_json(cmd, prefix="", env=None):
    out = subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True, text=True, env=env)
    for line in out.stdout.splitlines():
        if line.startswith(prefix + "{") or line.startswith(prefix + "["):
            return json.loads(line[len(prefix):]), out.stderr
    raise RuntimeError(f"no JSON from {' '.join(cmd)}:\n{out.stdout}\n{out.stderr}")


def config(out, name, text):
    path = os.path.join(out, name + ".yaml")
    with open(path, "w") as f:
        f.write(text)
    return path


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--only", choices=["cnn", "gpt", "llama"])
    ap.add_argument("--out", default="/tmp/ferry_bench_peers")
    ap.add_argument("--bf16", action="store_true",
                    help="ferry bf16 vs ferry fp32 vs PyTorch CPU autocast bf16 "
                         "(resnet18_cifar, GPT 6 x 384)")
    ap.add_argument("--coretype", default="auto",
                    help="OPENBLAS_CORETYPE for the peer: auto (from the CPU's flags, "
                         "peer_setup.openblas_coretype), none, or a name")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    t = args.threads
    sys.path.insert(0, os.path.join(ROOT, "scripts"))
    from peer_setup import openblas_coretype
    coretype = openblas_coretype() if args.coretype == "auto" else (
        None if args.coretype == "none" else args.coretype)
    peer_env = dict(os.environ)
    if coretype:
        peer_env["OPENBLAS_CORETYPE"] = coretype
    cases = []  # (label, ferry command, peer command, steps)
    if args.only in (None, "cnn"):
        for model in ("vgg11_cifar", "resnet18_cifar"):
            cfg = config(args.out, model,
                         f"run: {{dir: {args.out}/run_{model}}}\nmodel: {{name: {model}}}\n"
                         f"data: {{batch_size: 64, samples: 256}}\n"
                         f"device: {{memory: 8GiB, threads: {t}}}\n")
            cases.append((f"{model}, batch 64",
                          ["build/bench_step_time", cfg, "--steps", "5", "--warmup", "2"],
                          [PY, "scripts/bench_pytorch_step.py", model, "64", "--threads", str(t),
                           "--steps", "5", "--warmup", "2"]))
    if args.only in (None, "llama"):
        # A Llama of 6 layers, width 384 (6 heads, 2 KV), ffn 1024, vocabulary 32000, untied.
        tokens = os.path.join(args.out, "llama_tokens.bin")
        count = 1 << 16
        rng = random.Random(0)
        with open(tokens, "wb") as f:
            f.write(struct.pack("<256i", 20240520, 1, count, *([0] * 253)))
            f.write(struct.pack(f"<{count}H", *(rng.randrange(32000) for _ in range(count))))
        cfg = config(args.out, "llama_6_384",
                     f"run: {{dir: {args.out}/run_llama}}\n"
                     f"model: {{name: llama, layers: 6, heads: 6, kv_heads: 2, width: 384, "
                     f"ffn: 1024, vocab: 32000}}\n"
                     f"data: {{source: tokens, path: {tokens}, batch_size: 8, seq_len: 256, "
                     f"mean: [], std: []}}\n"
                     f"optim: {{name: adamw, lr: 0.0001}}\n"
                     f"device: {{memory: 16GiB, threads: {t}}}\n")
        cases.append(("llama 6 x 384 (6 heads, 2 KV), batch 8 x 256",
                      ["build/bench_step_time", cfg, "--steps", "2", "--warmup", "1"],
                      [PY, "scripts/bench_hf_llama_step.py", "--layers", "6", "--heads", "6",
                       "--kv-heads", "2", "--width", "384", "--ffn", "1024", "--batch", "8",
                       "--seq", "256", "--threads", str(t), "--steps", "2", "--warmup", "1"]))
    if args.only in (None, "gpt"):
        # Random GPT-2 token ids in llm.c's format (scripts/prepare_tokens.py), like the peer's.
        tokens = os.path.join(args.out, "tokens.bin")
        count = 1 << 16
        rng = random.Random(0)
        with open(tokens, "wb") as f:
            f.write(struct.pack("<256i", 20240520, 1, count, *([0] * 253)))
            f.write(struct.pack(f"<{count}H", *(rng.randrange(50257) for _ in range(count))))
        for name, layers, heads, width, batch in (("gpt 6 x 384", 6, 6, 384, 8),
                                                  ("gpt2", 12, 12, 768, 4)):
            cfg = config(args.out, f"gpt_{layers}_{width}",
                         f"run: {{dir: {args.out}/run_gpt_{layers}}}\n"
                         f"model: {{name: gpt2, layers: {layers}, heads: {heads}, "
                         f"width: {width}}}\n"
                         f"data: {{source: tokens, path: {tokens}, batch_size: {batch}, "
                         f"seq_len: 256, mean: [], std: []}}\n"
                         f"optim: {{name: adamw, lr: 0.0001}}\n"
                         f"device: {{memory: 16GiB, threads: {t}}}\n")
            cases.append((f"{name}, batch {batch} x 256",
                          ["build/bench_step_time", cfg, "--steps", "2", "--warmup", "1"],
                          [PY, "scripts/bench_hf_gpt_step.py", "--layers", str(layers),
                           "--heads", str(heads), "--width", str(width), "--batch", str(batch),
                           "--seq", "256", "--threads", str(t), "--steps", "2", "--warmup",
                           "1"]))
    if args.bf16:
        return bf16_arms(args, cases, peer_env)
    rows = []
    setup = None
    for label, ours_cmd, peer_cmd in cases:
        ours, peer = [], []
        for rep in range(args.reps):
            l0 = load()
            o, _ = run_json(ours_cmd, "json ")
            l1 = load()
            p, err = run_json(peer_cmd, env=peer_env)
            l2 = load()
            setup = setup or p.get("peer")
            ours.append(o[0]["mean_s"])
            peer.append(p["mean_s"])
            print(f"{label} rep {rep + 1}: ferry {ours[-1]:.3f} s (load {l0} -> {l1}), "
                  f"peer {peer[-1]:.3f} s (load {l1} -> {l2})", flush=True)
        rows.append((label, statistics.median(ours), statistics.median(peer), ours, peer))
    if setup:
        print(f"peer: torch {setup['torch']} ({setup['torch_threads']} threads), BLAS "
              f"{setup['blas']}, {setup['blas_threading']} threading, {setup['blas_threads']} "
              f"threads")
    print(f"\n| model | ferry s | peer s | ferry / peer | runs (ferry; peer) |\n|---|---|---|---|---|")
    for label, o, p, ours, peer in rows:
        print(f"| {label} | {o:.3f} | {p:.3f} | {o / p:.3f} | "
              f"{', '.join(f'{x:.3f}' for x in ours)}; {', '.join(f'{x:.3f}' for x in peer)} |")


def bf16_arms(args, cases, peer_env):
    """Issue 28's CPU step: per case, ferry fp32, ferry bf16 (device.precision=bf16) and the peer
    under torch.autocast("cpu", dtype=torch.bfloat16), interleaved rep by rep."""
    wanted = ("resnet18_cifar, batch 64", "gpt 6 x 384, batch 8 x 256")
    rows, setup = [], None
    for label, ours_cmd, peer_cmd in (c for c in cases if c[0] in wanted):
        fp32, bf16, peer = [], [], []
        for rep in range(args.reps):
            l0 = load()
            o, _ = run_json(ours_cmd, "json ")
            l1 = load()
            b, _ = run_json(ours_cmd[:2] + ["device.precision=bf16"] + ours_cmd[2:], "json ")
            l2 = load()
            p, _ = run_json(peer_cmd + ["--autocast"], env=peer_env)
            l3 = load()
            setup = setup or p.get("peer")
            fp32.append(o[0]["mean_s"])
            bf16.append(b[0]["mean_s"])
            peer.append(p["mean_s"])
            print(f"{label} rep {rep + 1}: ferry fp32 {fp32[-1]:.3f} s (load {l0} -> {l1}), "
                  f"ferry bf16 {bf16[-1]:.3f} s (-> {l2}), autocast bf16 {peer[-1]:.3f} s "
                  f"(-> {l3})", flush=True)
        rows.append((label, [statistics.median(x) for x in (fp32, bf16, peer)]))
    if setup:
        print(f"peer: torch {setup['torch']} ({setup['torch_threads']} threads), BLAS "
              f"{setup['blas']}, {setup['blas_threading']} threading, {setup['blas_threads']} "
              f"threads, autocast bf16")
    print("\n| model | ferry fp32 s | ferry bf16 s | autocast bf16 s | bf16 / fp32 | "
          "ferry bf16 / autocast |\n|---|---|---|---|---|---|")
    for label, (f, b, p) in rows:
        print(f"| {label} | {f:.3f} | {b:.3f} | {p:.3f} | {b / f:.3f} | {b / p:.3f} |")


if __name__ == "__main__":
    sys.exit(main())
