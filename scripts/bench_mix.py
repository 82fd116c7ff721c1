#!/usr/bin/python3
"""A job mix on one emulated device (issue 19), real, on the CPU backend: four jobs of different
models arriving 10 s apart (resnet18_cifar batch 32, a small GPT at 256 tokens batch 32,
vgg11_cifar batch 32, alexnet_cifar batch 64), on one device whose capacity cannot hold them all
unconstrained. Three arms, interleaved over repetitions:

  share       every job memory.share on one device of the capacity (a private job ledger)
  static      every job alone on a device of capacity / 4 (memory.budget = capacity / 4, no
              sharing); a job whose lower bound exceeds that cannot run: it is named, left out,
              and a fourth arm (share over the jobs static can run) makes the comparison fair
  sequential  one job after another in arrival order, each alone on the whole capacity

Every job plans with memory.policy auto and the FLOP cost model, its copies paced at
device.copy_gbps 0.2 (a GPU's link next to this CPU's compute), on one thread in every arm: on
this shared 2-core machine oneDNN on 2 threads ran a job alone slower than on one (a GPT step
1.9-2.0 s against 0.8 s), so a job alone does not get "the whole device" here; on an idle 2-core
machine the concurrent arms would have twice the cores of the sequential one. The capacity is
4 x the largest lower bound (the smallest capacity at which the static split runs every job),
less than the jobs' peaks together.

Prints each job's completion time (arrival to exit, admission and planning included) and the
mix's throughput (all samples over the first arrival to the last exit) per arm, medians over the
repetitions, with the load averages; goal (printed, never asserted): share >= 1.2x the static
split's throughput with no job slower than under it.

Usage: scripts/bench_mix.py [--trainer build/trainer] [--reps 2] [--capacity BYTES]
                            [--arrive-every 10] [--scale 1.0]
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

CONFIG = "configs/quickstart.yaml"
OUT = "build/bench-runs/mix"
TEXT = f"{OUT}/text"
# Bytes and the separator 256 that prepare_tokens.py writes before each file: vocabulary 257.
GPT = ["model.name=gpt2", "model.vocab=257", "model.context=256", "model.layers=4",
       "model.heads=4", "model.width=128", "data.source=tokens", f"data.path={TEXT}/train.bin",
       "data.mean=[]", "data.std=[]"]
# name, overrides, steps (at --scale 1: about 30-40 s each alone on one core of this machine)
JOBS = [("resnet18", ["model.name=resnet18_cifar", "data.batch_size=32"], 30),
        ("gpt", GPT + ["data.batch_size=32"], 45),
        ("vgg11", ["model.name=vgg11_cifar", "data.batch_size=32"], 100),
        ("alexnet", ["model.name=alexnet_cifar", "data.batch_size=64"], 200)]
COMMON = ["memory.policy=auto", "memory.measure=false", "device.copy_gbps=0.2",
          "checkpoint.every=0", "run.log_every=5"]


def batch_of(overrides):
    return int(next(o for o in overrides if o.startswith("data.batch_size=")).split("=")[1])


def plan(trainer, overrides, policy, budget):
    r = subprocess.run([trainer, "plan", CONFIG, *COMMON, *overrides, "device.memory=16GiB",
                        f"memory.budget={budget}", "--policy", policy, "--json"],
                       capture_output=True, text=True, check=True)
    return json.loads(r.stdout)["policies"][0]


def lower_and_peak(trainer, overrides):
    """The smallest budget auto meets (bisection to 1/256 of the span, as memory.share's
    curve), and the unconstrained peak."""
    none = plan(trainer, overrides, "none", "16GiB")
    peak = none["peak_bytes"]
    bad, good = min(none["lower_bound_bytes"], peak) - 1, peak
    while good - bad > max(1, (peak - bad) // 256):
        mid = (bad + good) // 2
        if plan(trainer, overrides, "auto", mid)["fits"]:
            good = mid
        else:
            bad = mid
    return good, peak


def launch(trainer, name, overrides, steps, arm, rep, extra, env):
    d = f"{OUT}/{arm}_{rep}/{name}"
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(os.path.dirname(d), exist_ok=True)
    log = open(d + ".log", "w")
    return subprocess.Popen([trainer, "train", CONFIG, *COMMON, *overrides, *extra,
                             f"run.steps={steps}", f"run.dir={d}"],
                            stdout=log, stderr=subprocess.STDOUT, env=env), d


def budgets(d):
    """The budgets a job's logged steps ran within (memory.share), in order, without repeats."""
    out = []
    for line in open(os.path.join(d, "metrics.jsonl")):
        b = json.loads(line).get("budget")
        if b is not None and (not out or out[-1] != b):
            out.append(b)
    return out


def run_arm(trainer, arm, rep, jobs, capacity, arrive_every):
    """Runs the jobs of one arm; returns {name: (completion s, exit s)} and the makespan."""
    ledger = f"/ferry-jobs-bench-mix-{os.getpid()}"
    env = dict(os.environ, FERRY_JOB_LEDGER=ledger)
    n_all = len(JOBS)
    if arm.startswith("share"):
        extra = ["memory.share=true", f"device.memory={capacity}", "memory.share_wait=600",
                 "device.threads=1"]
    elif arm == "static":
        extra = [f"device.memory={capacity // n_all}", "device.threads=1"]
    else:
        extra = [f"device.memory={capacity}", "device.threads=1"]
    start = time.monotonic()
    arrival = {name: k * arrive_every for k, (name, _, _) in enumerate(JOBS)}
    result, running, pending = {}, {}, [j for j in jobs]
    while pending or running:
        now = time.monotonic() - start
        for name, (p, d) in list(running.items()):
            if p.poll() is not None:
                if p.returncode != 0:
                    sys.exit(f"bench_mix: {d} failed (see {d}.log)")
                t = time.monotonic() - start
                result[name] = (t - arrival[name], t, d)
                del running[name]
        while pending and arrival[pending[0][0]] <= now and (arm != "sequential" or not running):
            name, overrides, steps = pending.pop(0)
            running[name] = launch(trainer, name, overrides, steps, arm, rep, extra, env)
        time.sleep(0.05)
    if os.path.exists("/dev/shm" + ledger):
        os.remove("/dev/shm" + ledger)  # every job has left it
    makespan = max(t for _, t, _ in result.values())
    return result, makespan


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--trainer", default="build/trainer")
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--capacity", type=int, default=0, help="bytes; 0 = 4 x the largest lower bound")
    ap.add_argument("--arrive-every", type=float, default=10.0)
    ap.add_argument("--scale", type=float, default=1.0, help="multiplies every job's steps")
    a = ap.parse_args()
    if not os.path.exists(f"{TEXT}/train.bin"):
        subprocess.run(["/usr/bin/python3", "scripts/prepare_tokens.py", "--tokenizer", "bytes",
                        "--out", TEXT, "/usr/share/common-licenses/*"], check=True,
                       stdout=subprocess.DEVNULL)
    jobs = [(name, o, max(1, round(s * a.scale))) for name, o, s in JOBS]
    need = {name: lower_and_peak(a.trainer, o) for name, o, _ in jobs}
    capacity = a.capacity or len(jobs) * max(lo for lo, _ in need.values())
    capacity = (capacity + (1 << 20) - 1) >> 20 << 20 if not a.capacity else capacity
    equal = capacity // len(jobs)
    print(f"capacity {capacity / 2**20:.1f} MiB (the jobs' peaks together: "
          f"{sum(p for _, p in need.values()) / 2**20:.1f} MiB); static share {equal / 2**20:.1f} "
          f"MiB each; jobs arrive {a.arrive_every:g} s apart")
    for name, o, steps in jobs:
        lo, peak = need[name]
        print(f"  {name:9s} batch {batch_of(o):3d}, {steps:4d} steps: lower bound "
              f"{lo / 2**20:6.1f} MiB, peak {peak / 2**20:6.1f} MiB"
              f"{'' if lo <= equal else '  (cannot run under the static split)'}")
    static_jobs = [j for j in jobs if need[j[0]][0] <= equal]
    arms = ["share", "static", "sequential"]
    if len(static_jobs) < len(jobs):
        arms.append("share-static-jobs")
    runs = {arm: [] for arm in arms}
    loads = {arm: [] for arm in arms}
    for rep in range(a.reps):
        for arm in arms:
            loads[arm].append(os.getloadavg()[0])
            arm_jobs = static_jobs if arm in ("static", "share-static-jobs") else jobs
            runs[arm].append(run_arm(a.trainer, arm, rep, arm_jobs, capacity, a.arrive_every))
            loads[arm].append(os.getloadavg()[0])
    samples = {name: batch_of(o) * steps for name, o, steps in jobs}
    summary = {}
    print(f"\n| arm | makespan s | samples/s | " +
          " | ".join(f"{n} completion s" for n, _, _ in jobs) + " | load |")
    print("|---|---|---|" + "---|" * len(jobs) + "---|")
    for arm in arms:
        ran = [n for n, _, _ in (static_jobs if arm in ("static", "share-static-jobs") else jobs)]
        makespan = statistics.median(m for _, m in runs[arm])
        completion = {n: statistics.median(r[n][0] for r, _ in runs[arm]) for n in ran}
        tput = sum(samples[n] for n in ran) / makespan
        summary[arm] = (makespan, tput, completion)
        cells = [f"{completion[n]:.1f}" if n in completion else "cannot run" for n, _, _ in jobs]
        print(f"| {arm} | {makespan:.1f} | {tput:.1f} | " + " | ".join(cells) +
              f" | {min(loads[arm]):.1f}-{max(loads[arm]):.1f} |")
    print("\nbudgets under share (MiB, first rep, in the order run): " + "; ".join(
        f"{n}: " + ", ".join(f"{b / 2**20:.1f}" for b in budgets(runs['share'][0][0][n][2]))
        for n, _, _ in jobs))
    print("measured step s (median over reps): " + "; ".join(
        f"{arm}: " + ", ".join(
            f"{n} {statistics.median(json.load(open(os.path.join(r[n][2], 'summary.json')))['measured_step_s'] for r, _ in runs[arm]):.3f}"
            for n in summary[arm][2]) for arm in arms))
    share, fixed = summary["share"], summary["static"]
    fair = summary.get("share-static-jobs", share)
    ratio = fair[1] / fixed[1]
    slower = [n for n in fixed[2] if fair[2][n] > fixed[2][n]]
    print(f"\nshare / static throughput {share[1] / fixed[1]:.3f}x"
          + (f" (static ran {len(static_jobs)} of {len(jobs)} jobs; over those, share "
             f"{ratio:.3f}x)" if fair is not share else "")
          + "; completion time share / static: " + ", ".join(
              f"{n} {fair[2][n] / fixed[2][n]:.2f}x" for n in fixed[2]))
    print(f"goal (>= 1.2x the static split's throughput, no job slower than under it): "
          f"{'met' if ratio >= 1.2 and not slower else 'not met'}"
          + (f" ({', '.join(slower)} slower)" if slower else ""))
    seq = summary["sequential"]
    print(f"share / sequential throughput {share[1] / seq[1]:.3f}x; completion time share / "
          f"sequential: " + ", ".join(f"{n} {share[2][n] / seq[2][n]:.2f}x" for n in share[2]))


if __name__ == "__main__":
    main()
