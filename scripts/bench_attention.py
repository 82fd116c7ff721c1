#!/usr/bin/env python3
"""Fused against naive attention in ferry (issue 29's benchmark; prints, never asserts): a GPT of
6 layers, width 384, 6 heads (vocabulary 50257, AdamW), on the CPU backend at sequence 256, 1024
and 2048 (batch 8, 2, 1: 2048 tokens a step), `memory.policy: none`. Per sequence and core: the
mean step time (median over interleaved repeats) and the measured device peak, with the machine
load before and after each run.

Usage: python3 scripts/bench_attention.py [--threads 2] [--reps 2] [--steps 2] [--warmup 1]
       [--seqs 256,1024,2048]
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


def load():
    with open("/proc/loadavg") as f:
        return f.read().split()[0]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--seqs", default="256,1024,2048")
    ap.add_argument("--out", default="/tmp/ferry_bench_attention")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    tokens = os.path.join(args.out, "tokens.bin")
    count = 1 << 16
    rng = random.Random(0)
    with open(tokens, "wb") as f:  # llm.c's format (scripts/prepare_tokens.py)
        f.write(struct.pack("<256i", 20240520, 1, count, *([0] * 253)))
        f.write(struct.pack(f"<{count}H", *(rng.randrange(50257) for _ in range(count))))
    rows = []
    for seq in (int(s) for s in args.seqs.split(",")):
        batch = max(1, 2048 // seq)
        results = {"fused": [], "naive": []}
        peaks = {}
        for rep in range(args.reps):
            for core in ("fused", "naive"):
                cfg = os.path.join(args.out, f"gpt_{seq}_{core}.yaml")
                with open(cfg, "w") as f:
                    f.write(f"run: {{dir: {args.out}/run_{seq}_{core}}}\n"
                            f"model: {{name: gpt2, layers: 6, heads: 6, width: 384, "
                            f"context: 2048, attention: {core}}}\n"
                            f"data: {{source: tokens, path: {tokens}, batch_size: {batch}, "
                            f"seq_len: {seq}, mean: [], std: []}}\n"
                            f"optim: {{name: adamw, lr: 0.0001}}\n"
                            f"device: {{memory: 16GiB, threads: {args.threads}}}\n")
                l0 = load()
                out = subprocess.run([os.path.join(ROOT, "build/bench_step_time"), cfg, "--steps",
                                      str(args.steps), "--warmup", str(args.warmup)],
                                     check=True, capture_output=True, text=True).stdout
                l1 = load()
                r = json.loads([ln for ln in out.splitlines() if ln.startswith("json ")][0][5:])[0]
                results[core].append(r["mean_s"])
                peaks[core] = r["peak_bytes"]
                print(f"T={seq} b{batch} {core} rep {rep + 1}: {r['mean_s']:.3f} s/step, peak "
                      f"{r['peak_bytes'] / 2**20:.1f} MiB (load {l0} -> {l1})", flush=True)
        rows.append((seq, batch, results, peaks))
    print("\n| sequence x batch | fused s/step | naive s/step | fused / naive | fused peak | "
          "naive peak | peak ratio |\n|---|---|---|---|---|---|---|")
    for seq, batch, results, peaks in rows:
        f, n = statistics.median(results["fused"]), statistics.median(results["naive"])
        print(f"| {seq} x {batch} | {f:.3f} | {n:.3f} | {f / n:.2f} | "
              f"{peaks['fused'] / 2**20:.0f} MiB | {peaks['naive'] / 2**20:.0f} MiB | "
              f"{peaks['fused'] / peaks['naive']:.2f} |")
    print(f"load now {load()}")


if __name__ == "__main__":
    sys.exit(main())
