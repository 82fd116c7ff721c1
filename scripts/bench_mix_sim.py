#!/usr/bin/python3
"""The job mix simulated on one H100 (issue 19): configs/simulate/mix-h100.yaml (ResNet-18,
GPT-2, VGG-11 and AlexNet at ImageNet sizes arriving two minutes apart, the twin of
scripts/bench_mix.py's CPU mix) under `trainer simulate --mix --hardware h100-pcie5`, with the
GPU's memory at 80 GiB (the mix file's) and smaller: per memory, the mix's throughput (all samples
over the first arrival to the last completion) and each job's completion time under memory.share,
the static equal split and one job after another. Where the static split cannot run a job, the
comparison is also made over the jobs it can run (share-static-jobs). Never asserts; goal
(printed): share >= 1.2x the static split's throughput with no job slower than under it.

Usage: scripts/bench_mix_sim.py [--trainer build/trainer] [--memory 80,64,56,48]
"""
import argparse
import json
import os
import re
import subprocess

MIX = "configs/simulate/mix-h100.yaml"
OUT = "build/bench-runs/mix-sim"


def simulate(trainer, memory_gib):
    os.makedirs(OUT, exist_ok=True)
    text = re.sub(r"^memory: .*$", f"memory: {memory_gib}GiB", open(MIX).read(), flags=re.M)
    path = f"{OUT}/mix-h100-{memory_gib}GiB.yaml"
    open(path, "w").write(text)
    r = subprocess.run([trainer, "simulate", "--mix", path, "--hardware", "h100-pcie5", "--json"],
                       capture_output=True, text=True, check=True)
    return json.loads(r.stdout)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--trainer", default="build/trainer")
    ap.add_argument("--memory", default="80,64,56,48", help="GiB, comma-separated")
    a = ap.parse_args()
    print("| GPU memory | static share | share samples/s | static samples/s (jobs run) | "
          "sequential samples/s | share / static | over static's jobs | completion share / "
          "static | share / sequential | completion share / sequential | goal |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for gib in [int(x) for x in a.memory.split(",")]:
        j = simulate(a.trainer, gib)
        names = [x["name"] for x in j["jobs"]]
        arms = {x["arm"]: x for x in j["arms"]}
        share, fixed, seq = arms["share"], arms["static"], arms["sequential"]
        fair = arms.get("share-static-jobs", share)
        ran = [k for k, o in enumerate(fixed["jobs"]) if o["ran"]]

        def completion(a, b, jobs):
            return ", ".join(f"{names[k]} {a['jobs'][k]['completion_s'] / b['jobs'][k]['completion_s']:.2f}x"
                             for k in jobs)
        ratio = fair["samples_per_s"] / fixed["samples_per_s"] if ran else 0
        slower = [names[k] for k in ran
                  if fair["jobs"][k]["completion_s"] > fixed["jobs"][k]["completion_s"] * (1 + 1e-9)]
        goal = "met" if ran and ratio >= 1.2 and not slower else "not met"
        print(f"| {gib} GiB | {gib / len(names):.0f} GiB | {share['samples_per_s']:.0f} | "
              f"{fixed['samples_per_s']:.0f} ({len(ran)} of {len(names)}"
              + ("" if len(ran) == len(names) else ": " + ", ".join(
                  n for k, n in enumerate(names) if k not in ran) + " cannot run") + ") | "
              f"{seq['samples_per_s']:.0f} | {share['samples_per_s'] / fixed['samples_per_s']:.3f}x | "
              f"{ratio:.3f}x | {completion(fair, fixed, ran)} | "
              f"{share['samples_per_s'] / seq['samples_per_s']:.3f}x | "
              f"{completion(share, seq, range(len(names)))} | {goal} |")


if __name__ == "__main__":
    main()
