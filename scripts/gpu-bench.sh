#!/usr/bin/env bash
# The GPU benchmark: ferry against PyTorch measured in the same run on the same GPU, ImageNet
# shapes, batch 256, fp32 with TF32 convolutions (both sides' defaults). Prints, never asserts.
#   ResNet-50, VGG-16 `none`:           ferry step / PyTorch step (all on the GPU)
#   VGG-16 auto+recompute, 12 GiB:      ferry step / PyTorch all-on-GPU step
#   VGG-16 vdnn-all:                    ferry step / its link bound (bytes out / measured D2H +
#                                       bytes back / measured H2D, both rates from this run)
#   every row:                          ferry's predicted / measured step time
# Run on a GPU machine from the tree's root, through the bundle (scripts/gpu-bundle.sh):
#   .gpubundle/run scripts/gpu-bench.sh [--rows]
# --rows prints tab-separated rows (name, result, figure) for scripts/gpu-check.sh; without it,
# an aligned table. FERRY_BENCH_STEPS (default 8) sets the ferry steps per row;
# FERRY_BENCH_EXTRA adds key=value overrides to every ferry run, last (to try the script on the
# CPU backend with small shapes, say).
set -uo pipefail
cd "$(git rev-parse --show-toplevel 2>/dev/null || dirname "$(dirname "$0")")"
rows_only=false
[[ ${1:-} == --rows ]] && rows_only=true
out=${FERRY_BENCH_DIR:-/tmp/ferry-gpu-bench}
mkdir -p "$out"
steps=${FERRY_BENCH_STEPS:-8}
trainer=build/trainer
rows=$out/rows.tsv
: > "$rows"

row() { printf '%s\t%s\t%s\n' "$1" "$2" "$3" >> "$rows"; }

# PyTorch runs outside the bundle's library path (its own wheels bring cuDNN and cuBLAS), on
# the first Python that has torch and torchvision.
py=python3
for candidate in python3 /usr/bin/python3 /usr/local/bin/python3; do
  if env -u LD_LIBRARY_PATH "$candidate" -c 'import torch, torchvision' > /dev/null 2>&1; then
    py=$candidate
    break
  fi
done
pytorch() {  # model -> step seconds, or "" (the reason goes to $out/pytorch_<model>.json)
  env -u LD_LIBRARY_PATH timeout 300 "$py" scripts/bench_pytorch_gpu.py "$1" 256 \
    > "$out/pytorch_$1.json" 2> "$out/pytorch_$1.log"
  python3 -c 'import json,sys; j=json.load(open(sys.argv[1])); print(j.get("step_s",""))' \
    "$out/pytorch_$1.json" 2>/dev/null
}

# One ferry training run; its summary.json is kept as $out/<name>.json. The cost profile cache
# is shared by every row (one run.dir), so a kernel is timed once per benchmark.
ferry() {  # name, overrides...
  local name=$1
  shift
  # shellcheck disable=SC2086
  timeout 400 "$trainer" train configs/gpu_bench.yaml run.dir="$out/run" run.steps="$steps" "$@" \
    ${FERRY_BENCH_EXTRA:-} > "$out/$name.log" 2>&1
  local rc=$?
  if [[ $rc -eq 0 && -f $out/run/summary.json ]]; then
    mv "$out/run/summary.json" "$out/$name.json"
  fi
  return $rc
}

field() { python3 -c 'import json,sys; j=json.load(open(sys.argv[1]))
v=j
for k in sys.argv[2].split("."): v=v[k]
print(v)' "$out/$1.json" "$2" 2>/dev/null; }

ratio() { python3 -c 'import sys; a,b=float(sys.argv[1]),float(sys.argv[2]); print(f"{a/b:.2f}")' "$1" "$2"; }

# name, ferry overrides...; compared with PyTorch's all-on-GPU step of the model.
versus_pytorch() {
  local name=$1 model=$2 torch_s=$3
  shift 3
  if ! ferry "$name" model.name="$model" "$@"; then
    row "bench $name" FAIL "ferry exited non-zero: $(tail -n 1 "$out/$name.log")"
    return
  fi
  local s p
  s=$(field "$name" measured_step_s)
  p=$(field "$name" predicted_step_s)
  local vs="PyTorch failed (see $out/pytorch_$model.log)"
  [[ -n $torch_s ]] && vs=$(printf 'PyTorch %.3fs, ratio %s' "$torch_s" "$(ratio "$s" "$torch_s")")
  row "bench $name" INFO "$(printf 'ferry %.3fs / %s; predicted/measured %s' "$s" "$vs" \
    "$(ratio "$p" "$s")")"
}

torch_resnet=$(pytorch resnet50)
torch_vgg=$(pytorch vgg16)
versus_pytorch "resnet50 b256 none" resnet50 "$torch_resnet" memory.policy=none
versus_pytorch "vgg16 b256 none" vgg16 "$torch_vgg" memory.policy=none
versus_pytorch "vgg16 b256 auto+recompute 12GiB" vgg16 "$torch_vgg" memory.policy=auto \
  memory.recompute=true memory.budget=12GiB

name="vgg16 b256 vdnn-all"
if ferry "$name" model.name=vgg16 memory.policy=vdnn-all; then
  s=$(field "$name" measured_step_s)
  p=$(field "$name" predicted_step_s)
  bound=$(python3 -c 'import json,sys; j=json.load(open(sys.argv[1])); c=j["cost_profile"]
b=j["offload_bytes"]; print(b/(c["d2h_gbps"]*1e9)+b/(c["h2d_gbps"]*1e9) if c["d2h_gbps"]>0 and c["h2d_gbps"]>0 else "")' \
    "$out/$name.json" 2>/dev/null)
  gib=$(python3 -c 'import json,sys; print("%.1f" % (json.load(open(sys.argv[1]))["offload_bytes"] / 2**30))' \
    "$out/$name.json")
  if [[ -n $bound ]]; then
    fig=$(printf 'ferry %.3fs / link bound %.3fs (%s GiB each way), ratio %s' "$s" "$bound" "$gib" \
      "$(ratio "$s" "$bound")")
  else
    fig=$(printf 'ferry %.3fs; no measured link rate' "$s")
  fi
  row "bench $name" INFO "$fig; predicted/measured $(ratio "$p" "$s")"
else
  row "bench $name" FAIL "ferry exited non-zero: $(tail -n 1 "$out/$name.log")"
fi

if $rows_only; then
  cat "$rows"
else
  column -t -s $'\t' "$rows"
fi
