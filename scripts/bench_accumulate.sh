#!/usr/bin/env bash
# Gradient accumulation's step time on the CPU backend (issue 30; printed, never asserted; see
# docs/benchmarks.md): one update of optim.accumulate 4 x data.batch_size 8 against one step of
# batch 32, LeNet-5 (configs/quickstart.yaml) and a tiny GPT (configs/gpt_text.yaml at 2 layers,
# width 64, context 32), one rank. Each run's step is the median over its logging intervals
# (after the first) of 32 samples / the interval's samples_per_s from metrics.jsonl: on a shared
# machine the median resists the intervals another process took the cores in, which the mean
# (summary.json's measured_step_s) does not. The arms alternate, REPS times each, and the load
# average is printed beside each run.
# Usage: scripts/bench_accumulate.sh [REPS] [STEPS] [THREADS]   (defaults 3, 40, 1)
set -euo pipefail
cd "$(dirname "$0")/.."
reps="${1:-3}"
steps="${2:-40}"
threads="${3:-1}"
trainer=build/trainer
out=build/bench-runs/accumulate
mkdir -p "$out"
tokens="$out/tokens.bin"
[ -f "$tokens" ] || /usr/bin/python3 scripts/random_tokens.py "$tokens"

common="run.steps=$steps run.log_every=5 memory.measure=false checkpoint.every=0 \
device.threads=$threads optim.schedule=constant optim.warmup_steps=0"
lenet="configs/quickstart.yaml data.samples=8192"
gpt="configs/gpt_text.yaml data.path=$tokens data.val_path= model.context=32 model.layers=2 \
model.width=64 model.heads=2"

# arm NAME MODEL_ARGS BATCH ACCUMULATE REP -> "name rep step_s load"
arm() {
  local dir="$out/$1_$5"
  rm -rf "$dir"
  # shellcheck disable=SC2086
  "$trainer" train $2 $common run.dir="$dir" data.batch_size="$3" optim.accumulate="$4" \
    > "$dir.log" 2>&1
  local step
  step=$(/usr/bin/python3 - "$dir/metrics.jsonl" <<'PY'
import json, statistics, sys
rates = [json.loads(line)["samples_per_s"] for line in open(sys.argv[1])][1:]
print(statistics.median(32.0 / r for r in rates))
PY
)
  printf '%-14s rep %d  step %.4f s  load %s\n' "$1" "$5" "$step" "$(cut -d' ' -f1-3 /proc/loadavg)"
  echo "$1 $step" >> "$out/steps.txt"
}

rm -f "$out/steps.txt"
for rep in $(seq 1 "$reps"); do
  arm lenet_1x32 "$lenet" 32 1 "$rep"
  arm lenet_4x8 "$lenet" 8 4 "$rep"
  arm gpt_1x32 "$gpt" 32 1 "$rep"
  arm gpt_4x8 "$gpt" 8 4 "$rep"
done
/usr/bin/python3 - "$out/steps.txt" <<'PY'
import collections, statistics, sys
steps = collections.defaultdict(list)
for line in open(sys.argv[1]):
    name, s = line.split()
    steps[name].append(float(s))
med = {k: statistics.median(v) for k, v in steps.items()}
for model in ("lenet", "gpt"):
    one, acc = med[model + "_1x32"], med[model + "_4x8"]
    print(f"{model:6s} median step: 1 x 32 {one:.4f} s, 4 x 8 {acc:.4f} s, ratio {acc / one:.2f}")
PY
