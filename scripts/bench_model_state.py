#!/usr/bin/python3
"""Issue 30's model-state benchmarks (print, never assert; docs/benchmarks.md):

(a) the largest model that fits, by `trainer plan --ranks 8`: GPT-2 124M, 355M, 774M, 1.5B and
    GPT-3's 2.7B and 6.7B shapes (gpt2 with model.layers/heads/width), sequence 1024, batch 4
    per GPU, AdamW, fp32, memory.policy auto with recompute, on 8 GPUs of 16, 24 and 80 GiB, for
    zero 0, zero 1, zero 2 and zero 2 with the optimizer on the host; beside DeepSpeed's formula
    for the same settings (model state only, mixed precision: ZeRO, arXiv 1910.02054, Section 5).
(b) simulated throughput of the largest model of each setting on a DGX-1-like node (8 V100
    16 GiB, v100-pcie3) and on 8 H100 80 GiB (two h100-snc4 nodes of 4, h100-pcie5): tokens/s
    under fifo and topology, and the zero 2 + host plan against zero 2 with the optimizer on
    the device where that fits.

Usage: scripts/bench_model_state.py [--trainer build/trainer] [--only plan|simulate]
(--only simulate reuses (a)'s answer from build/bench-runs/model_state_largest.json when there)
"""
import argparse
import json
import os
import subprocess

CONFIG = "configs/simulate/gpt2-medium-dgx1.yaml"
MODELS = [  # (label, overrides)
    ("gpt2 124M", ["model.name=gpt2"]),
    ("gpt2-medium 355M", ["model.name=gpt2-medium"]),
    ("gpt2-large 774M", ["model.name=gpt2", "model.layers=36", "model.heads=20",
                         "model.width=1280"]),
    ("gpt2-xl 1.5B", ["model.name=gpt2", "model.layers=48", "model.heads=25",
                      "model.width=1600"]),
    ("GPT-3 2.7B", ["model.name=gpt2", "model.layers=32", "model.heads=32", "model.width=2560"]),
    ("GPT-3 6.7B", ["model.name=gpt2", "model.layers=32", "model.heads=32", "model.width=4096"]),
]
# GPU memory -> (hardware profile, topology, nodes, host memory per rank). Host memory: a DGX-1
# has 512 GiB for 8 GPUs, a DGX H100 2 TiB for 8; the 24 GiB GPU is taken with the A100's
# rates and a DGX-1's host.
GPUS = {
    "16GiB": ("v100-pcie3", "configs/topologies/dgx1-like.yaml", 1, "64GiB"),
    "24GiB": ("a100-pcie4", "configs/topologies/dgx1-like.yaml", 1, "64GiB"),
    "80GiB": ("h100-pcie5", "configs/topologies/h100-snc4.yaml", 2, "256GiB"),
}
SETTINGS = [  # (label, zero, optimizer)
    ("none (zero 0)", "0", "device"),
    ("zero 1", "1", "device"),
    ("zero 2", "2", "device"),
    ("zero 2 + host optimizer", "2", "host"),
]
COMMON = ["data.batch_size=4", "data.seq_len=1024", "optim.name=adamw", "memory.policy=auto",
          "memory.recompute=true", "model.attention=fused"]


def overrides(memory, model):
    hw, topo, _, host = GPUS[memory]
    return [*COMMON, *model, f"memory.budget={memory}", f"device.memory={memory}",
            f"memory.host_limit={host}", f"topology.file={topo}"]


def plan(trainer, memory, model):
    hw = GPUS[memory][0]
    cmd = [trainer, "plan", CONFIG, "--hardware", hw, "--ranks", "8", "--json",
           *overrides(memory, model)]
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        return None, (out.stderr.strip().splitlines() or ["failed"])[0]
    return json.loads(out.stdout), ""


def simulate(trainer, memory, model, zero, where, scheduler, planning=None):
    hw, _, nodes, _ = GPUS[memory]
    extra = ["--planning", planning] if planning else []
    cmd = [trainer, "simulate", CONFIG, "--hardware", hw, "--scheduler", scheduler, *extra, "--json",
           "--nodes", str(nodes), *overrides(memory, model), f"memory.zero={zero}",
           f"memory.optimizer={where}"]
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        return None, (out.stderr.strip().splitlines() or ["failed"])[0]
    return json.loads(out.stdout), ""


def option(state, zero, where):
    for o in state["options"]:
        if o["zero"] == zero and o["optimizer"] == where:
            return o
    return None


def deepspeed_params(memory_gib, zero, where, n=8):
    """DeepSpeed's model-state bytes per parameter on one GPU (ZeRO Section 5, mixed-precision
    Adam, K = 12): none 16, P_os 4 + 12/N, P_os+g 2 + 14/N; ZeRO-Offload (2101.06840) keeps the
    fp16 parameters on the GPU, 2. The largest parameter count the model state alone lets fit."""
    per = {("0", "device"): 16, ("1", "device"): 4 + 12 / n, ("2", "device"): 2 + 14 / n,
           ("2", "host"): 2}[(zero, where)]
    return memory_gib * 2**30 / per / 1e9


def bench_plan(trainer):
    print("### (a) Largest model that fits: trainer plan --ranks 8, sequence 1024, batch 4 per GPU,"
          " AdamW, fp32, memory.policy auto with recompute")
    print(f"load before: {open('/proc/loadavg').read().split()[:3]}")
    print()
    fits = {}  # (memory, setting) -> [(label, params, device bytes, peak)]
    params = {}
    for memory in GPUS:
        for label, model in MODELS:
            j, err = plan(trainer, memory, model)
            if not j:
                print(f"  {label} at {memory}: plan failed: {err}", flush=True)
                continue
            state = j["model_state"]
            params[label] = state["weights_bytes"] / 4 / 1e6  # zero 0's: the whole block
            for s_label, zero, where in SETTINGS:
                o = option(state, zero, where)
                if o and o["fits"]:
                    fits.setdefault((memory, s_label), []).append((label, o))
            print(f"  planned {label} at {memory}", flush=True)
    print()
    print("| GPU memory | setting | largest that fits | its model state per GPU (device / host) | "
          "DeepSpeed's formula (model state only) |")
    print("|---|---|---|---|---|")
    largest = {}
    for memory in GPUS:
        for s_label, zero, where in SETTINGS:
            got = fits.get((memory, s_label), [])
            ds = deepspeed_params(int(memory[:-3]), zero, where)
            if got:
                label, o = got[-1]
                largest[(memory, s_label)] = label
                cell = (f"{label} ({params.get(label, 0):.0f}M)",
                        f"{o['device_bytes'] / 2**30:.2f} / {o['host_bytes'] / 2**30:.2f} GiB")
            else:
                cell = ("none of the six", "-")
            print(f"| {memory} | {s_label} | {cell[0]} | {cell[1]} | {ds:.2f}B parameters |")
    return largest


def bench_simulate(trainer, largest):
    print()
    print("### (b) Simulated throughput of each setting's largest model: tokens/s of the 8 GPUs")
    print(f"load before: {open('/proc/loadavg').read().split()[:3]}")
    print()
    print("| node | setting | model | fifo tokens/s | topology, fifo's plan | topology, aware plan | "
          "topology/fifo (same plan; aware) | optimizer on the device (topology, aware) | "
          "moved per GPU and step (topology, aware) |")
    print("|---|---|---|---|---|---|---|---|---|")
    nodes = {"16GiB": "DGX-1-like, 8 V100 16 GiB", "80GiB": "2 x h100-snc4, 8 H100 80 GiB"}
    for memory, node in nodes.items():
        for s_label, zero, where in SETTINGS:
            label = largest.get((memory, s_label))
            if not label:
                print(f"| {node} | {s_label} | none fits | - | - | - | - | - | - |")
                continue
            model = dict(MODELS)[label]
            res = {}
            for sched in ("fifo", "topology"):
                res[sched] = simulate(trainer, memory, model, zero, where, sched)
            # The arbitration alone: topology with the plan fifo's oblivious auto makes.
            res["same"] = simulate(trainer, memory, model, zero, where, "topology", "oblivious")
            f, t, same = res["fifo"][0], res["topology"][0], res["same"][0]

            def tps(j):
                return j["samples_per_s"] * 1024 if j else 0

            device = "-"
            if where == "host":
                d, err = simulate(trainer, memory, model, zero, "device", "topology")
                device = f"{tps(d):.0f}" if d else "does not fit"
            ms = (t or {}).get("model_state", {})
            moved = "-"
            if t:
                rs = ms.get("reduce_scatter_bytes", 0) + ms.get("all_gather_bytes", 0)
                moved = (f"collectives {(t['allreduce_bytes'] + rs) / 2**30:.2f} GiB, host copies "
                         f"{(ms.get('to_host_bytes', 0) + ms.get('to_device_bytes', 0)) / 2**30:.2f}"
                         f" GiB, activations {2 * t['offload_bytes'] / 2**30:.2f} GiB")
            ratio = f"{tps(same) / tps(f):.3f}; {tps(t) / tps(f):.3f}" if f and t and same else "-"
            err = res["fifo"][1] or res["topology"][1] or res["same"][1]
            print(f"| {node} | {s_label} | {label} | {tps(f):.0f} | {tps(same):.0f} | {tps(t):.0f} | "
                  f"{ratio} | {device} | {moved if not err else err[:60]} |", flush=True)
    print(f"load after: {open('/proc/loadavg').read().split()[:3]}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--trainer", default="build/trainer")
    ap.add_argument("--only", choices=["plan", "simulate"])
    a = ap.parse_args()
    os.chdir(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    # (a)'s answer, kept for a later --only simulate.
    saved = "build/bench-runs/model_state_largest.json"
    if a.only == "simulate" and os.path.exists(saved):
        largest = {tuple(k.split("|")): v for k, v in json.load(open(saved)).items()}
    else:
        largest = bench_plan(a.trainer)
        os.makedirs(os.path.dirname(saved), exist_ok=True)
        json.dump({"|".join(k): v for k, v in largest.items()}, open(saved, "w"))
    if a.only != "plan":
        bench_simulate(a.trainer, largest)


if __name__ == "__main__":
    main()
