#!/usr/bin/env bash
# memory.zero, memory.optimizer and optim.accumulate on the CPU backend under mpirun (issue 30;
# printed, never asserted; see docs/benchmarks.md and docs/data_parallel.md): the step time of
# zero 1 and 2 against 0 at 2 and 4 ranks, the host optimizer against the device one, and
# accumulate 4 x 8 against 1 x 32 (zero 0 and zero 2), on a tiny GPT (configs/gpt_text.yaml at 2
# layers, width 64, context 32, AdamW, comm.bucket_mb 0.02 so zero 2 stages its gradients), batch
# 8 per rank, one thread per rank. A run's step is the median over its logging intervals (after
# the first) of the interval's elapsed_s difference per step, from rank 0's metrics.jsonl. The arms
# alternate, REPS times each, and the load average is printed beside each run.
# Usage: scripts/bench_zero.sh [REPS] [STEPS]   (defaults 2, 60)
set -euo pipefail
cd "$(dirname "$0")/.."
reps="${1:-2}"
steps="${2:-60}"
trainer=build/trainer
out=build/bench-runs/zero
mkdir -p "$out"
tokens="$out/tokens.bin"
[ -f "$tokens" ] || /usr/bin/python3 scripts/random_tokens.py "$tokens"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
gpt="configs/gpt_text.yaml data.path=$tokens data.val_path= model.context=32 model.layers=2 \
model.width=64 model.heads=2 run.steps=$steps run.log_every=5 memory.measure=false \
checkpoint.every=0 device.threads=1 comm.bucket_mb=0.02 optim.schedule=constant \
optim.warmup_steps=0"

# arm NAME RANKS REP EXTRA... -> "name rep step_s load"
arm() {
  local name=$1 ranks=$2 rep=$3
  shift 3
  local dir="$out/${name}_$rep"
  rm -rf "$dir"
  # shellcheck disable=SC2086
  mpirun -np "$ranks" --bind-to none "$trainer" train $gpt run.dir="$dir" "$@" > "$dir.log" 2>&1
  local step
  step=$(/usr/bin/python3 - "$dir/metrics.jsonl" <<'PY'
import json, statistics, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
steps = [(b["elapsed_s"] - a["elapsed_s"]) / (b["step"] - a["step"]) for a, b in zip(rows, rows[1:])]
print(statistics.median(steps[1:] or steps))
PY
)
  printf '%-22s rep %d  step %.4f s  load %s\n' "$name" "$rep" "$step" \
    "$(cut -d' ' -f1-3 /proc/loadavg)"
  echo "$name $step" >> "$out/steps.txt"
}

rm -f "$out/steps.txt"
for rep in $(seq 1 "$reps"); do
  for ranks in 2 4; do
    for zero in 0 1 2; do
      arm "np${ranks}_zero${zero}" "$ranks" "$rep" data.batch_size=8 memory.zero="$zero"
    done
  done
  arm np2_zero0_host 2 "$rep" data.batch_size=8 memory.optimizer=host
  arm np2_zero2_host 2 "$rep" data.batch_size=8 memory.zero=2 memory.optimizer=host
  for zero in 0 2; do
    arm "np2_zero${zero}_1x32" 2 "$rep" data.batch_size=32 memory.zero="$zero"
    arm "np2_zero${zero}_4x8" 2 "$rep" data.batch_size=8 optim.accumulate=4 memory.zero="$zero"
  done
done
/usr/bin/python3 - "$out/steps.txt" <<'PY'
import collections, statistics, sys
runs = collections.defaultdict(list)
for line in open(sys.argv[1]):
    name, step = line.split()
    runs[name].append(float(step))
med = {k: statistics.median(v) for k, v in runs.items()}
print("median step (s) over the reps:")
for k in runs:
    print(f"  {k:22s} {med[k]:.4f}")
def ratio(a, b):
    print(f"  {a} / {b}: {med[a] / med[b]:.2f}")
print("ratios:")
for n in (2, 4):
    for z in (1, 2):
        ratio(f"np{n}_zero{z}", f"np{n}_zero0")
ratio("np2_zero0_host", "np2_zero0")
ratio("np2_zero2_host", "np2_zero2")
ratio("np2_zero0_4x8", "np2_zero0_1x32")
ratio("np2_zero2_4x8", "np2_zero2_1x32")
PY
