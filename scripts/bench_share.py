#!/usr/bin/python3
"""TENSILE's grid on this machine (issue 19): memory saved against extra step time, for
vgg16_cifar and resnet50_cifar (32x32 inputs) on the CPU backend. One job at batch 16: none
(unconstrained), auto within the budget that saves TENSILE's share, vdnn-all. Then 2 and 3
concurrent jobs at batch 2: each none (unconstrained), each vdnn-all, and memory.share on one
device of the capacity that saves TENSILE's three-job share of the summed need. Prints a markdown
table beside TENSILE's published figures; never asserts (goal: at TENSILE's memory saved, at most
half its extra time).

Memory saved is given two ways: of the whole device peak (weights, gradients and optimizer state
included, which no policy can move), and of the activation arena (the peak less that persistent
state), which is what offloading and recomputing act on. Concurrent jobs' peaks are summed, as
TENSILE sums them; jobs sharing one device count its capacity, which the sum of what they hold
never exceeds. When auto cannot meet TENSILE's saving (the largest layer's working set), the
budget is the smallest it meets. Extra time is each job's measured step over its unconstrained
step in the same setting (alone, or beside as many concurrent unconstrained jobs), minus 1,
averaged over jobs; a job's step is its fastest logging interval after the first (other work on
the machine only ever slows an interval down); arms alternate (A B C A B C) and the median over
repetitions is printed, with the load averages seen.

Usage: scripts/bench_share.py [--trainer build/trainer] [--steps 6] [--reps 2]
                              [--models vgg16_cifar,resnet50_cifar] [--jobs 2,3]
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys

# TENSILE's logs (zkx741481546/tinyflow), as quoted in issue 19: (memory saved, extra time).
TENSILE_ONE = {"vgg16_cifar": (0.35, 0.13), "resnet50_cifar": (0.72, 0.55)}  # batch 16
TENSILE_THREE = {"vgg16_cifar": (0.27, 0.18), "resnet50_cifar": (0.41, 0.44)}  # batch 2
TENSILE_VDNN = (0.28, 0.85)
CONFIG = "configs/quickstart.yaml"
OUT = "build/bench-runs/share"


def common(model, batch, steps):
    return [f"model.name={model}", f"data.batch_size={batch}", f"run.steps={steps}",
            "run.log_every=2", "checkpoint.every=0", "memory.measure=false"]


def plan(trainer, model, batch, policy, budget=0):
    r = subprocess.run([trainer, "plan", CONFIG, *common(model, batch, 1), "device.memory=16GiB",
                        f"memory.budget={budget or '16GiB'}", "--policy", policy, "--json"],
                       capture_output=True, text=True, check=True)
    return json.loads(r.stdout)["policies"][0]


def plan_none(trainer, model, batch):
    """(peak, persistent, lower bound) bytes of the unconstrained plan."""
    p = plan(trainer, model, batch, "none")
    persistent = sum(p[k] for k in ("weights_bytes", "gradients_bytes", "optimizer_bytes",
                                    "buffers_bytes"))
    return p["peak_bytes"], persistent, p["lower_bound_bytes"]


def fit_budget(trainer, model, batch, target, lower, peak):
    """The smallest budget auto meets among `target` and 64 steps from the lower bound up."""
    for b in sorted({target} | {lower + k * (peak - lower) // 64 for k in range(65)}):
        if b >= target and plan(trainer, model, batch, "auto", b)["fits"]:
            return b
    return peak


def train(trainer, dirs, overrides_per_job, env=None):
    """Runs the jobs concurrently; returns per job (measured step s, device peak bytes)."""
    procs = []
    for d, overrides in zip(dirs, overrides_per_job):
        shutil.rmtree(d, ignore_errors=True)
        os.makedirs(os.path.dirname(d), exist_ok=True)
        log = open(d + ".log", "w")
        procs.append(subprocess.Popen([trainer, "train", CONFIG, *overrides, f"run.dir={d}"],
                                      stdout=log, stderr=subprocess.STDOUT, env=env))
    out = []
    for d, p in zip(dirs, procs):
        if p.wait() != 0:
            sys.exit(f"bench_share: {d} failed (see {d}.log)")
        s = json.load(open(os.path.join(d, "summary.json")))
        # The fastest logging interval after the first (which pays for first touches): other
        # jobs on the machine slow some intervals down, none speeds one up.
        lines = [json.loads(l) for l in open(os.path.join(d, "metrics.jsonl"))][1:]
        step = min(s["batch"] / l["samples_per_s"] for l in lines) if lines else \
            s["measured_step_s"]
        out.append((step, s["device_peak_bytes"]))
    return out


def saved(peak, none, persistent):
    """Memory saved of the whole peak and of the arena (the peak less persistent state)."""
    return 1 - peak / none, 1 - (peak - persistent) / (none - persistent)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--trainer", default="build/trainer")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--models", default="vgg16_cifar,resnet50_cifar")
    ap.add_argument("--jobs", default="2,3")
    a = ap.parse_args()
    threads = os.cpu_count()
    rows = []
    for model in a.models.split(","):
        # One job at batch 16.
        none_peak, persistent, lower = plan_none(a.trainer, model, 16)
        msr, eor = TENSILE_ONE[model]
        # TENSILE's share of the arena saved, or as near as auto's smallest budget allows.
        budget = fit_budget(a.trainer, model, 16,
                            persistent + int((1 - msr) * (none_peak - persistent)), lower,
                            none_peak)
        arms = {"none": ["memory.policy=none"],
                "auto": ["memory.policy=auto", f"memory.budget={budget}"],
                "vdnn-all": ["memory.policy=vdnn-all"]}
        runs = {arm: [] for arm in arms}
        for rep in range(a.reps):
            for arm, extra in arms.items():
                load = os.getloadavg()[0]
                d = f"{OUT}/{model}_1_{arm}_{rep}"
                (step, peak), = train(a.trainer, [d], [common(model, 16, a.steps) + extra + [
                    "device.memory=16GiB", f"device.threads={threads}"]])
                runs[arm].append((step, peak, load))
        base = statistics.median(s for s, _, _ in runs["none"])
        base_peak = max(p for _, p, _ in runs["none"])
        for arm in ("auto", "vdnn-all"):
            step = statistics.median(s for s, _, _ in runs[arm])
            whole, arena = saved(max(p for _, p, _ in runs[arm]), base_peak, persistent)
            rows.append((model, 1, 16, arm if arm != "auto" else f"auto, budget {budget / 2**20:.1f} MiB",
                         whole, arena, step / base - 1, (msr, eor),
                         [l for _, _, l in runs[arm] + runs["none"]]))
        # Concurrent jobs at batch 2.
        none_peak, persistent, lower = plan_none(a.trainer, model, 2)
        msr, eor = TENSILE_THREE[model]
        ledger = f"/ferry-jobs-bench-share-{os.getpid()}"  # the jobs' own (FERRY_JOB_LEDGER)
        each = fit_budget(a.trainer, model, 2,
                          persistent + int((1 - msr) * (none_peak - persistent)), lower, none_peak)
        for n in [int(x) for x in a.jobs.split(",")]:
            capacity = n * each
            env = dict(os.environ, FERRY_JOB_LEDGER=ledger)
            arms = {"none": ["memory.policy=none", "device.memory=16GiB"],
                    "vdnn-all": ["memory.policy=vdnn-all", "device.memory=16GiB"],
                    "share": ["memory.policy=auto", "memory.share=true",
                              f"device.memory={capacity}", "memory.share_wait=600"]}
            runs = {arm: [] for arm in arms}
            for rep in range(a.reps):
                for arm, extra in arms.items():
                    load = os.getloadavg()[0]
                    dirs = [f"{OUT}/{model}_{n}_{arm}_{rep}/job{k}" for k in range(n)]
                    jobs = [common(model, 2, a.steps) + extra + [f"run.seed={k}", "device.threads=1"]
                            for k in range(n)]
                    runs[arm].append((train(a.trainer, dirs, jobs, env), load))
            def per_job(arm):
                # Median over repetitions of each job's step; each job's largest peak.
                return ([statistics.median(r[k][0] for r, _ in runs[arm]) for k in range(n)],
                        [max(r[k][1] for r, _ in runs[arm]) for k in range(n)])
            base_steps, base_peaks = per_job("none")
            for arm in ("share", "vdnn-all"):
                steps, peaks = per_job(arm)
                # Jobs sharing the device never hold more than its capacity together (the job
                # ledger's record), while one that starts alone peaks at its alone share first.
                whole, arena = saved(capacity if arm == "share" else sum(peaks), sum(base_peaks),
                                     n * persistent)
                extra_time = statistics.mean(s / b for s, b in zip(steps, base_steps)) - 1
                label = f"memory.share, {capacity / 2**20:.1f} MiB" if arm == "share" else arm
                rows.append((model, n, 2, label, whole, arena, extra_time, (msr, eor),
                             [l for _, l in runs[arm] + runs["none"]]))
        if os.path.exists("/dev/shm" + ledger):
            os.remove("/dev/shm" + ledger)  # every job has left it
    print("| model | jobs | batch | ferry | saved (whole peak) | saved (arena) | extra time | "
          "TENSILE saved / extra | TENSILE's vDNN | goal: extra <= TENSILE's / 2 at its saved | "
          "load |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for model, n, batch, arm, whole, arena, extra, (msr, eor), loads in rows:
        goal = ("met" if arena >= msr - 1e-3 and extra <= eor / 2 else "not met") \
            if arm.startswith(("auto", "memory.share")) else "-"
        print(f"| {model} | {n} | {batch} | {arm} | {whole:.3f} | {arena:.3f} | {extra:+.3f} | "
              f"{msr:.2f} / {eor:.2f}{' (3 jobs)' if n > 1 else ''} | {TENSILE_VDNN[0]:.2f} / "
              f"{TENSILE_VDNN[1]:.2f} | {goal} | {min(loads):.1f}-{max(loads):.1f} |")


if __name__ == "__main__":
    main()
