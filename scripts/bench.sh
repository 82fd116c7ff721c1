#!/usr/bin/env bash
# Runs the benchmarks and prints their ratios (never asserted; see docs/benchmarks.md):
#   1. training step vs PyTorch (same architecture, same threads): resnet18_cifar, vgg11_cifar
#   2. the memory plan table (VGG-16, ResNet-50 on ImageNet) and auto's smallest budget
#   3. offload overhead on the CPU backend: vdnn-all / none step time, with a trace
#   4. MPI all-reduce bus bandwidth, and 2-rank step time with comm.overlap on / off
#   5. imagefolder loader images/s vs torchvision's DataLoader with PIL (2 workers each)
#   6. emulated DGX-1-like server, 4 ranks: topology / fifo link scheduler step time, and the
#      simulator's prediction of each (trainer simulate --emulated on the run's trace)
#   7. the same server under a memory budget: topology + contention-aware auto against fifo +
#      oblivious auto (recompute on for both), step time and what each plan moved
#   8. input shapes that change per step (issue 18), three arms each: a plan per shape, one
#      static plan (the largest shape's decisions for every shape: Mimose's baseline,
#      memory.per_shape false), none with unlimited memory. (a) real, CPU backend: multi-scale
#      resnet18_cifar (sides 24-48), the arms interleaved step by step; (b) simulated on
#      h100-pcie5: ResNet-50 (sides 160-288, batch 256) and gpt2 (document lengths, batch 16)
#      under 24 GiB and 12 GiB; (c) planning time per new shape (VGG-16, ResNet-50, gpt2) against
#      its predicted step
#   9. one job over 2 hosts made of namespaces (scripts/multihost.sh, TCP between them) against
#      the same 4 ranks on one host (shared memory): step time (needs root; skipped otherwise)
#  10. TENSILE's grid (issue 19): vgg16_cifar and resnet50_cifar, one job at batch 16 (auto at
#      TENSILE's memory saved, vdnn-all) and 2 and 3 concurrent jobs at batch 2 (memory.share on
#      one device, vdnn-all), memory saved against extra time (scripts/bench_share.py)
#  11. documents of changing length (data.documents, issue 18): a small GPT on this machine's
#      licence texts, one document per paragraph: a plan per padded length, one static plan
#      (memory.per_shape false, when built) and every batch padded to data.seq_len under the same
#      budget, none with unlimited memory; and padded against packed rows (data.pack) in real
#      tokens/s
#  12. a job mix on one device (issue 19): four models arriving 10 s apart, memory.share against a
#      static equal split and against one after another: (a) real, CPU backend
#      (scripts/bench_mix.py); (b) the same mix simulated on one H100 at ImageNet sizes at several
#      GPU memories (trainer simulate --mix configs/simulate/mix-h100.yaml; scripts/bench_mix_sim.py)
#  precision: fp32 against bf16 (issue 28): the plan table (bench_precision_plan) and simulated
#      samples/s on h100-pcie5 and a100-pcie4 (scripts/bench_precision_simulate.py)
#  zero: model state per rank (issue 30): the largest GPT that `trainer plan --ranks 8` fits on
#      8 GPUs of 16, 24 and 80 GiB under zero 0, 1, 2 and 2 + host optimizer, beside DeepSpeed's
#      formula; the simulated tokens/s of each setting's largest model on a DGX-1-like node and on
#      8 H100s, fifo against topology, the host optimizer against the device
#      (scripts/bench_model_state.py; planner and simulator only, about 10 minutes on 2 cores)
# Usage: scripts/bench.sh [all|pytorch|plan|precision|zero|offload|comm|imagefolder|topology|
#                          aware|shapes|hosts|share|documents|mix]
#        (default all)
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh >&2
what="${1:-all}"
threads="$(nproc)"
out=build/bench-runs
mkdir -p "$out"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

step_config() {  # model batch -> a config file for it
  local f="$out/$1_b$2.yaml"
  cat > "$f" <<YAML
run: {dir: $out/run_$1}
model: {name: $1}
data: {batch_size: $2, samples: 256}
device: {memory: 8GiB, threads: $threads}
YAML
  echo "$f"
}

# emulated_runs NAME CONFIG SCALE [key=value...]: 4 CPU ranks standing in for GPUs 0-3 of the
# DGX-1-like server, 6 steps, under fifo and topology, two alternating runs each, into
# $out/NAME_<scheduler>_<rep> (logs beside them).
emulated_runs() {
  local name=$1 cfg=$2 scale=$3
  shift 3
  for rep in 1 2; do
    for sched in fifo topology; do
      rm -rf "$out/${name}_${sched}_$rep"
      mpirun -np 4 --oversubscribe --bind-to none build/trainer train "$cfg" run.steps=6 \
        run.log_every=1 run.dir="$out/${name}_${sched}_$rep" device.threads=1 \
        topology.file=configs/topologies/dgx1-like.yaml topology.scheduler=$sched \
        topology.emulation_scale="$scale" "$@" > "$out/${name}_${sched}_$rep.log" 2>&1
    done
  done
}

if [[ $what == all || $what == pytorch ]]; then
  # The peer's OpenBLAS on this CPU's kernels, not its Prescott fallback (peer_setup.py).
  if [[ -z "${OPENBLAS_CORETYPE:-}" ]]; then
    coretype=$(cd scripts && /usr/bin/python3 -c 'from peer_setup import openblas_coretype as c; print(c() or "")')
    if [[ -n "$coretype" ]]; then export OPENBLAS_CORETYPE=$coretype; fi
  fi
  echo "== 1. training step vs PyTorch ($threads threads, batch 64; median of 3 alternating runs) =="
  for model in resnet18_cifar vgg11_cifar; do
    ours=() torch=()
    for rep in 1 2 3; do
      ours+=("$(build/bench_step_time "$(step_config $model 64)" --steps 5 --warmup 2 | sed -n 's/^json //p')")
      torch+=("$(/usr/bin/python3 scripts/bench_pytorch_step.py $model 64 --threads "$threads" --steps 5 --warmup 2)")
    done
    /usr/bin/python3 - "$model" "${ours[@]}" "${torch[@]}" <<'PY'
import json, statistics, sys
model, runs = sys.argv[1], sys.argv[2:]
ours = [json.loads(r)[0]["mean_s"] for r in runs[:3]]
torch = [json.loads(r)["mean_s"] for r in runs[3:]]
o, t = statistics.median(ours), statistics.median(torch)
print(f"{model:16s} ferry {o:.3f}s  pytorch {t:.3f}s  ratio ferry/pytorch {o / t:.3f}  (goal <= 1.0)"
      f"   runs: ferry {', '.join(f'{x:.3f}' for x in ours)}; pytorch {', '.join(f'{x:.3f}' for x in torch)}")
PY
  done
fi

if [[ $what == all || $what == plan ]]; then
  echo "== 2. memory plans =="
  build/bench_plan_table
fi

if [[ $what == all || $what == precision ]]; then
  echo "== mixed precision (issue 28): plans and simulated steps, fp32 against bf16 =="
  build/bench_precision_plan
  scripts/bench_precision_simulate.py --trainer build/trainer
fi

if [[ $what == all || $what == zero ]]; then
  echo "== model state per rank (issue 30): largest model that fits, simulated tokens/s (load $(cut -d' ' -f1-3 /proc/loadavg)) =="
  /usr/bin/python3 scripts/bench_model_state.py --trainer build/trainer
fi

if [[ $what == all || $what == offload ]]; then
  echo "== 3. offload overhead: resnet18_cifar batch 64, vdnn-all / none (goal <= 1.05) =="
  build/bench_step_time "$(step_config resnet18_cifar 64)" --policies none,vdnn-all --steps 5 \
    --warmup 2 --trace "$out/offload-trace"
  echo "traces: $out/offload-trace/trace_{none,vdnn-all}.json"
fi

if [[ $what == all || $what == comm ]]; then
  echo "== 4a. MPI all-reduce bus bandwidth (2 ranks) =="
  mpirun -np 2 --oversubscribe --bind-to none build/comm_allreduce_bench --max-mib 64
  echo "== 4b. resnet18_cifar on 2 ranks: comm.overlap on / off =="
  cfg=$(step_config resnet18_cifar 32)
  for overlap in true false; do
    rm -rf "$out/overlap_$overlap"
    mpirun -np 2 --oversubscribe --bind-to none build/trainer train "$cfg" run.steps=6 \
      run.log_every=6 run.dir="$out/overlap_$overlap" comm.overlap=$overlap comm.bucket_mb=4 \
      run.trace=true run.trace_steps=[4,6] > "$out/overlap_$overlap.log" 2>&1
  done
  /usr/bin/python3 scripts/trace_overlap.py "$out/overlap_true/trace_rank0.json" \
    "$out/overlap_false/trace_rank0.json"
fi

if [[ $what == all || $what == imagefolder ]]; then
  echo "== 5. imagefolder loader vs torchvision DataLoader + PIL (goal >= 1.5) =="
  /usr/bin/python3 bench/imagefolder_vs_torchvision.py --tool build/bench_imagefolder_loader \
    --dir "$out/imagefolder" --workers 2 --reps 3
fi

if [[ $what == all || $what == topology ]]; then
  # CPU ranks stand in for GPUs 0-3 of the DGX-1-like server (two under each PCIe switch);
  # emulation_scale stretches link time so that offload traffic weighs on the step as it would
  # on the GPUs (see docs/topology.md).
  scale="${FERRY_BENCH_EMULATION_SCALE:-400}"
  echo "== 6. emulated DGX-1-like, 4 ranks, vgg11_cifar batch 16 vdnn-all, emulation_scale $scale: topology / fifo step time (median of steps 3-6, 2 alternating runs; step 2 traced for the simulator) =="
  emulated_runs topo "$(step_config vgg11_cifar 16)" "$scale" memory.policy=vdnn-all \
    run.trace=true 'run.trace_steps=[2,2]'
  /usr/bin/python3 - "$out" <<'PY'
import json, statistics, subprocess, sys
out = sys.argv[1]
def simulated_s(sched):
    # The simulator on each run's own traced step times and the emulated links (print only).
    runs = []
    for rep in (1, 2):
        d = f"{out}/topo_{sched}_{rep}"
        r = subprocess.run(["build/trainer", "simulate", f"{d}/config.yaml", "--emulated", d,
                            "--json"], capture_output=True, text=True)
        if r.returncode == 0:
            runs.append(json.loads(r.stdout)["step_s"])
    return statistics.median(runs) if runs else float("nan")
def step_s(sched):
    times = []
    for rep in (1, 2):
        rows = [json.loads(l) for l in open(f"{out}/topo_{sched}_{rep}/metrics.jsonl")]
        # samples_per_s is global samples over the interval (one step per line)
        times += [16 * 4 / r["samples_per_s"] for r in rows if r["step"] >= 3]
    return statistics.median(times), times
f, fr = step_s("fifo")
t, tr = step_s("topology")
print(f"fifo {f:.3f}s  topology {t:.3f}s  ratio topology/fifo {t / f:.3f}"
      f"   steps: fifo {', '.join(f'{x:.3f}' for x in fr)}; topology {', '.join(f'{x:.3f}' for x in tr)}")
for sched, measured in (("fifo", f), ("topology", t)):
    p = simulated_s(sched)
    print(f"  {sched}: simulated {p:.3f}s beside measured {measured:.3f}s"
          f" ({100 * (p - measured) / measured:+.1f}%)")
for sched in ("fifo", "topology"):
    j = json.load(open(f"{out}/topo_{sched}_1/links.json"))
    worst = max((p / c, l["name"]) for l in j["links"] for p, c in zip(l["peak_gbps"], l["capacity_gbps"]) if c > 0)
    print(f"  {sched}: busiest link {worst[1]} at {100 * worst[0]:.0f}% of capacity (peak over {j['bin_s'] * 1000:.0f} ms bins)")
PY
fi

if [[ $what == all || $what == aware ]]; then
  # Four CPU ranks stand in for GPUs 0-3 of the DGX-1-like server, two under each switch, with
  # links slowed 100x: resnet18_cifar at batch 32 needs 283 MiB all resident, the budget is
  # 200 MiB. Oblivious auto (fifo) plans as if each GPU had its switch uplink to itself;
  # contention-aware auto (topology) plans against half of it and rebuilds what that cannot hide.
  scale="${FERRY_BENCH_EMULATION_SCALE:-100}"
  echo "== 7. emulated DGX-1-like, 4 ranks, resnet18_cifar batch 32, memory.budget 200MiB, auto with recompute, emulation_scale $scale: topology + aware / fifo + oblivious (median of steps 3-6, 2 alternating runs) =="
  emulated_runs aware "$(step_config resnet18_cifar 32)" "$scale" memory.policy=auto \
    memory.budget=200MiB memory.recompute=true
  /usr/bin/python3 - "$out" <<'PY'
import json, re, statistics, sys
out = sys.argv[1]
def step_s(sched):
    times = []
    for rep in (1, 2):
        rows = [json.loads(l) for l in open(f"{out}/aware_{sched}_{rep}/metrics.jsonl")]
        times += [32 * 4 / r["samples_per_s"] for r in rows if r["step"] >= 3]
    return statistics.median(times), times
def plan_line(sched):
    # The plan the trainer printed at start (rank 0's log line with the policy's totals).
    for line in open(f"{out}/aware_{sched}_1.log"):
        if re.search(r"\bplan\b.*offload", line):
            return line.strip()
    return "?"
f, fr = step_s("fifo")
t, tr = step_s("topology")
print(f"fifo + oblivious auto {f:.3f}s  topology + aware auto {t:.3f}s  ratio {f / t:.2f}x faster"
      f"   steps: fifo {', '.join(f'{x:.3f}' for x in fr)}; topology {', '.join(f'{x:.3f}' for x in tr)}")
for sched in ("fifo", "topology"):
    print(f"  {sched}: {plan_line(sched)}")
PY
fi

if [[ $what == all || $what == shapes ]]; then
  # (a) bench_shape_arms runs the three arms in one process, interleaved step by step (none,
  # per-shape, static, none, ...), each on the same batches (run.seed 0), each step timed alone:
  # load that changes slower than a step falls on every arm alike. The CPU's copies stand in for
  # a GPU's link at device.copy_gbps 0.2 (about a GPU's compute-to-PCIe ratio on 2 cores); plans
  # use the measured cost model in every arm (memory.measure, the default: the first shape's
  # kernels timed, other shapes' FLOP estimates scaled to them). The budget: side 24's peak plus
  # 3/8 of what side 48 adds.
  # Then one training run of the per-shape arm: planning time per new shape on this CPU.
  sides="[24, 28, 32, 36, 40, 44, 48]"
  common=(model.name=resnet18_cifar data.batch_size=16 "data.scales=$sides" memory.measure=true
          device.memory=2GiB device.copy_gbps=0.2)
  budget=$(build/trainer plan configs/quickstart.yaml "${common[@]}" memory.policy=none --json |
    /usr/bin/python3 -c "
import json, sys; p = {s['side']: s['peak_bytes'] for s in json.load(sys.stdin)['shapes']}
print(p[24] + 3 * (p[48] - p[24]) // 8)")
  echo "== 8a. multi-scale resnet18_cifar batch 16, data.scales $sides, memory.budget $budget, device.copy_gbps 0.2: none unlimited / per-shape plans / one static plan, interleaved step by step, 40 steps each after 3 =="
  build/bench_shape_arms configs/quickstart.yaml "${common[@]}" run.dir="$out/shape_arms" \
    --budget "$budget" --steps 40 --warmup 3 | grep -v '^json'
  rm -rf "$out/shapes_per_shape"
  build/trainer train configs/quickstart.yaml run.dir="$out/shapes_per_shape" run.steps=20 \
    run.log_every=1 checkpoint.every=0 "${common[@]}" memory.policy=auto memory.budget="$budget" \
    > "$out/shapes_per_shape.log" 2>&1
  /usr/bin/python3 - "$out" <<'PY'
import json, sys
s = json.load(open(f"{sys.argv[1]}/shapes_per_shape/summary.json"))
print(f"  per-shape training run, 20 steps: {s['plan_waited_steps']} step(s) waited for a plan; per shape "
      "(planned in, measured step):")
for x in s["shapes"]:
    m = x["measured_step_s"]
    print(f"    {x['shape']}: planned in {x['plan_seconds']:.3f}s, step {'-' if m is None else f'{m:.3f}'}s "
          f"measured ({x['steps']} steps), moved {x['offload_bytes'] / 2**20:.1f} MiB, rebuilt "
          f"{x['recompute_flops'] / 1e9:.2f} GFLOP, peak {x['planned_peak_bytes'] / 2**20:.1f} MiB "
          f"(measured {x['measured_peak_bytes'] / 2**20:.1f})")
PY
  # (b) The same three arms simulated on one H100 (h100-pcie5) of the SNC4 node.
  sim=(--hardware h100-pcie5 --topology configs/topologies/h100-snc4.yaml --gpus 1 --json
       device.memory=80GiB)
  lengths=$(/usr/bin/python3 scripts/document_length_schedule.py --batch 16 --bucket 64 --cap 1024 \
    --group-by-length '/usr/share/doc/*/copyright')
  echo "== 8b. simulated on h100-pcie5, memory.budget 24 GiB (and 12 GiB): ResNet-50 batch 256 data.scales [160, 192, 224, 256, 288]; gpt2 batch 16 at --shapes $lengths =="
  for budget in 24GiB 12GiB; do
    for model in resnet50 gpt2; do
      for arm in per_shape static none; do
        case $arm in
          none) args=(memory.policy=none memory.budget=0) ;;
          per_shape) args=(memory.budget=$budget) ;;
          static) args=(memory.budget=$budget memory.per_shape=false) ;;
        esac
        f="$out/shapes_sim_${model}_${budget}_$arm.json"
        if [[ $model == resnet50 ]]; then
          build/trainer simulate configs/simulate/resnet50-dgx1.yaml "${sim[@]}" "${args[@]}" \
            "data.scales=[160, 192, 224, 256, 288]" > "$f"
        else
          build/trainer simulate configs/simulate/gpt2-medium-dgx1.yaml "${sim[@]}" "${args[@]}" \
            model.name=gpt2 data.batch_size=16 --shapes "$lengths" > "$f"
        fi
      done
    done
  done
  /usr/bin/python3 - "$out" <<'PY'
import json, sys
out = sys.argv[1]
for budget in ("24GiB", "12GiB"):
    for model in ("resnet50", "gpt2"):
        j = {a: json.load(open(f"{out}/shapes_sim_{model}_{budget}_{a}.json"))
             for a in ("none", "per_shape", "static")}
        none = j["none"]["step_s"]
        print(f"  {model} under {budget}: mean step none {none:.4f}s, per-shape {j['per_shape']['step_s']:.4f}s "
              f"({100 * (j['per_shape']['step_s'] / none - 1):+.1f}%), static {j['static']['step_s']:.4f}s "
              f"({100 * (j['static']['step_s'] / none - 1):+.1f}%)")
        for a in ("per_shape", "static"):
            print(f"    {a}: " + ", ".join(
                f"{s['size']} {s['step_s']:.4f}s ({s['recompute_flops'] / 1e9:.0f} GF, {s['offload_bytes'] / 2**30:.2f} GiB)"
                for s in j[a]["shapes"]))
PY
  echo "== 8c. planning time per new shape against its predicted H100 step (medians of 3) =="
  build/bench_shape_planning --reps 3
fi

if [[ $what == all || $what == hosts ]]; then
  echo "== 9. quickstart, 4 ranks (batch 32 each): 2 namespace hosts x 2 ranks vs 1 host x 4; median of 3 alternating runs, 200 steps =="
  if [[ $(id -u) -ne 0 ]]; then
    echo "skipped: the namespace hosts need root"
  else
    hosts_args=(train configs/quickstart.yaml run.steps=200 data.batch_size=32 checkpoint.every=0
                memory.measure=false topology.bind=false)
    for rep in 1 2 3; do
      rm -rf "$out/hosts_one_$rep" "$out/hosts_two_$rep"
      mpirun -np 4 --oversubscribe --bind-to none build/trainer "${hosts_args[@]}" \
        run.dir="$out/hosts_one_$rep" > "$out/hosts_one_$rep.log" 2>&1
      scripts/multihost.sh --hosts 2 --ranks-per-host 2 -- "${hosts_args[@]}" \
        run.dir="$out/hosts_two_$rep" > "$out/hosts_two_$rep.log" 2>&1
    done
    /usr/bin/python3 - "$out" "$(cut -d' ' -f1-3 /proc/loadavg)" <<'PY'
import json, statistics, sys
out, load = sys.argv[1], sys.argv[2]
def step(arm):
    return statistics.median(json.load(open(f"{out}/hosts_{arm}_{rep}/summary.json"))["measured_step_s"]
                             for rep in (1, 2, 3))
one, two = step("one"), step("two")
print(f"step: 1 host {1e3 * one:.1f} ms, 2 hosts {1e3 * two:.1f} ms ({two / one:.2f}x); "
      f"load average {load}")
PY
  fi
fi

if [[ $what == all || $what == share ]]; then
  echo "== 10. TENSILE's grid: memory saved / extra step time, one job at batch 16, 2 and 3 concurrent jobs at batch 2 (FLOP cost model, 8 steps, fastest logging interval after the first, median of 4 alternating runs; load average $(cut -d' ' -f1-3 /proc/loadavg)) =="
  /usr/bin/python3 scripts/bench_share.py --trainer build/trainer --reps 4
fi

if [[ $what == all || $what == documents ]]; then
  # Real text: every paragraph of the licence texts on this machine is a document (one token per
  # byte, the separator 256 before each), so the lengths are real ones; rows of at most 1024,
  # padded per batch to a multiple of 128. A 4-layer, width-128 GPT (configs/gpt_text.yaml),
  # batch 4, one thread (two threads' OpenMP barriers stall on a shared 2-core machine), the FLOP
  # cost model. Every arm draws the same batches (run.seed 0); steps 6-40 are timed, each alone
  # (run.log_every 1). Arms interleaved over 3 rounds; medians.
  docs="$out/doc_paragraphs"
  if [[ ! -f $docs/train.bin ]]; then
    /usr/bin/python3 scripts/prepare_tokens.py --tokenizer bytes --split paragraph --out "$docs" \
      '/usr/share/common-licenses/*' '/usr/share/doc/*/copyright' > "$out/doc_paragraphs.log"
  fi
  echo "== 11. documents of changing length: gpt_text (4 x 128) on paragraphs of licence texts, batch 4, rows <= 1024 padded to a multiple of 128; load: $(uptime | sed 's/.*load average: //') =="
  docs_args=(run.steps=40 run.log_every=1 checkpoint.every=0 "data.path=$docs/train.bin"
    "data.val_path=$docs/val.bin" data.documents=true data.len_bucket=128 model.context=1024
    data.batch_size=4 optim.warmup_steps=0 optim.schedule=constant memory.measure=false
    device.memory=4GiB device.threads=1)
  docs_run() {  # name key=value...
    local name=$1
    shift
    rm -rf "$out/docs_$name"
    build/trainer train configs/gpt_text.yaml run.dir="$out/docs_$name" "${docs_args[@]}" "$@" \
      > "$out/docs_$name.log" 2>&1
  }
  # The budget: a third of the way from the shortest length's peak to the longest's, with
  # everything resident, and at least the longest length's lower bound.
  build/trainer plan configs/gpt_text.yaml "${docs_args[@]}" memory.policy=none --json \
    > "$out/docs_plan.json"
  budget=$(/usr/bin/python3 -c "
import json; s = json.load(open('$out/docs_plan.json'))['shapes']
p = {x['length']: x['peak_bytes'] for x in s}; lb = max(x['lower_bound_bytes'] for x in s)
lo, hi = p[min(p)], p[max(p)]; print(max(lo + (hi - lo) // 3, lb * 21 // 20))")
  # The *_rebuild arms tell the planner copies are slow (memory.link_gbps 0.001): it rebuilds
  # instead of moving, which costs compute on the CPU too (a copy thread on an idle core is
  # nearly free there).
  arms=(none per_shape per_shape_rebuild padded pack_none pack)
  # (Not `| grep -q`: under pipefail the trainer's SIGPIPE would read as "not built".)
  if [[ $(build/trainer config --reference) == *memory.per_shape* ]]; then
    arms+=(static static_rebuild)
  fi
  for rep in 1 2 3; do
    for arm in "${arms[@]}"; do
      case $arm in
        none) docs_run "${arm}_$rep" memory.policy=none ;;
        per_shape) docs_run "${arm}_$rep" memory.policy=auto memory.budget="$budget" ;;
        per_shape_rebuild) docs_run "${arm}_$rep" memory.policy=auto memory.budget="$budget" \
                             memory.link_gbps=0.001 ;;
        static) docs_run "${arm}_$rep" memory.policy=auto memory.budget="$budget" \
                  memory.per_shape=false ;;
        static_rebuild) docs_run "${arm}_$rep" memory.policy=auto memory.budget="$budget" \
                          memory.per_shape=false memory.link_gbps=0.001 ;;
        padded) docs_run "${arm}_$rep" memory.policy=auto memory.budget="$budget" \
                  data.len_bucket=1024 ;;
        pack_none) docs_run "${arm}_$rep" memory.policy=none data.pack=true ;;
        pack) docs_run "${arm}_$rep" memory.policy=auto memory.budget="$budget" data.pack=true ;;
      esac
    done
  done
  /usr/bin/python3 - "$out" "$budget" "${arms[@]}" <<'PY'
import json, statistics, sys
out, budget, arms = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
def run(name):
    rows = [json.loads(l) for l in open(f"{out}/docs_{name}/metrics.jsonl")]
    timed = [r for r in rows if r["step"] > 5]
    seconds = [4 / r["samples_per_s"] for r in timed]
    tokens = sum(r["tokens_per_s"] * s for r, s in zip(timed, seconds))
    return statistics.mean(seconds), tokens / sum(seconds)
res = {a: [run(f"{a}_{rep}") for rep in (1, 2, 3)] for a in arms}
step = {a: statistics.median(x[0] for x in res[a]) for a in arms}
tps = {a: statistics.median(x[1] for x in res[a]) for a in arms}
none = step["none"]
print(f"budget {budget / 2**20:.1f} MiB; mean step (median of 3 runs of steps 6-40):")
names = {"none": "none, unlimited memory", "per_shape": "a plan per length",
         "static": "one static plan (memory.per_shape false)",
         "per_shape_rebuild": "a plan per length, rebuilding",
         "static_rebuild": "one static plan, rebuilding",
         "padded": "every batch padded to 1024", "pack_none": "packed rows, none unlimited",
         "pack": "packed rows, under the budget"}
for a in arms:
    runs = ", ".join(f"{x[0]:.4f}" for x in res[a])
    print(f"  {names[a]:44s} {step[a]:.4f}s ({100 * (step[a] / none - 1):+6.1f}% vs none)  "
          f"{tps[a]:8.0f} real tokens/s   runs: {runs}")
print(f"  packed / padded real tokens/s: {tps['pack_none'] / tps['none']:.2f} (none, unlimited), "
      f"{tps['pack'] / tps['per_shape']:.2f} (under the budget, against per-length plans)")
for arm in ("per_shape", "per_shape_rebuild"):
  print(f"  {names[arm]}:")
  s = json.load(open(f"{out}/docs_{arm}_1/summary.json"))
  for x in sorted(s["shapes"], key=lambda x: x["shape"][1]):
    print(f"    {x['shape']}: {x['steps']} steps, peak {x['planned_peak_bytes'] / 2**20:.1f} MiB "
          f"(measured {x['measured_peak_bytes'] / 2**20:.1f}), moved {x['offload_bytes'] / 2**20:.1f} MiB, "
          f"rebuilt {x['recompute_flops'] / 1e9:.3f} GFLOP, planned in {x['plan_seconds']:.3f}s")
PY
  echo "load after: $(uptime | sed 's/.*load average: //')"
fi

if [[ $what == all || $what == mix ]]; then
  echo "== 12a. job mix on one emulated device, CPU backend: resnet18_cifar, a small GPT, vgg11_cifar, alexnet_cifar arriving 10 s apart; memory.share / static equal split / one after another (median of 2 alternating runs; load average $(cut -d' ' -f1-3 /proc/loadavg)) =="
  /usr/bin/python3 scripts/bench_mix.py --trainer build/trainer
  echo "== 12b. the same mix simulated on one H100 (h100-pcie5) at ImageNet sizes, configs/simulate/mix-h100.yaml at 80, 64, 56 and 48 GiB =="
  /usr/bin/python3 scripts/bench_mix_sim.py --trainer build/trainer
fi
