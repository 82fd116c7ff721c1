#!/usr/bin/python3
"""Issue 28's simulate table: fp32 (TF32 convolutions) against bf16 (device.precision) on one
GPU of the h100-pcie5 and a100-pcie4 profiles (one GPU of the H100 SNC4 node's topology, so no
all-reduce): samples/s of VGG-16 and ResNet-50 (batch 256) and gpt2 (8 x 1024 tokens) under
memory.budget 12 and 24 GiB with `auto`, and the bytes each step moves over PCIe (offloads and
prefetches) and the FLOPs recompute adds instead. Prints a markdown table; never asserts.

Usage: scripts/bench_precision_simulate.py [--trainer build/trainer]
"""
import argparse
import json
import subprocess

MODELS = [  # (label, config, overrides)
    ("VGG-16 b256", "configs/simulate/vgg16-dgx1.yaml", []),
    ("ResNet-50 b256", "configs/simulate/resnet50-dgx1.yaml", []),
    ("gpt2 8x1024", "configs/simulate/gpt2-medium-dgx1.yaml", ["model.name=gpt2"]),
]
PROFILES = ["h100-pcie5", "a100-pcie4"]
BUDGETS = ["12GiB", "24GiB"]


def simulate(trainer, config, overrides, hardware, precision, budget):
    cmd = [trainer, "simulate", config, "--topology", "configs/topologies/h100-snc4.yaml",
           "--gpus", "1", "--hardware", hardware, "--json", "memory.policy=auto",
           "device.memory=80GiB", f"memory.budget={budget}", f"device.precision={precision}",
           *overrides]
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        return None, out.stderr.strip().splitlines()[0] if out.stderr else "failed"
    return json.loads(out.stdout), ""


def gib(b):
    return f"{b / 2**30:.2f} GiB"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--trainer", default="build/trainer")
    a = ap.parse_args()
    print("| model | profile | budget | fp32 samples/s | bf16 samples/s | bf16/fp32 | "
          "fp32 moved / recomputed per step | bf16 moved / recomputed per step |")
    print("|---|---|---|---|---|---|---|---|")
    for label, config, overrides in MODELS:
        for hw in PROFILES:
            for budget in BUDGETS:
                cells = {}
                for p in ("fp32", "bf16"):
                    j, err = simulate(a.trainer, config, overrides, hw, p, budget)
                    cells[p] = (j, err)
                f, b = cells["fp32"][0], cells["bf16"][0]
                def rate(j, err):
                    return f"{j['samples_per_s']:.1f}" if j else f"does not fit ({err[:40]})"
                def moved(j):
                    if not j:
                        return "-"
                    return f"{gib(2 * j['offload_bytes'])} / {j['recompute_flops'] / 1e9:.0f} GF"
                ratio = f"{b['samples_per_s'] / f['samples_per_s']:.2f}" if f and b else "-"
                print(f"| {label} | {hw} | {budget} | {rate(*cells['fp32'])} | "
                      f"{rate(*cells['bf16'])} | {ratio} | {moved(f)} | {moved(b)} |", flush=True)


if __name__ == "__main__":
    main()
